"""Image encoding with fixed encoder settings, so equal pixels always give equal bytes."""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image

EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}

# Fixed per-format settings. Anything Pillow would otherwise pick by itself (optimisation
# passes, progressive scans, metadata) is pinned so the output depends only on the pixels.
PNG_COMPRESS_LEVEL = 3
WEBP_METHOD = 2


@dataclass(frozen=True)
class Encoding:
    """How one file is encoded: the container format and, for JPEG/WebP, the quality."""

    format: str
    quality: int = 90

    def __post_init__(self) -> None:
        if self.format not in EXTENSIONS:
            raise ValueError(f"unsupported format {self.format!r}")

    @property
    def ext(self) -> str:
        return EXTENSIONS[self.format]


def encode(image: Image.Image, encoding: Encoding, exif: bytes | None = None) -> bytes:
    """Encode ``image`` with the fixed settings for ``encoding.format``."""
    buf = io.BytesIO()
    if encoding.format == "JPEG":
        options: dict = {"quality": encoding.quality, "subsampling": "4:2:0",
                         "optimize": False, "progressive": False}
        if exif is not None:
            options["exif"] = exif
        image.save(buf, "JPEG", **options)
    elif encoding.format == "PNG":
        image.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    else:
        image.save(buf, "WEBP", quality=encoding.quality, method=WEBP_METHOD, lossless=False)
    return buf.getvalue()
