"""The sample corpus generator: determinism, planted records that are what they claim, mixes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import re
import struct
import subprocess
import sys
import zlib
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageOps, UnidentifiedImageError

from sample_corpus import design_sample_corpus, write_sample_corpus
from sample_corpus.bad_records import BAD_KINDS, SPECIAL_KINDS, bomb_png
from sample_corpus.captions import CaptionView, write_caption
from sample_corpus.edits import Edit, apply_edit
from sample_corpus.encoding import Encoding
from sample_corpus.metadata import LICENSE_URLS, METADATA_COLUMNS
from sample_corpus.photos import PHOTOS, PhotoCrop, load_photo
from sample_corpus.scenes import NAMED_COLOURS, Background, Colour, Scene, Shape

pytestmark = pytest.mark.timeout(120)

N = 150
KEY_RE = re.compile(r"^[A-Za-z0-9_\-]{1,96}$")
GREYS = {"black", "charcoal", "grey", "light grey", "white"}


def _file_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("sample") / "a"
    summary = write_sample_corpus(str(root), n=N, seed=0)
    return root, summary


@pytest.fixture(scope="module")
def table(corpus) -> list[dict]:
    return pq.read_table(corpus[0] / "metadata.parquet").to_pylist()


@pytest.fixture(scope="module")
def truth(corpus) -> dict:
    return json.loads((corpus[0] / "ground_truth.json").read_text())


@pytest.fixture(scope="module")
def design2000():
    return design_sample_corpus(2000, seed=0)


def _path(root: Path, rows: dict[str, dict], key: str) -> Path:
    return root / rows[key]["path"]


# ---- determinism -----------------------------------------------------------------------

def test_same_seed_gives_byte_identical_files(corpus, tmp_path):
    root, summary = corpus
    again = write_sample_corpus(str(tmp_path / "b"), n=N, seed=0)
    assert again == summary
    assert _file_hashes(tmp_path / "b") == _file_hashes(root)


def test_other_seed_gives_other_corpus(corpus, tmp_path):
    root, _ = corpus
    write_sample_corpus(str(tmp_path / "c"), n=N, seed=1)
    a, c = _file_hashes(root), _file_hashes(tmp_path / "c")
    assert a["metadata.parquet"] != c["metadata.parquet"]
    assert a["ground_truth.json"] != c["ground_truth.json"]
    # Only content-free files (empty file, bombs of fixed size) may coincide.
    shared = set(a.values()) & set(c.values())
    assert len(shared) <= 2


def test_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "stale.jpg").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        write_sample_corpus(str(tmp_path), n=N, seed=0)


# ---- metadata table and ground truth ---------------------------------------------------

def test_metadata_table_is_well_formed(corpus, table, truth):
    root, summary = corpus
    schema = pq.read_schema(root / "metadata.parquet")
    assert schema.names == list(METADATA_COLUMNS)
    assert len(table) == N == summary["rows"]
    keys = [r["key"] for r in table]
    assert len(set(keys)) == N and all(KEY_RE.match(k) for k in keys)
    absent = {b["key"] for b in truth["bad_records"] if b["kind"] in ("missing_file", "unsafe_path")}
    for r in table:
        assert "\\" not in r["path"]
        assert (root / r["path"]).is_file() != (r["key"] in absent), r
        assert r["caption_type"] in {"tag", "short", "medium", "long"} and r["caption"]
        assert r["source"] in {"flickr", "wikimedia"}
        assert LICENSE_URLS[r["license"]] == r["license_url"]
        site = "Flickr" if r["source"] == "flickr" else "Wikimedia Commons"
        assert re.fullmatch(rf"Photo by [A-Z][\w ]+ on {site}", r["attribution"])
        assert datetime.strptime(r["retrieved_at"], "%Y-%m-%dT%H:%M:%SZ")
    written = sum(1 for p in (root / "images").rglob("*") if p.is_file())
    assert written == summary["files"] == N - len(absent)


def test_every_ground_truth_key_is_a_row(table, truth):
    keys = {r["key"] for r in table}
    mentioned = []
    for item in truth["exact_duplicates"] + truth["near_duplicates"]:
        assert item["copy_of"] in keys and item["key"] != item["copy_of"]
        mentioned.append(item["key"])
    for cluster in truth["clusters"]:
        assert cluster["edit"] == "burst" and 6 <= len(cluster["keys"]) <= 7
        mentioned += cluster["keys"]
    mentioned += [b["key"] for b in truth["bad_records"]] + [s["key"] for s in truth["valid_special"]]
    assert set(mentioned) <= keys
    originals = [i["copy_of"] for i in truth["exact_duplicates"] + truth["near_duplicates"]]
    # Each planted record plays one part, and every copy has its own original.
    assert len(mentioned + originals) == len(set(mentioned + originals))
    assert {b["kind"] for b in truth["bad_records"]} == set(BAD_KINDS)
    assert {s["kind"] for s in truth["valid_special"]} == set(SPECIAL_KINDS)
    for b in truth["bad_records"]:
        assert (b["expected_status"], b["expected_reason"]) == BAD_KINDS[b["kind"]]


def test_related_rows_are_not_neighbours(table, truth):
    position = {r["key"]: i for i, r in enumerate(table)}
    groups = [[i["key"], i["copy_of"]] for i in truth["exact_duplicates"] + truth["near_duplicates"]]
    groups += [c["keys"] for c in truth["clusters"]]
    for keys in groups:
        spots = sorted(position[k] for k in keys)
        assert all(b - a > 1 for a, b in zip(spots, spots[1:])), keys


# ---- planted copies --------------------------------------------------------------------

def test_exact_duplicates_are_byte_identical(corpus, table, truth):
    root = corpus[0]
    rows = {r["key"]: r for r in table}
    assert truth["exact_duplicates"]
    for item in truth["exact_duplicates"]:
        assert rows[item["key"]]["path"] != rows[item["copy_of"]]["path"]
        assert _path(root, rows, item["key"]).read_bytes() == _path(root, rows, item["copy_of"]).read_bytes()


def _thumb(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("L").resize((16, 16), Image.Resampling.BOX),
                          np.float32)


def test_near_duplicates_differ_in_bytes_and_stay_large(corpus, table, truth):
    root = corpus[0]
    rows = {r["key"]: r for r in table}
    difficulties = Counter(i["difficulty"] for i in truth["near_duplicates"])
    assert difficulties["easy"] >= 5 and difficulties["hard"] >= 5
    for item in truth["near_duplicates"]:
        copy = _path(root, rows, item["key"]).read_bytes()
        assert copy != _path(root, rows, item["copy_of"]).read_bytes()
        with Image.open(io.BytesIO(copy)) as im:
            im.load()
            assert max(im.size) >= 300, item


def test_easy_copies_are_nearest_to_their_own_original(corpus, table, truth):
    """An easy near-duplicate or burst shot must look more like its original than like any other."""
    root = corpus[0]
    rows = {r["key"]: r for r in table}
    planted = {b["key"] for b in truth["bad_records"]} | {s["key"] for s in truth["valid_special"]}
    copies = {i["key"]: i["copy_of"] for i in truth["near_duplicates"] if i["difficulty"] == "easy"}
    copies.update({k: c["keys"][0] for c in truth["clusters"] for k in c["keys"][1:]})
    copies_any = copies.keys() | {i["key"] for i in truth["near_duplicates"] + truth["exact_duplicates"]}
    originals = [k for k in rows if k not in planted and k not in copies_any]
    thumbs = np.stack([_thumb(_path(root, rows, k)) for k in originals])
    for key, original in copies.items():
        distance = np.abs(thumbs - _thumb(_path(root, rows, key))).mean(axis=(1, 2))
        assert originals[int(np.argmin(distance))] == original, key


# ---- bad and special records -----------------------------------------------------------

def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks.append((kind, body))
        at += 12 + length
    return chunks


def test_bomb_png_is_a_tiny_well_formed_png_declaring_a_huge_image():
    data = bomb_png(60000, 60000)
    assert len(data) < 1000
    chunks = _png_chunks(data)
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour = struct.unpack(">IIBB", chunks[0][1][:10])
    assert (width, height, depth, colour) == (60000, 60000, 8, 2)
    assert zlib.decompress(chunks[1][1]) == bytes(1 + 3 * 60000)
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(data))


def test_bad_records_are_what_they_claim(corpus, table, truth):
    root = corpus[0]
    rows = {r["key"]: r for r in table}
    for bad in truth["bad_records"]:
        kind, rel = bad["kind"], rows[bad["key"]]["path"]
        path = root / rel
        if kind == "unsafe_path":
            assert posixpath.isabs(rel) or posixpath.normpath(rel).startswith("..")
            continue
        if kind == "missing_file":
            assert rel.startswith("images/") and not path.exists()
            continue
        data = path.read_bytes()
        if kind == "empty_file":
            assert data == b"" and rel.endswith(".jpg")
        elif kind == "not_an_image":
            assert rel.endswith(".png") and len(data) > 1000
            with pytest.raises(UnidentifiedImageError):
                Image.open(path)
        elif kind == "decompression_bomb":
            header = dict(_png_chunks(data))[b"IHDR"]
            width, height = struct.unpack(">II", header[:8])
            assert len(data) < 1000 and width * height >= 10**9
        elif kind == "truncated_jpeg":
            with Image.open(path) as im:
                assert im.format == "JPEG"
                with pytest.raises(OSError):
                    im.load()
        else:
            with Image.open(path) as im:
                im.load()
                longest, shortest = max(im.size), min(im.size)
            if kind == "too_small":
                assert longest < 256
            else:
                assert longest > 8 * shortest and longest >= 256


def test_valid_special_records_decode_as_declared(corpus, table, truth):
    root = corpus[0]
    rows = {r["key"]: r for r in table}
    for special in truth["valid_special"]:
        path = _path(root, rows, special["key"])
        assert path.suffix == ".jpg"
        with Image.open(path) as im:
            im.load()
            assert im.format == special["expected_format"]
            if special["kind"] == "cmyk_jpeg":
                assert im.mode == "CMYK"
            if special["kind"] == "exif_rotated":
                assert im.size == (640, 400) and im.getexif()[0x0112] == 6
            shown = ImageOps.exif_transpose(im)
            assert shown.size == (special["expected_width"], special["expected_height"])


def test_exif_rotated_record_shows_the_upright_picture(corpus, table, truth):
    """Turning the stored pixels as EXIF says must give back what the caption describes."""
    from sample_corpus.scenes import render_scene
    design = design_sample_corpus(N, seed=0)
    rows = {r.key: r for r in design.rows}
    special = next(s for s in truth["valid_special"] if s["kind"] == "exif_rotated")
    upright = np.asarray(render_scene(design.groups[rows[special["key"]].gid].content), np.float32)
    with Image.open(corpus[0] / rows[special["key"]].path) as im:
        shown = np.asarray(ImageOps.exif_transpose(im).convert("RGB"), np.float32)
    assert np.abs(shown - upright).mean() < 6  # JPEG noise only


def test_decoded_sizes_are_in_range(corpus, table, truth):
    root = corpus[0]
    rows = {r["key"]: r for r in table}
    planted = {b["key"] for b in truth["bad_records"]}
    for key in rows.keys() - planted:
        with Image.open(_path(root, rows, key)) as im:
            assert 300 <= max(im.size) <= 2500 and min(im.size) >= 150, (key, im.size)


# ---- edits and captions ----------------------------------------------------------------

def test_rotate_with_crop_leaves_no_fill_in_the_corners():
    white = Image.new("RGB", (800, 400), (255, 255, 255))
    for angle in (7.0, -7.0, 3.0):
        cropped = apply_edit(white, Edit("rotate", "hard", Encoding("JPEG"),
                                         {"angle": angle, "mode": "crop", "fill": 0}))
        assert np.asarray(cropped).min() >= 250
        assert max(cropped.size) >= 0.8 * 800
        filled = apply_edit(white, Edit("rotate", "hard", Encoding("JPEG"),
                                        {"angle": angle, "mode": "fill", "fill": 0}))
        assert filled.size[0] > 800 and np.asarray(filled).min() == 0


def _one_shape_scene(x: float) -> Scene:
    teal, navy, red = (Colour("teal", (20, 140, 140)), Colour("navy", (20, 30, 100)),
                       Colour("red", (210, 40, 40)))
    return Scene(width=600, height=400,
                 background=Background("gradient", (teal, navy), 0.0, 0.1, (0.5, 0.5)),
                 shapes=(Shape("star", red, x, 0.5, 0.15, 0.0, False),),
                 lines=None, lettering=None, texture=None, texture_strength=0.5, pixel_seed=1)


def test_captions_follow_flips_and_greyscale():
    rng = np.random.default_rng(0)
    scene = _one_shape_scene(0.2)
    plain = write_caption(scene, "long", rng)
    assert "red star sits on the left" in plain and "from teal to navy from left to right" in plain
    flipped = write_caption(scene, "long", rng, CaptionView(mirrored=True))
    assert "red star sits on the right" in flipped and "from right to left" in flipped
    grey = write_caption(scene, "long", rng, CaptionView(greyscale=True))
    assert "black and white" in grey
    assert not any(re.search(rf"\b{name}\b", grey) for name, _ in NAMED_COLOURS if name not in GREYS)


def _sentences(text: str) -> int:
    return len(re.findall(r'[.!?](?=\s+[A-Z"]|$)', text))


def test_caption_styles_have_the_right_shape(design2000):
    for row in design2000.rows:
        caption, kind = row.caption, row.meta.caption_type
        if kind == "tag":
            assert "." not in caption and caption.count(",") >= 2
        else:
            count = _sentences(caption)
            assert {"short": (1, 1), "medium": (2, 3), "long": (5, 7)}[kind][0] <= count \
                <= {"short": (1, 1), "medium": (2, 3), "long": (5, 7)}[kind][1], (kind, caption)


def test_greyscale_copies_are_captioned_without_colours(design2000):
    chromatic = [name for name, _ in NAMED_COLOURS if name not in GREYS]
    greyed = [r for r in design2000.rows
              if (m := design2000.member(r)).edit is not None and m.edit.name == "greyscale"]
    assert greyed
    for row in greyed:
        assert not any(re.search(rf"\b{name}\b", row.caption) for name in chromatic), row.caption


# ---- mixes and counts, from the design alone (no encoding) --------------------------------

def test_caption_source_and_licence_mixes_are_close_to_target(design2000):
    n = len(design2000.rows)
    kinds = Counter(r.meta.caption_type for r in design2000.rows)
    for kind, share, tolerance in (("tag", .01, .008), ("short", .45, .04), ("medium", .45, .04),
                                   ("long", .09, .02)):
        assert abs(kinds[kind] / n - share) < tolerance, kinds
    flickr = sum(r.meta.source == "flickr" for r in design2000.rows) / n
    assert abs(flickr - 0.88) < 0.025
    licences = Counter((r.meta.source, r.meta.license) for r in design2000.rows)
    assert ("wikimedia", "No known restrictions") not in licences
    assert {name for _, name in licences} == set(LICENSE_URLS)
    days = {r.meta.retrieved_at[:10] for r in design2000.rows}
    assert len(days) > 30


def test_planted_shares_and_sizes(design2000):
    summary = design2000.summary()
    n = summary["rows"]
    assert summary["exact_duplicates"] == round(0.02 * n)
    assert summary["near_duplicates_easy"] + summary["near_duplicates_hard"] == round(0.08 * n)
    assert abs(summary["near_duplicates_easy"] - summary["near_duplicates_hard"]) <= 1
    assert summary["burst_clusters"] == n // 500
    assert summary["bad_records"] >= len(BAD_KINDS) * 2
    truth = design2000.ground_truth()
    assert {i["edit"] for i in truth["near_duplicates"]} >= {
        "downscale", "jpeg_quality", "light_crop", "brightness", "format_change", "hflip",
        "heavy_crop", "greyscale", "blur", "rotate"}
    assert {i["edit"] for i in truth["near_duplicates"]} & {"caption_bar", "watermark"}
    originals = [g for g in design2000.groups if g.members[0].role in ("original", "burst_original")]
    sides = np.array([(g.content.width, g.content.height) for g in originals])
    assert sides.min() >= 300 and sides.max() <= 2500
    large = (sides.max(axis=1) > 900).mean()
    assert 0.003 < large < 0.03
    assert ((sides >= 300) & (sides <= 900)).all(axis=1).mean() > 0.95
    formats = Counter(g.members[0].encoding.format for g in originals)
    assert formats["JPEG"] / len(originals) > 0.75 and formats["PNG"] > 0 and formats["WEBP"] > 0
    photos = [g.content.photo.name for g in design2000.groups if isinstance(g.content, PhotoCrop)]
    assert sorted(photos) == sorted(p.name for p in PHOTOS)


def test_photo_catalogue_matches_the_bundled_images():
    for photo in PHOTOS:
        image = load_photo(photo.name)
        assert image.size == photo.size
        assert (image.mode == "RGB") == photo.is_colour


def test_too_small_n_is_refused():
    with pytest.raises(ValueError):
        design_sample_corpus(20, seed=0)


def test_design_is_the_same_in_another_process():
    """No dependence on ``hash()`` randomisation, call order or process state."""
    script = ("import hashlib, sys; from sample_corpus import design_sample_corpus; "
              f"p = design_sample_corpus({N}, seed=3); "
              "sys.stdout.write(hashlib.sha256(repr((p.metadata_table().to_pylist(), "
              "p.ground_truth())).encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    design = design_sample_corpus(N, seed=3)
    here = hashlib.sha256(repr((design.metadata_table().to_pylist(), design.ground_truth())).encode())
    assert out == here.hexdigest()
