"""Input kinds, per-record errors, key rules and exact deduplication, run in-process."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tasks.ingest.files import resolved_path
from corpusforge.storage import Store
from tasks.ingest.exact_dedup import deduplicate
from tasks.ingest.partition import ingest_partition
from tasks.ingest.sources import SourceConfig, cut_partitions
from tasks.shared.inputs import locate
from tasks.shared.validate import ValidationConfig


def jpeg(w: int, h: int, seed: int, quality: int = 85) -> bytes:
    arr = (np.random.default_rng(seed).random((h, w, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def ingest_all(src: str, out, cfg: SourceConfig | None = None) -> list[dict]:
    """Run ingest → key check → exact dedup → resolve in-process; return resolved rows."""
    store = Store(str(out))
    cfg = cfg or SourceConfig(partition_size=3)
    _, parts = cut_partitions(src, store, cfg)
    ingested = [ingest_partition(store, p, cfg, ValidationConfig(), n_buckets=2) for p in parts]
    deduplicate(store, [m.digest for m in ingested], len(ingested), n_buckets=2, shard_size=1000,
                resolved=lambda part, result: None)
    return [r for p in parts for r in store.read_parquet(resolved_path(p.index)).to_pylist()]


def write_images(folder, images: dict[str, bytes]) -> None:
    for name, data in images.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_metadata_table_formats_and_column_mapping(tmp_path, fmt):
    src = tmp_path / "src"
    write_images(src, {"img/a.jpg": jpeg(400, 300, 1), "img/b.jpg": jpeg(300, 400, 2)})
    rows = [{"id": "a", "file": "img/a.jpg", "text": "cap a", "quality": 0.9},
            {"id": "b", "file": "img/b.jpg", "text": "cap b", "quality": 0.1}]
    table = pa.Table.from_pylist(rows)
    if fmt == "parquet":
        pq.write_table(table, src / "metadata.parquet")
    elif fmt == "csv":
        pacsv.write_csv(table, src / "metadata.csv")
    else:
        (src / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SourceConfig(columns={"key": "id", "path": "file", "caption": "text"}, partition_size=1)
    got = ingest_all(str(src), tmp_path / "out", cfg)
    assert [(r["key"], r["caption"], r["status"], r["width"]) for r in got] == [
        ("a", "cap a", "kept", 400), ("b", "cap b", "kept", 300)]


def test_missing_keys_are_derived_deterministically(tmp_path):
    src = tmp_path / "src"
    write_images(src, {"a.jpg": jpeg(400, 300, 1)})
    pq.write_table(pa.table({"path": ["a.jpg"]}), src / "metadata.parquet")
    one = ingest_all(str(src), tmp_path / "o1")
    two = ingest_all(str(src), tmp_path / "o2")
    assert one[0]["key"] == two[0]["key"] and one[0]["key"].startswith("k")


def test_unsafe_paths_missing_files_and_duplicate_keys(tmp_path):
    src = tmp_path / "src"
    write_images(src, {"a.jpg": jpeg(400, 300, 1), "b.jpg": jpeg(400, 300, 2)})
    (tmp_path / "outside.jpg").write_bytes(jpeg(400, 300, 3))
    pq.write_table(pa.table({"key": ["a", "esc", "abs", "gone", "a", "bad.key"],
                             "path": ["a.jpg", "../outside.jpg", str(tmp_path / "outside.jpg"), "nope.jpg", "b.jpg",
                                      "b.jpg"]}), src / "metadata.parquet")
    got = {(r["key"], r["row"], r["part"]): r for r in ingest_all(str(src), tmp_path / "out")}
    codes = [(k[0], r["status"], r["reason"].split(":")[0]) for k, r in sorted(got.items(), key=lambda i: (i[0][2], i[0][1]))]
    assert codes == [("a", "kept", ""), ("esc", "error", "unsafe_path"), ("abs", "error", "unsafe_path"),
                     ("gone", "error", "missing_file"), ("a", "error", "duplicate_key"), ("bad.key", "error", "unsafe_key")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "outside.jpg", "src"]  # nothing written outside


def test_exact_duplicates_keep_highest_resolution_then_smallest_key(tmp_path):
    src = tmp_path / "src"
    base = jpeg(400, 300, 5)
    write_images(src, {"x.jpg": base, "y.jpg": base, "z.jpg": base, "other.jpg": jpeg(500, 300, 6)})
    pq.write_table(pa.table({"key": ["zz", "mm", "aa", "o"], "path": ["x.jpg", "y.jpg", "z.jpg", "other.jpg"]}),
                   src / "metadata.parquet")
    got = {r["key"]: r for r in ingest_all(str(src), tmp_path / "out")}
    assert got["aa"]["status"] == "kept"
    assert [(got[k]["status"], got[k]["duplicate_of"]) for k in ("zz", "mm")] == [("exact_duplicate", "aa")] * 2
    assert got["o"]["status"] == "kept"


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_webdataset_tars_like_img2dataset(tmp_path):
    src = tmp_path / "tars"
    src.mkdir()
    meta = json.dumps({"key": "000000001", "caption": "from json", "url": "http://example.invalid/x.jpg"}).encode()
    (src / "00000.tar").write_bytes(_tar_bytes([
        ("000000001.jpg", jpeg(400, 300, 1)), ("000000001.txt", b"a caption"), ("000000001.json", meta),
        ("../../evil.jpg", jpeg(400, 300, 2)), ("000000002.txt", b"no image")]))
    (src / "00001.tar").write_bytes(_tar_bytes([("000000003.jpg", jpeg(400, 300, 3))])[:900])  # truncated
    got = ingest_all(str(src), tmp_path / "out")
    summary = [(r["key"], r["status"], r["reason"].split(":")[0]) for r in got]
    assert summary[0] == ("000000001", "kept", "") and got[0]["caption"] == "a caption"
    evil = next(r for r in got if r["source_path"].endswith("#../../evil.jpg"))
    assert (evil["status"], evil["reason"].split(":")[0], evil["key"][0]) == ("error", "unsafe_name", "k")
    assert ("000000002", "error", "no_image_member") in summary
    assert summary[-1][1:] == ("error", "read_error")
    assert not (tmp_path / "evil.jpg").exists()


def test_bare_folder_with_sidecars(tmp_path):
    src = tmp_path / "imgs"
    write_images(src, {"a.jpg": jpeg(400, 300, 1), "a.txt": b"caption of a", "sub/b.png": b"", "notes.md": b"hi"})
    got = {r["source_path"].rsplit("/", 1)[-1]: r for r in ingest_all(str(src), tmp_path / "out")}
    assert set(got) == {"a.jpg", "b.png", "notes.md"}
    assert got["a.jpg"]["caption"] == "caption of a" and got["a.jpg"]["status"] == "kept"
    assert got["b.png"]["reason"].startswith("empty_file")
    assert got["notes.md"]["status"] == "error"


@pytest.mark.parametrize("path,ok", [("a/b.jpg", True), ("../a.jpg", False), ("/etc/passwd", False),
                                     ("a/../../b", False), ("file:///etc/passwd", False), ("s3://b/k.jpg", False),
                                     ("a\\b.jpg", False), ("", False)])
def test_resolve_path_safety(path, ok):
    assert (locate("/base", path)[0] is not None) == ok


def test_staging_copies_the_ingest_spill_and_never_rereads_the_source(tmp_path):
    """Ingest spills the bytes it validated; staging copies them from there, so the source
    may be gone by then. A duplicate is spilled (it is found later) but never staged, and a
    spill that no longer holds the ingested bytes fails the shard instead of staging them."""
    import shutil

    from corpusforge.contract import marker_path, read_marker
    from corpusforge.layout import staging_tar
    from tasks.ingest.files import spill_path
    from corpusforge.tarshard import iter_tar_samples
    from tasks.staging.stage import cut_staging, write_staging_shard

    src = tmp_path / "src"
    a, b = jpeg(300, 200, 1), jpeg(320, 200, 2)
    images = {"a.jpg": a, "dup.jpg": a, "b.jpg": b, "bad.jpg": b"not an image"}
    write_images(src, images)
    pq.write_table(pa.table({"key": ["ka", "kd", "kb", "kx"], "path": list(images)}), src / "metadata.parquet")
    rows = ingest_all(str(src), tmp_path / "out")
    store = Store(str(tmp_path / "out"))
    by_key = {r["key"]: r for r in rows}
    assert by_key["kd"]["status"] == "exact_duplicate" and by_key["kx"]["spill_offset"] == -1
    for key, name in (("ka", "a.jpg"), ("kd", "dup.jpg"), ("kb", "b.jpg")):
        r = by_key[key]
        assert store.read_range(spill_path(r["part"]), r["spill_offset"], r["bytes"]) == images[name]
    assert store.size(spill_path(0)) == 2 * len(a) + len(b) and store.size(spill_path(1)) == 0

    shutil.rmtree(src)
    parts = sorted({r["part"] for r in rows})
    (shard,) = cut_staging([read_marker(store, resolved_path(p)).info for p in parts], 1000)
    write_staging_shard(store, shard)
    with store.open(staging_tar(shard.name)) as f:
        staged = {s.key: s.members["jpg"] for s in iter_tar_samples(f)}
    assert staged == {"ka": a, "kb": b}

    spill = bytearray(store.read_bytes(spill_path(0)))
    spill[by_key["kb"]["spill_offset"] + 100] ^= 0xFF
    store.write_bytes(spill_path(0), bytes(spill))
    store.remove(marker_path(staging_tar(shard.name)))
    with pytest.raises(RuntimeError, match="does not hold the bytes ingest hashed for key kb"):
        write_staging_shard(store, shard)


def test_verify_content_stamps_every_file_with_its_sha256(tmp_path):
    """``input.verify: content``: a tar's partition digest and each image's stamp carry the
    file's SHA-256, so a change no metadata shows is still seen; unchanged, a rerun skips."""
    import hashlib

    from tasks.ingest.partition import image_stamps

    src = tmp_path / "src"
    write_images(src, {"a.jpg": jpeg(400, 300, 1)})
    pq.write_table(pa.table({"path": ["a.jpg"]}), src / "metadata.parquet")
    tars = tmp_path / "tars"
    tars.mkdir()
    (tars / "00000.tar").write_bytes(_tar_bytes([("k1.jpg", jpeg(400, 300, 2))]))
    cfg = SourceConfig(verify="content")
    store = Store(str(tmp_path / "out"))
    _, [table_part] = cut_partitions(str(src), store, cfg)
    [stamp] = image_stamps(table_part, cfg, store)
    assert stamp.endswith(f":sha256={hashlib.sha256((src / 'a.jpg').read_bytes()).hexdigest()}")
    assert image_stamps(table_part, SourceConfig(), store)[0] == stamp.rsplit(":sha256=", 1)[0]
    _, [tar_part] = cut_partitions(str(tars), Store(str(tmp_path / "out-tars")), cfg)
    assert tar_part.digest.endswith(f":sha256={hashlib.sha256((tars / '00000.tar').read_bytes()).hexdigest()}")
    first = ingest_partition(store, table_part, cfg, ValidationConfig(), n_buckets=2)
    again = ingest_partition(store, table_part, cfg, ValidationConfig(), n_buckets=2)
    assert first.action == "computed" and again.action == "skipped"


def test_keys_differing_only_in_case_are_per_record_errors(tmp_path):
    """``dup`` and ``Dup`` would overwrite each other when a release tar is unpacked on a
    case-insensitive filesystem: the first in input order keeps its key, a later case
    variant is ``key_case_collision``, a later exact repeat stays ``duplicate_key``."""
    src = tmp_path / "src"
    write_images(src, {f"{i}.jpg": jpeg(400, 300, 10 + i) for i in range(6)})
    pq.write_table(pa.table({"key": ["Dup", "other", "dup", "DUP", "dup", "Other"],
                             "path": [f"{i}.jpg" for i in range(6)]}), src / "metadata.parquet")
    got = sorted(ingest_all(str(src), tmp_path / "out"), key=lambda r: (r["part"], r["row"]))
    assert [(r["key"], r["status"], r["reason"].split(":")[0]) for r in got] == [
        ("Dup", "kept", ""), ("other", "kept", ""), ("dup", "error", "key_case_collision"),
        ("DUP", "error", "key_case_collision"), ("dup", "error", "duplicate_key"),
        ("Other", "error", "key_case_collision")]
    assert got[2]["reason"].startswith("key_case_collision: dup differs only in case from Dup earlier in the input")


def test_control_characters_in_captions_are_stripped_with_a_warning(tmp_path):
    """A NUL, an ANSI escape or a C1 control in a caption never ships: it is removed and the
    record says so in its ``warning``; tab and newline stay, as does an earlier warning."""
    src = tmp_path / "src"
    write_images(src, {f"{i}.jpg": jpeg(400, 300, 20 + i) for i in range(3)})
    pq.write_table(pa.table({"key": ["a", "b", "c"], "path": ["0.jpg", "1.jpg", "2.jpg"],
                             "caption": ["nul\x00byte\x00", "\x1b[31mred\x7f\x85", "tab\tand\nline"]}),
                   src / "metadata.parquet")
    got = {r["key"]: r for r in ingest_all(str(src), tmp_path / "out")}
    assert [(got[k]["caption"], got[k]["warning"], got[k]["status"]) for k in "abc"] == [
        ("nulbyte", "caption_control_characters: removed 2 (U+0000)", "kept"),
        ("[31mred", "caption_control_characters: removed 3 (U+001B, U+007F, U+0085)", "kept"),
        ("tab\tand\nline", None, "kept")]
    tars = tmp_path / "tars"
    tars.mkdir()
    (tars / "00000.tar").write_bytes(_tar_bytes([("k1.jpg", jpeg(400, 300, 30)), ("k1.txt", b"a\x00b"),
                                                 ("k1.json", b"[1]")]))
    [row] = ingest_all(str(tars), tmp_path / "out-tars")
    assert row["caption"] == "ab" and row["warning"].endswith("; caption_control_characters: removed 1 (U+0000)")
    assert row["warning"].startswith("bad_sidecar:")


def test_format_characters_and_separators_in_captions_are_cleaned_with_a_warning(tmp_path):
    """A bidi override (U+202E) makes a caption display reversed; zero-width spaces and a BOM
    hide inside words; U+2028/U+2029 break lines where no newline is. Each is removed (the
    separators become newlines) with one warning per kind; the joiners U+200C/U+200D, which
    spell Persian words and emoji sequences, stay."""
    src = tmp_path / "src"
    write_images(src, {f"{i}.jpg": jpeg(400, 300, 40 + i) for i in range(3)})
    persian = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \U0001f468\u200d\U0001f469"  # and an emoji family
    pq.write_table(pa.table({"key": ["a", "b", "c"], "path": ["0.jpg", "1.jpg", "2.jpg"],
                             "caption": ["safe \u202egpj.exe\u202c name\u200b\ufeff", "one\u2028two\u2029three\x00",
                                         persian]}),
                   src / "metadata.parquet")
    got = {r["key"]: r for r in ingest_all(str(src), tmp_path / "out")}
    assert [(got[k]["caption"], got[k]["warning"]) for k in "abc"] == [
        ("safe gpj.exe name", "caption_format_characters: removed 4 (U+200B, U+202C, U+202E, U+FEFF)"),
        ("one\ntwo\nthree", "caption_control_characters: removed 1 (U+0000); "
                            "caption_line_separators: replaced 2 (U+2028, U+2029) with a newline"),
        (persian, None)]
    assert all(got[k]["status"] == "kept" for k in "abc")


def test_folder_sidecars_are_read_at_ingest_and_their_changes_noticed(tmp_path):
    """Planning lists a folder without opening a sidecar (issue 22: it read them one at a time):
    the row names its sidecars, ingest reads them, and their stamps enter its fingerprint."""
    src = tmp_path / "imgs"
    write_images(src, {"a.jpg": jpeg(400, 300, 1), "a.txt": b"first", "a.json": b'{"license": "cc-by", "caption": "j"}',
                       "b/c.jpg": jpeg(300, 300, 2), "b/c.json": b'{"caption": "from json"}'})
    store, cfg = Store(str(tmp_path / "out")), SourceConfig(partition_size=3)

    def ingest(parts):
        actions = [ingest_partition(store, p, cfg, ValidationConfig(), n_buckets=2).action for p in parts]
        rows = {r["source_path"].rsplit("/imgs/", 1)[1]: r for p in parts
                for r in store.read_parquet(f"work/ingest/{p.name}.parquet").to_pylist()}
        return actions, rows

    _, parts = cut_partitions(str(src), store, cfg)
    (src / "a.txt").write_bytes(b"second")  # after planning: ingest reads what is there now
    actions, rows = ingest(parts)
    assert set(rows) == {"a.jpg", "b/c.jpg"} and actions == ["computed"]
    assert (rows["a.jpg"]["caption"], rows["a.jpg"]["license"]) == ("second", "cc-by")
    assert rows["b/c.jpg"]["caption"] == "from json"

    (src / "b" / "c.json").write_bytes(b'{"caption": "changed after the build"}')
    _, again = cut_partitions(str(src), store, cfg)
    assert again == parts  # the chunk names sidecars, not their content
    actions, rows = ingest(again)
    assert actions == ["computed"] and rows["b/c.jpg"]["caption"] == "changed after the build"
    assert ingest(again)[0] == ["skipped"]


@pytest.mark.s3
def test_folder_on_s3_equals_the_same_folder_on_disk(tmp_path, s3):
    """An object-store folder is listed one top-level prefix at a time; sidecars come along."""
    import s3fs

    images = {"top.jpg": jpeg(300, 300, 1), "top.txt": b"top caption", "x/a.jpg": jpeg(300, 300, 2),
              "x/a.json": b'{"license": "cc0"}', "x/y/b.png": b"", "z/c.jpg": jpeg(300, 300, 3),
              "z/c.txt": b"c", "z/notes.md": b"hi", "z/lonely.txt": b"no image"}
    local = tmp_path / "imgs"
    write_images(local, images)
    fs = s3fs.S3FileSystem(**s3)
    fs.mkdir("corpusforge-folder")
    fs.put(str(local), "corpusforge-folder/imgs", recursive=True)
    cfg = SourceConfig(partition_size=3, storage_options=s3)
    remote = ingest_all("s3://corpusforge-folder/imgs", tmp_path / "s3out", cfg)
    on_disk = ingest_all(str(local), tmp_path / "out")
    fields = ("key", "status", "reason", "caption", "license", "warning", "sha256")
    assert [{f: r[f] for f in fields} for r in remote] == [{f: r[f] for f in fields} for r in on_disk]
    assert len(remote) == 6
