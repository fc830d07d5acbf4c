"""Turn stored image bytes into one RGB picture every feature model can share.

The extraction stage decodes each image once and hands the result to every model's
``preprocess``, so this is the single place where untrusted bytes meet the decoder:

- only JPEG, PNG and WEBP are opened (the formats the staging shards may hold);
- the pixel count is checked from the header *before* any pixel is decoded, so a
  decompression bomb costs nothing;
- EXIF orientation is applied, and every mode (CMYK, L, P, RGBA, 16-bit, ...) becomes
  RGB; transparent pixels are composited over white, so a logo on a transparent
  background looks the same to every model;
- with ``draft_size`` the JPEG decoder shrinks by a power of two while decoding (DCT
  scaling), keeping both sides at least ``draft_size``. That is 2-4x faster for large
  photos; callers pass the largest model input times a margin so the final resize
  still sees more pixels than it outputs.

Failures raise :class:`DecodeError` with a readable reason; the caller records it
against the key and carries on.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP")
# The validator's default limit (tasks/shared/validate.py), so what passed validation decodes here.
DEFAULT_MAX_PIXELS = 100_000_000


class DecodeError(ValueError):
    """An image that cannot be turned into RGB pixels; the message says why."""


def decode_rgb(data: bytes, draft_size: int | None = None,
               max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode ``data`` into a loaded RGB image, upright per its EXIF orientation."""
    if not data:
        raise DecodeError("empty image data")
    try:
        # the declared size decides, never the process-wide warnings filter (see validate._sniff)
        image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
        width, height = image.size
        if width <= 0 or height <= 0:
            raise DecodeError(f"invalid image size {width}x{height}")
        if width * height > max_pixels:
            raise DecodeError(f"decompression bomb guard: {width}x{height} = {width * height} pixels "
                              f"> limit {max_pixels}")
        if draft_size is not None and image.format == "JPEG":
            image.draft("RGB", (draft_size, draft_size))
        image.load()
        image = ImageOps.exif_transpose(image)
        return _to_rgb(image)
    except DecodeError:
        raise
    except Image.UnidentifiedImageError as exc:
        # Pillow's message names the in-memory file object by its address: a reason that
        # differed from run to run would make every output that records it differ too
        raise DecodeError("not a JPEG, PNG or WEBP image (Pillow cannot identify it)") from exc
    except Image.DecompressionBombError as exc:
        raise DecodeError(f"decompression bomb guard: {exc}") from exc
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        raise DecodeError(f"corrupt or truncated image: {type(exc).__name__}: {exc}") from exc


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB with transparency composited over white and high bit depths scaled to 8 bits."""
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        array = np.asarray(image, dtype=np.float64)
        if mode.startswith("I;16"):  # 16-bit by declaration: a dark image stays dark
            top = 65535.0
        elif mode == "I":  # 32-bit container of unknown depth: 16-bit when values say so
            top = 65535.0 if array.max(initial=0) > 255 else 255.0
        else:
            top = max(float(array.max(initial=0)), 1.0)
        grey = np.clip(np.round(array * (255.0 / top)), 0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
