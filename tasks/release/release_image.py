"""Which image member a release sample gets, and the only re-encodings the release makes.

Loaders that infer one schema per shard set need every sample to carry the same member names
(Hugging Face's webdataset builder refuses a shard that mixes ``.jpg``, ``.png`` and ``.webp``), and
GPIC's layout allows only ``.jpg`` and ``.png``. The rule (``splits.image_format``: ``source``,
``auto``, ``png``, ``jpg``) is docs/release.md's ("Loaders"); the decision for every record is made
when the release is assigned, from the staged formats, and recorded in the manifest
(``release_ext``, ``image_encoding``) and the receipt.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import PIL
from PIL import Image, ImageOps

COPIED = "copied"
PNG_LOSSLESS = "png_lossless"
FORMAT_OF_EXT = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
GPIC_EXTS = ("jpg", "png")  # GPIC_FORMAT.md: {key}.jpg or {key}.png


def jpeg_encoding(quality: int) -> str:
    return f"jpeg_q{quality}"


def source_ext(ext: str, layout: str) -> str:
    """The member extension an image keeps under ``source``: its own, except a WebP in
    GPIC's layout (PNG, lossless)."""
    return "png" if layout == "gpic" and ext not in GPIC_EXTS else ext


def resolve_rule(exts: Iterable[str], layout: str, image_format: str) -> str:
    """The rule actually applied (``source``, ``png`` or ``jpg``) given every kept image's
    staged extension; ``auto`` becomes ``source`` when that leaves one extension, else ``png``."""
    if image_format != "auto":
        return image_format
    return "source" if len({source_ext(e, layout) for e in exts}) <= 1 else "png"


def member_for(ext: str, layout: str, rule: str, jpeg_quality: int) -> tuple[str, str]:
    """(release extension, encoding) of one image staged under ``ext``."""
    target = {"source": source_ext(ext, layout), "png": "png", "jpg": "jpg"}[rule]
    if target == ext:
        return ext, COPIED
    return target, PNG_LOSSLESS if target == "png" else jpeg_encoding(jpeg_quality)


def reencode(data: bytes, encoding: str) -> bytes:
    """Re-encode staged image bytes. The EXIF orientation is applied first, so the pixels
    match the recorded width and height (the orientation tag is not carried over).

    PNG keeps the mode when PNG can store it (1, L, LA, I, I;16, P, RGB, RGBA), else
    converts to RGBA/RGB (e.g. CMYK JPEG → RGB: the one case where PNG is not bit-exact to
    the decoded source). Output is deterministic for a given Pillow version, which is
    therefore part of a re-encoding shard's fingerprint."""
    if encoding == COPIED:
        return data
    with Image.open(io.BytesIO(data)) as im:
        im = ImageOps.exif_transpose(im)
        out = io.BytesIO()
        if encoding == PNG_LOSSLESS:
            if im.mode not in ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"):
                im = im.convert("RGBA" if "A" in im.getbands() else "RGB")
            im.save(out, format="PNG", optimize=False, compress_level=6)
        elif encoding.startswith("jpeg_q"):
            im.convert("RGB").save(out, format="JPEG", quality=int(encoding[len("jpeg_q"):]), optimize=False,
                                   subsampling=0 if int(encoding[len("jpeg_q"):]) >= 90 else 2)
        else:
            raise ValueError(f"unknown image encoding {encoding!r}")
        return out.getvalue()


def pillow_version() -> str:
    return PIL.__version__
