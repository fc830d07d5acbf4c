"""Corrupt and odd images (issue 14, scenarios 5 and 6), written as real files.

One folder source holds every kind at once — zero-length, flipped bytes, a PNG named
``.jpg``, CMYK, 16-bit grey and RGB, palette with transparency, EXIF rotation, animated
GIF/WebP/PNG — among ordinary images. Ingest must give each its exact status and reason
while the others proceed; the images that pass are then staged and embedded, and the
decoder's pixels are compared with independent references (numpy rotations, bit shifts,
hand-written compositing). A decompression bomb is rejected from its header inside a
subprocess whose address space is capped, so decoding it would fail the test.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from corpusforge.storage import Store
from corpusforge.tarshard import Sample
from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig
from tasks.shared.features.decode import decode_rgb
from tasks.shared.features.extract import extract_shard
from tests.staging_files import write_staging_shard
from tests.test_hostile_input import ingest_records

pytestmark = pytest.mark.timeout(180)


def encode(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def smooth(seed: int, w: int = 320, h: int = 240) -> np.ndarray:
    """A smooth RGB picture (JPEG round trips stay close to it)."""
    coarse = np.random.default_rng(seed).integers(0, 256, size=(4, 5, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC))


def flipped(data: bytes, start: int, count: int) -> bytes:
    out = bytearray(data)
    for i in range(start, start + count):
        out[i] ^= 0xFF
    return bytes(out)


RGB = smooth(1)
GREY16 = np.random.default_rng(2).integers(0, 65536, size=(240, 320), dtype=np.uint16)
DARK16 = np.random.default_rng(3).integers(0, 200, size=(240, 320), dtype=np.uint16)   # all <= 255 of 65535
RGB16 = np.random.default_rng(4).integers(0, 65536, size=(240, 320, 3), dtype=np.uint16)
PALETTE = np.random.default_rng(5).integers(0, 4, size=(240, 320), dtype=np.uint8)     # index 0 is transparent
COLOURS = [(0, 0, 0), (200, 10, 10), (10, 200, 10), (10, 10, 200)]


def palette_png() -> bytes:
    image = Image.fromarray(PALETTE, "P")
    image.putpalette([c for rgb in COLOURS for c in rgb])
    return encode(image, "PNG", transparency=0)


def exif_rotated(fmt: str) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    return encode(Image.fromarray(RGB), fmt, exif=exif)


def animated(fmt: str) -> bytes:
    frames = [Image.fromarray(smooth(10 + i, 300, 300)) for i in range(3)]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:])


def odd_images() -> dict[str, tuple[bytes, str, str]]:
    """file name -> (bytes, expected status, expected reason: exact, or the start of it where
    the rest is the decoder's own message)."""
    jpeg, png = encode(Image.fromarray(RGB), "JPEG", quality=90), encode(Image.fromarray(RGB), "PNG")
    return {
        "plain.jpg": (jpeg, "kept", ""),
        "zero.jpg": (b"", "error", "empty_file"),
        # bit flips in JPEG entropy data decode to damaged pixels, not an error: no decoder can
        # tell them from a picture, so the image is kept (PNG's CRC-checked data can)
        "flipped-scan.jpg": (flipped(jpeg, len(jpeg) // 2, 200), "kept", ""),
        "truncated.jpg": (jpeg[: len(jpeg) // 2], "error", "decode_error: OSError: "),
        "flipped-idat.png": (flipped(png, len(png) // 2, 1), "error", "decode_error: OSError: "),
        "flipped-magic.png": (flipped(png, 0, 4), "error", "not_an_image: no known image header"),
        "png-named.jpg": (png, "kept", ""),
        "cmyk.jpg": (encode(Image.fromarray(RGB).convert("CMYK"), "JPEG", quality=95), "kept", ""),
        "grey16.png": (encode(Image.fromarray(GREY16), "PNG"), "kept", ""),
        "dark16.png": (encode(Image.fromarray(DARK16), "PNG"), "kept", ""),
        "rgb16.png": (cv2.imencode(".png", RGB16[:, :, ::-1])[1].tobytes(), "kept", ""),
        "palette.png": (palette_png(), "kept", ""),
        "exif6.jpg": (exif_rotated("JPEG"), "kept", ""),
        "exif6.png": (exif_rotated("PNG"), "kept", ""),
        "anim.gif": (animated("GIF"), "error", "unsupported_format: GIF"),
        "anim.webp": (animated("WEBP"), "error", "unsupported_format: animated WEBP (3 frames)"),
        "anim.png": (animated("PNG"), "error", "unsupported_format: animated PNG (3 frames)"),
    }


@pytest.mark.scenario(5)
def test_odd_images_get_exact_verdicts_and_the_rest_is_embedded(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    cases = odd_images()
    for name, (data, _, _) in cases.items():
        (src / name).write_bytes(data)
    records = ingest_records(str(src), tmp_path / "out")
    got = {r["source_path"].rsplit("/", 1)[-1]: r for r in records}
    assert sorted(got) == sorted(cases)  # every file is one record, none lost
    for name, (_, status, reason) in cases.items():
        r = got[name]
        assert r["status"] == status and (r["reason"] == reason or reason.endswith(": ") and
                                          r["reason"].startswith(reason)), (name, r["status"], r["reason"])
    assert (got["png-named.jpg"]["format"], got["png-named.jpg"]["ext"]) == ("PNG", "png")  # sniffed from bytes
    assert (got["cmyk.jpg"]["format"], got["cmyk.jpg"]["ext"]) == ("JPEG", "jpg")
    for name in ("exif6.jpg", "exif6.png"):  # reported as displayed: 240 wide, 320 high
        assert (got[name]["width"], got[name]["height"]) == (240, 320), name
    assert (got["plain.jpg"]["width"], got["plain.jpg"]["height"]) == (320, 240)

    # the kept ones go through staging and one model: every one decodes and is embedded
    kept = [(n, r) for n, r in sorted(got.items()) if r["status"] == "kept"]
    store = Store(str(tmp_path / "corpus"))
    samples, rows = [], []
    for i, (name, r) in enumerate(kept):
        data = cases[name][0]
        key = f"k{i:03d}"
        samples.append(Sample(key, {r["ext"]: data, "txt": name.encode(), "json": b"{}"}))
        rows.append({"key": key, "part": 0, "row": i, "sha256": hashlib.sha256(data).hexdigest(), "ext": r["ext"],
                     "width": r["width"], "height": r["height"], "bytes": len(data)})
    write_staging_shard(store, "000000", rows, samples)
    done = extract_shard(store, "000000", FeaturesConfig(models=[ModelSpec(name="wfd")],
                                                         runtime=RuntimeConfig(batch_size=4)))
    assert (done.info["models"]["wfd"]["ok"], done.info["models"]["wfd"]["errors"]) == (len(kept), 0)


def rgb_of(data: bytes) -> np.ndarray:
    image = decode_rgb(data)
    assert image.mode == "RGB"
    return np.asarray(image)


@pytest.mark.scenario(5)
def test_decoded_pixels_of_odd_images_equal_independent_references():
    cases = odd_images()
    # EXIF orientation 6 is applied: the stored pixels turned 90° clockwise (lossless PNG: exact)
    assert np.array_equal(rgb_of(cases["exif6.png"][0]), np.rot90(RGB, k=-1))
    jpeg_rotated = rgb_of(cases["exif6.jpg"][0]).astype(int)
    assert np.abs(jpeg_rotated - np.rot90(RGB, k=-1)).mean() < 3
    # 16-bit grey scaled by 255/65535, a dark 16-bit image stays dark
    want = np.clip(np.round(GREY16 * (255 / 65535)), 0, 255).astype(np.uint8)
    assert np.array_equal(rgb_of(cases["grey16.png"][0]), np.repeat(want[..., None], 3, axis=2))
    assert rgb_of(cases["dark16.png"][0]).max() <= 1
    # 16-bit RGB: the high byte of each channel
    assert np.array_equal(rgb_of(cases["rgb16.png"][0]), (RGB16 >> 8).astype(np.uint8))
    # palette with a transparent index: that index over white, the others their colour
    want = np.array(COLOURS, dtype=np.uint8)[PALETTE]
    want[PALETTE == 0] = 255
    assert np.array_equal(rgb_of(cases["palette.png"][0]), want)
    # CMYK JPEG comes back as the RGB it was made from (within JPEG loss)
    assert np.abs(rgb_of(cases["cmyk.jpg"][0]).astype(int) - RGB).mean() < 3
    # a PNG named .jpg decodes losslessly
    assert np.array_equal(rgb_of(cases["png-named.jpg"][0]), RGB)


BOMB_SCRIPT = textwrap.dedent("""
    import io, json, os, resource, sys
    from PIL import Image
    from corpusforge.storage import Store
    from tasks.ingest.partition import ingest_partition
    from tasks.ingest.sources import SourceConfig, cut_partitions
    from tasks.shared.validate import ValidationConfig
    from tasks.ingest.files import ingest_path

    src, out, headroom, max_pixels = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store, cfg = Store(out), SourceConfig(partition_size=10)
    _, parts = cut_partitions(src, store, cfg)   # imports and planning done before the cap
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, vm + headroom))
    rows = []
    for p in parts:
        ingest_partition(store, p, cfg, ValidationConfig(max_pixels=max_pixels), n_buckets=1)
        rows += store.read_parquet(ingest_path(p.index)).to_pylist()
    print(json.dumps({r["source_path"].rsplit("/", 1)[-1]: [r["status"], r["reason"]] for r in rows}), flush=True)
    # skip interpreter teardown: under the cap, a native thread pool can fail to stop cleanly
    # (std::terminate at exit, after all the work above is done and printed)
    os._exit(0)
""")


@pytest.fixture(scope="module")
def bomb_png() -> bytes:
    """A 12000 x 12000 all-black RGB PNG: ~0.4 MB declaring 144M pixels (432 MB decoded),
    above our 100M limit and below Pillow's own error threshold (2 x 89M), so only our
    header check stands between it and the decoder."""
    return encode(Image.new("RGB", (12000, 12000)), "PNG")


def run_capped(src: Path, out: Path, max_pixels: int) -> subprocess.CompletedProcess:
    headroom = 256 << 20  # decoding the bomb needs 432 MB for its pixels alone
    return subprocess.run([sys.executable, "-c", BOMB_SCRIPT, str(src), str(out), str(headroom), str(max_pixels)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.scenario(6)
def test_decompression_bomb_is_rejected_from_the_header_under_a_memory_cap(tmp_path, bomb_png):
    src = tmp_path / "src"
    src.mkdir()
    (src / "bomb.png").write_bytes(bomb_png)
    (src / "fine.jpg").write_bytes(encode(Image.fromarray(RGB), "JPEG"))
    assert (src / "bomb.png").stat().st_size < 1 << 20
    done = run_capped(src, tmp_path / "out", max_pixels=100_000_000)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["fine.jpg"] == ["kept", ""]
    assert got["bomb.png"] == ["error", "decompression_bomb: declares 12000x12000 = 144000000 pixels > 100000000"]


@pytest.mark.scenario(6)
def test_the_memory_cap_is_real_a_bomb_let_through_fails_to_decode(tmp_path, bomb_png):
    """Control: with the pixel limit raised, the same bomb is decoded and the cap stops it
    (so the test above passes because nothing was decoded, not because memory was ample)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "bomb.png").write_bytes(bomb_png)
    done = run_capped(src, tmp_path / "out", max_pixels=10**9)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["bomb.png"] == ["error", "decode_error: MemoryError: "]
