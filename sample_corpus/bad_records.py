"""Broken and unusual inputs, with the status and reason the validator must give them.

Bad records are the inputs a crawl really produces: thumbnails, banners, cut-off
downloads, empty files, HTML saved as an image, decompression bombs, rows whose file
is gone and rows whose path points outside the collection. Valid special records are
inputs that look odd but must be kept: a PNG behind a ``.jpg`` name, a CMYK JPEG and a
JPEG whose EXIF orientation swaps width and height.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image, UnidentifiedImageError

from sample_corpus.encoding import Encoding, encode

# kind -> (expected status, expected reason code)
BAD_KINDS: dict[str, tuple[str, str]] = {
    "too_small": ("filtered", "too_small"),
    "extreme_aspect": ("filtered", "extreme_aspect"),
    "truncated_jpeg": ("error", "decode_error"),
    "empty_file": ("error", "empty_file"),
    "not_an_image": ("error", "not_an_image"),
    "decompression_bomb": ("error", "decompression_bomb"),
    "missing_file": ("error", "missing_file"),
    "unsafe_path": ("error", "unsafe_path"),
}
# kind -> expected format after decoding
SPECIAL_KINDS: dict[str, str] = {"png_as_jpg": "PNG", "cmyk_jpeg": "JPEG", "exif_rotated": "JPEG"}

# Paths that leave the collection folder; the first is the canonical case.
UNSAFE_PATHS = ("../outside.jpg", "images/../../outside.jpg", "/outside.jpg")
TRUNCATE_FRACTION = 0.4
EXIF_ROTATED_STORED = (640, 400)   # stored pixels; displayed as 400 x 640 after Orientation=6
BOMB_SIZES = ((60000, 60000), (100000, 40000), (40000, 90000))


def small_size(rng: np.random.Generator) -> tuple[int, int]:
    """A thumbnail: longer side below 256 px."""
    longest = int(rng.integers(120, 256))
    shortest = int(rng.integers(longest // 2, longest))
    return (longest, shortest) if rng.random() < 0.7 else (shortest, longest)


def extreme_aspect_size(rng: np.random.Generator) -> tuple[int, int]:
    """A banner or strip: longer side more than 8 times the shorter one."""
    longest = int(rng.integers(1800, 2401))
    shortest = int(longest / rng.uniform(9.0, 12.0))
    return (longest, shortest) if rng.random() < 0.7 else (shortest, longest)


def truncated(data: bytes) -> bytes:
    """The first ``TRUNCATE_FRACTION`` of a file, as left by an interrupted download."""
    return data[: int(len(data) * TRUNCATE_FRACTION)]


def not_an_image(rng: np.random.Generator) -> bytes:
    """Random bytes that no Pillow plugin recognises as an image."""
    size = int(rng.integers(2048, 8192))
    while True:
        data = rng.bytes(size)
        try:
            with Image.open(io.BytesIO(data)):
                pass  # some plugin took the bytes for an image: draw again
        except UnidentifiedImageError:
            return data
        except Image.DecompressionBombError:
            pass


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def bomb_png(width: int, height: int) -> bytes:
    """A valid-looking PNG of a few hundred bytes whose header declares ``width`` x ``height``.

    The IDAT holds one all-zero scanline, so the file stays tiny; a decoder that trusts the
    header would allocate ``width * height * 3`` bytes before noticing anything.
    """
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit RGB
    scanline = bytes(1 + 3 * width)                                   # filter byte + zeros
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(scanline, 9)) + _png_chunk(b"IEND", b""))


def cmyk_jpeg(image: Image.Image, quality: int) -> bytes:
    """The image as a CMYK JPEG (print workflows produce these)."""
    return encode(image.convert("RGB").convert("CMYK"), Encoding("JPEG", quality))


def exif_rotated_jpeg(displayed: Image.Image, quality: int) -> bytes:
    """A JPEG that stores ``displayed`` turned on its side, with EXIF Orientation=6.

    Orientation 6 tells viewers to rotate the stored pixels 90° clockwise, which gives
    ``displayed`` back; width and height are swapped between storage and display.
    """
    stored = displayed.transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(stored, Encoding("JPEG", quality), exif=exif.tobytes())
