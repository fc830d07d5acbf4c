"""Image validation and filters (GPIC §2.2): what may enter the corpus, and why not.

Order matters and is cheapest-first: size of the byte string, format sniffing from the
header, decompression-bomb check from the *declared* size (before any pixel is
decoded), animation (an animated WEBP or PNG is ``unsupported_format``: the corpus holds
still images, and decoders disagree on which frame an animated file "is"), the full
decode check, then EXIF orientation and the resolution/aspect filters. Every outcome is a
:class:`Verdict` with a status and a reason code (the part before ``:``, stable, listed in
docs/outcomes.md); callers never see an exception for bad input.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image, UnidentifiedImageError
from pydantic import Field

from corpusforge.config import StrictModel
from corpusforge.records import Status

# Pillow format name -> extension the image is stored under in shards.
FORMAT_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}
# EXIF orientations that rotate by 90 degrees and so swap width and height.
_TRANSPOSING_ORIENTATIONS = {5, 6, 7, 8}


class ValidationConfig(StrictModel):
    """Thresholds of the image filters (GPIC §2.2 defaults)."""

    formats: list[Literal["JPEG", "PNG", "WEBP"]] = Field(
        ["JPEG", "PNG", "WEBP"], description="Accepted image formats (sniffed from the bytes, not the name).")
    max_bytes: int = Field(64 << 20, gt=0, description="Larger files are errors (oversized_file).")
    max_pixels: int = Field(100_000_000, gt=0,
                            description="Declared width×height above this is a decompression bomb; checked before decoding.")
    min_side: int = Field(256, ge=1, description="Images whose measured side is below this are filtered (too_small).")
    min_side_rule: Literal["longest", "shortest"] = Field(
        "longest", description="GPIC drops images whose *longest* side is < 256; 'shortest' measures the shorter side.")
    max_side: int = Field(16_384, ge=1, description="Images with a side above this are filtered (too_large).")
    max_aspect: float = Field(8.0, gt=1.0, description="Longer side more than this many times the shorter: extreme_aspect.")
    min_scores: dict[str, float] = Field(
        default_factory=dict,
        description="External quality/safety score columns in the metadata and their minimum (e.g. a VLM's verdict).")
    full_decode: bool = Field(True, description="Decode every image once to catch truncated or corrupt data.")


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str
    format: str | None = None
    ext: str | None = None
    width: int | None = None
    height: int | None = None


def _error(reason: str, **kw: Any) -> Verdict:
    return Verdict(Status.ERROR, reason, **kw)


def _sniff(data: bytes, formats: list[str]) -> tuple[Image.Image | None, Verdict | None]:
    """Open lazily (header only) with the accepted formats; classify what does not open.

    The warnings filter is never touched: it is process-wide, and a decoder thread changing
    it while another opens an image made the same image's reason differ from run to run.
    Pillow's own warning above its limit is only a warning here; :func:`validate_image`
    refuses by the declared size, and Pillow's hard limit (twice its warning) is a bomb."""
    try:
        return Image.open(io.BytesIO(data), formats=formats), None
    except Image.DecompressionBombError as exc:
        return None, _error(f"decompression_bomb: {exc}")
    except UnidentifiedImageError:
        pass
    except Exception as exc:  # noqa: BLE001 - any header parse failure is a per-record error
        return None, _error(f"decode_error: {type(exc).__name__}: {exc}")
    try:
        other = Image.open(io.BytesIO(data))
        return None, _error(f"unsupported_format: {other.format}")
    except Image.DecompressionBombError as exc:
        return None, _error(f"decompression_bomb: {exc}")
    except Exception:  # noqa: BLE001
        return None, _error("not_an_image: no known image header")


def oriented_size(img: Image.Image, width: int, height: int) -> tuple[int, int]:
    """Width and height as displayed, i.e. ``width`` x ``height`` (the header's size) after
    applying the EXIF orientation. Called after the decode check: for PNG, reading EXIF
    decodes the image, and a failure there must not hide a corrupt file from that check."""
    try:
        orientation = img.getexif().get(0x0112)
    except Exception:  # noqa: BLE001 - a broken EXIF block does not make the image invalid
        orientation = None
    if orientation in _TRANSPOSING_ORIENTATIONS:
        return height, width
    return width, height


def _decode_check(img: Image.Image) -> str | None:
    """Decode the pixels once; return an error reason or None. JPEGs decode at 1/8 scale:
    DCT scaling still entropy-decodes every block, so truncation is still caught."""
    try:
        if img.format == "JPEG":
            img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
        img.load()
    except Exception as exc:  # noqa: BLE001
        return f"decode_error: {type(exc).__name__}: {exc}"
    return None


def _score_verdict(scores: dict[str, Any], cfg: ValidationConfig) -> str | None:
    for column, minimum in sorted(cfg.min_scores.items()):
        value = scores.get(column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return f"missing_score: {column}"
        if float(value) < minimum:
            return f"low_score: {column}={float(value):g} < {minimum:g}"
    return None


def validate_image(data: bytes, cfg: ValidationConfig, scores: dict[str, Any] | None = None) -> Verdict:
    """Decide whether ``data`` may enter the corpus; never raises for bad input."""
    if not data:
        return _error("empty_file")
    if len(data) > cfg.max_bytes:
        return _error(f"oversized_file: {len(data)} bytes > {cfg.max_bytes}")
    img, failure = _sniff(data, list(cfg.formats))
    if failure is not None:
        return failure
    assert img is not None
    with img:
        fmt = img.format or ""
        raw_w, raw_h = img.size
        if raw_w * raw_h > cfg.max_pixels:
            return _error(f"decompression_bomb: declares {raw_w}x{raw_h} = {raw_w * raw_h} pixels "
                          f"> {cfg.max_pixels}", format=fmt, width=raw_w, height=raw_h)
        facts = {"format": fmt, "ext": FORMAT_EXT[fmt], "width": raw_w, "height": raw_h}
        if getattr(img, "is_animated", False):
            return _error(f"unsupported_format: animated {fmt} ({img.n_frames} frames)", **facts)
        if cfg.full_decode and (reason := _decode_check(img)):
            return _error(reason, **facts)
        width, height = oriented_size(img, raw_w, raw_h)
        facts.update(width=width, height=height)
    long_side, short_side = max(width, height), min(width, height)
    measured = long_side if cfg.min_side_rule == "longest" else short_side
    if measured < cfg.min_side:
        return Verdict(Status.FILTERED, f"too_small: {cfg.min_side_rule} side {measured} < {cfg.min_side}", **facts)
    if long_side > cfg.max_side:
        return Verdict(Status.FILTERED, f"too_large: side {long_side} > {cfg.max_side}", **facts)
    if short_side == 0 or long_side / short_side > cfg.max_aspect:
        return Verdict(Status.FILTERED, f"extreme_aspect: {width}x{height} exceeds {cfg.max_aspect:g}:1", **facts)
    if scores is not None and (reason := _score_verdict(scores, cfg)):
        return Verdict(Status.FILTERED, reason, **facts)
    return Verdict(Status.KEPT, "", **facts)
