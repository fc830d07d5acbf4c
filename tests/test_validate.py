"""Validator: every kind of bad input gets the right status and reason, never an exception."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from corpusforge.records import Status
from tasks.shared.validate import ValidationConfig, validate_image

CFG = ValidationConfig()


def reason_code(reason: str) -> str:
    """The stable code of a reason string (the part before ':', docs/outcomes.md)."""
    return reason.split(":", 1)[0]


def encode(size=(400, 300), fmt="JPEG", mode="RGB", **kw) -> bytes:
    rng = np.random.default_rng(size[0] * 7 + size[1])
    channels = {"RGB": 3, "CMYK": 4, "L": 1}[mode]
    arr = (rng.random((size[1], size[0], channels)) * 255).astype("uint8")
    img = Image.fromarray(arr.squeeze(), mode=None if mode != "CMYK" else None)
    if mode == "CMYK":
        img = Image.frombytes("CMYK", size, arr.tobytes())
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares ``width`` × ``height`` (a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("fmt,ext", [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")])
def test_valid_formats_are_kept(fmt, ext):
    v = validate_image(encode(fmt=fmt), CFG)
    assert (v.status, v.reason, v.format, v.ext, v.width, v.height) == (Status.KEPT, "", fmt, ext, 400, 300)


@pytest.mark.parametrize("data,status,code", [
    (b"", Status.ERROR, "empty_file"),
    (bytes(range(256)) * 4, Status.ERROR, "not_an_image"),
    (encode()[:3000], Status.ERROR, "decode_error"),
    (png_declaring(60_000, 60_000), Status.ERROR, "decompression_bomb"),
    (encode(fmt="GIF"), Status.ERROR, "unsupported_format"),
    (encode(size=(200, 150)), Status.FILTERED, "too_small"),
    (encode(size=(2400, 200)), Status.FILTERED, "extreme_aspect"),
])
def test_bad_inputs(data, status, code):
    v = validate_image(data, CFG)
    assert v.status == status and reason_code(v.reason) == code, v


def test_bomb_is_caught_from_the_header_before_decoding():
    small_limit = ValidationConfig(max_pixels=1000 * 1000)
    v = validate_image(png_declaring(1001, 1000), small_limit)
    assert reason_code(v.reason) == "decompression_bomb" and "1001x1000" in v.reason


def test_oversized_file():
    v = validate_image(encode(), ValidationConfig(max_bytes=100))
    assert v.status == Status.ERROR and reason_code(v.reason) == "oversized_file"


def test_exif_orientation_swaps_reported_size():
    img = Image.fromarray((np.random.default_rng(1).random((400, 640, 3)) * 255).astype("uint8"))
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif)
    v = validate_image(buf.getvalue(), CFG)
    assert v.status == Status.KEPT and (v.width, v.height) == (400, 640)


def test_cmyk_jpeg_is_valid():
    v = validate_image(encode(mode="CMYK"), CFG)
    assert v.status == Status.KEPT and v.format == "JPEG"


def test_png_with_wrong_extension_is_sniffed_from_bytes():
    v = validate_image(encode(fmt="PNG"), CFG)  # the validator never sees the name
    assert v.format == "PNG" and v.ext == "png"


def test_shortest_side_rule_and_score_thresholds():
    data = encode(size=(600, 200))
    assert validate_image(data, CFG).status == Status.KEPT
    v = validate_image(data, ValidationConfig(min_side_rule="shortest"))
    assert reason_code(v.reason) == "too_small"
    cfg = ValidationConfig(min_scores={"quality": 0.5})
    assert reason_code(validate_image(data, cfg, {"quality": 0.2}).reason) == "low_score"
    assert reason_code(validate_image(data, cfg, {}).reason) == "missing_score"
    assert validate_image(data, cfg, {"quality": 0.9}).status == Status.KEPT


def test_too_large_side():
    v = validate_image(encode(size=(1200, 400)), ValidationConfig(max_side=1000))
    assert reason_code(v.reason) == "too_large"
