"""The folder listing, spilled and sorted out of core, writes the input chunks the in-memory
listing wrote: same rows, same chunking, byte-identical files (so the same SHA-256s in the
partitions and markers), locally, on S3 and on another object store.

The old listing is ``tasks/sources.py`` at :data:`OLD_COMMIT`, read from git and run under
its old name (as tests/old_release.py does for release assignment)."""

from __future__ import annotations

import os
import types
import uuid
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest

from corpusforge.contract import probe
from corpusforge.key_ranges import key_ranges
from tasks.ingest.files import INPUT_DIR, LISTING_SPILL_DIR
from corpusforge.storage import Store
from tasks.ingest import sources
from tasks.ingest.sources import SourceConfig, cut_partitions
from tasks.shared import listing
from tests.old_code import module_at

OLD_COMMIT = "78eb19a8741cd8f55392f958c683da62aca7ef07"  # the last commit with the in-memory listing

# Regular files: images with a .txt, a .json, both or neither; orphaned sidecars; names that
# sort differently by '/' and '.' (a.jpg, a/b.jpg, a-b.jpg); an upper-case image extension;
# a sidecar in upper case (dropped, never attached, as before); no extension; non-ASCII; stems
# that do not sort as their paths do ('a.jq.png' between 'a.jpg' and 'a.json', 'a.j.jpg' before both).
REGULAR = {
    "a.jq.png": b"i", "a.jq.txt": b"cap a.jq", "a.j.jpg": b"i", "a.j.json": b"{}",
    "a.jpg": b"i", "a.txt": b"cap a", "a.json": b'{"license": "cc-by"}',
    "a/b.jpg": b"i", "a/b.json": b"{}", "a-b.jpg": b"i", "a-b.txt": b"cap a-b", "a0.png": b"i",
    "B.JPG": b"i", "B.json": b"{}", "c.png": b"i", "c.TXT": b"upper", "d.webp": b"i",
    "orphan.txt": b"o", "orphan.json": b"{}", "notes.md": b"n", "README": b"r",
    "deep/er/x.jpeg": b"i", "deep/er/x.txt": b"x", "deep/x.jpg": b"i", "deep/er.txt": b"o",
    "é.jpg": b"i", "é.txt": b"e", "z 1.jpg": b"i", "z 1.json": b"{}", "ü/k.jpg": b"i", "ü/k.txt": b"k",
}


def old_sources() -> types.ModuleType:
    """``tasks/sources.py`` at :data:`OLD_COMMIT`, not registered in ``sys.modules``."""
    return module_at(OLD_COMMIT, "tasks/sources.py", "tasks.sources")


def write_tree(root: Path) -> None:
    for rel, data in REGULAR.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def local_folder(tmp_path: Path) -> Path:
    """:data:`REGULAR` plus links and special files named like sidecars: a link to a sidecar
    inside (attached), one outside (a row), a broken one, FIFOs, a link to a folder."""
    src = tmp_path / "src"
    write_tree(src)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"secret")
    links = src / "links"
    links.mkdir()
    for stem in ("in", "out", "broken", "image"):
        (links / f"{stem}.jpg").write_bytes(b"i")
    os.symlink("../a.txt", links / "in.txt")
    os.symlink(outside, links / "out.txt")
    os.symlink(src / "missing.txt", links / "broken.json")
    os.symlink("../a.jpg", links / "link.jpg")
    os.symlink("../deep", links / "folder")
    os.mkfifo(links / "image.txt")
    os.mkfifo(src / "pipe.json")
    return src


def input_files(out: Path) -> dict[str, bytes]:
    """The chunk files (not the list of chunks a local folder's cut now keeps, ``TABLE_CUTS``)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / INPUT_DIR).rglob("*"))
            if p.is_file() and str(p.relative_to(out)) != sources.TABLE_CUTS}


def assert_chunks_equal_old(src: str, tmp_path: Path, cfg: SourceConfig, new_out: Store | None = None) -> list:
    """Plan ``src`` with the old and the new listing into fresh roots; assert equal
    partitions (less the root) and byte-identical chunk files. Returns the new partitions."""
    old_root, new_root = tmp_path / f"old-{uuid.uuid4().hex}", tmp_path / f"new-{uuid.uuid4().hex}"
    new_store = new_out or Store(str(new_root))
    kind, old_parts = old_sources().plan_partitions(src, Store(str(old_root)), cfg)
    new_kind, new_parts = cut_partitions(src, new_store, cfg)
    assert kind == new_kind == "folder"

    def plain(parts: list, root: str) -> list[tuple]:
        return [(p.index, p.kind, p.uri.removeprefix(root), p.base, p.digest) for p in parts]

    assert plain(new_parts, new_store.root) == plain(old_parts, str(old_root))
    if new_out is None:
        assert input_files(new_root) == input_files(old_root)
        assert not (new_root / LISTING_SPILL_DIR).exists()
    else:
        assert {p: new_out.read_bytes(p) for p in input_files(old_root)} == input_files(old_root)
        left = new_out.fs.find(new_out.path(LISTING_SPILL_DIR), detail=True).values()
        assert not [f for f in left if f["type"] == "file"]  # (SeaweedFS keeps the empty folder)
    return new_parts


@pytest.mark.parametrize("partition_size,spill_rows,range_rows", [
    (3, 2, 4), (500, listing.SPILL_ROWS, listing.LISTING_RANGE_ROWS), (1, 1, 1)])
def test_local_folder_chunks_equal_the_in_memory_listing(tmp_path, monkeypatch, partition_size, spill_rows,
                                                         range_rows):
    """Chunks across partition boundaries, listings spilled in many parts, and matched and
    sorted in ranges of a few rows (splits two and three levels deep): the old bytes."""
    monkeypatch.setattr(listing, "SPILL_ROWS", spill_rows)
    monkeypatch.setattr(listing, "LISTING_RANGE_ROWS", range_rows)
    monkeypatch.setattr(listing, "LISTING_FAN_OUT", 3)
    src = local_folder(tmp_path)
    parts = assert_chunks_equal_old(str(src), tmp_path, SourceConfig(partition_size=partition_size))
    rows = [r for p in parts for r in pq.read_table(p.uri, columns=["path", "sidecars"]).to_pylist()]
    got = {r["path"]: r["sidecars"] for r in rows}
    assert got["a.jpg"] == "txt,json" and got["a/b.jpg"] == "json" and got["a-b.jpg"] == "txt"
    assert got["a.jq.png"] == "txt" and got["a.j.jpg"] == "json" and "a.jq.txt" not in got
    assert got["links/in.jpg"] == "txt" and "links/in.txt" not in got
    assert got["links/out.jpg"] is None and "links/out.txt" in got          # a link outside: a row
    assert got["links/image.jpg"] is None and "links/image.txt" in got      # a FIFO: a row
    assert "c.TXT" not in got and got["c.png"] is None                      # as before: dropped, not attached
    assert "orphan.txt" in got and "links/folder" in got and "pipe.json" in got


def test_every_range_of_the_listing_holds_a_bounded_number_of_entries(tmp_path, monkeypatch):
    """Files neither images nor sidecars are keyed by their path, not one shared key (which
    would put them all in one range, as many as the folder holds); the rows are the old ones."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"{i:03d}.jpg").write_bytes(b"i")
        (src / f"{i:03d}.txt").write_bytes(b"c")
        (src / f"{i:03d}.md").write_bytes(b"n")
        (src / f"{i:03d}").write_bytes(b"x")
    monkeypatch.setattr(listing, "LISTING_RANGE_ROWS", 16)
    seen: list[int] = []

    def counted(*args, **kwargs):
        for ranged in key_ranges(*args, **kwargs):
            seen.append(sum(t.num_rows for t in ranged.values()))
            yield ranged

    monkeypatch.setattr(sources, "key_ranges", counted)  # the sidecars matched
    monkeypatch.setattr(listing, "key_ranges", counted)  # the kept rows sorted
    assert_chunks_equal_old(str(src), tmp_path, SourceConfig(partition_size=7))
    assert sum(seen) == 240 + 180 and max(seen) <= 16  # the entries, then the rows kept


def test_a_trailing_slash_and_a_rerun_give_the_same_chunks(tmp_path):
    """A rerun into the same root removes the spill it finds and writes the same chunks."""
    src = local_folder(tmp_path)
    store = Store(str(tmp_path / "out"))
    _, first = cut_partitions(str(src), store, SourceConfig(partition_size=4))
    _, again = cut_partitions(f"{src}/", store, SourceConfig(partition_size=4))
    assert [p.digest for p in again] == [p.digest for p in first]


CHANGES = {
    "bytes replaced": lambda src: (src / "a.jpg").write_bytes(b"other bytes"),
    "file added": lambda src: (src / "new.jpg").write_bytes(b"i"),
    "sidecar removed": lambda src: (src / "a.txt").unlink(),
    "renamed": lambda src: os.rename(src / "c.png", src / "z.png"),
    "file became a link": lambda src: ((src / "c.png").unlink(), os.symlink("a.jpg", src / "c.png")),
    "sidecar link led outside": lambda src: ((src / "links" / "in.txt").unlink(),
                                             os.symlink(src.parent / "outside.txt", src / "links" / "in.txt")),
}


@pytest.mark.parametrize("change", [None, *CHANGES])
def test_a_local_folder_whose_entries_are_unchanged_is_probed_current(tmp_path, change):
    """Probed in the flow process, an unchanged local folder's cut is read back (no task run);
    any change the listing sees (an entry added, removed or renamed, a file become a link, a
    sidecar link now leading outside the folder) lists it again, and the chunks are a fresh
    cut's. Bytes replaced in place are not the listing's to see (ingest stamps every image)."""
    src = local_folder(tmp_path)
    store, cfg = Store(str(tmp_path / "out")), SourceConfig(partition_size=4)
    first = cut_partitions(str(src), store, cfg)
    if change:
        CHANGES[change](src)
    current, result = probe(cut_partitions, dict(src=str(src), store=store, cfg=cfg))
    assert current == (change in (None, "bytes replaced"))
    if current:
        assert result == first
    fresh = Store(str(tmp_path / "fresh"))
    _, expected = cut_partitions(str(src), fresh, cfg)
    _, again = cut_partitions(str(src), store, cfg)
    assert [(p.index, p.digest) for p in again] == [(p.index, p.digest) for p in expected]
    assert input_files(tmp_path / "out") == input_files(tmp_path / "fresh")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fails", ["lister", "writer"])
def test_a_listing_error_is_raised_and_every_lister_stops(tmp_path, monkeypatch, fails):
    """A sub-folder that cannot be listed, or a spill part that cannot be written (faults
    injected: as root no folder is unreadable), is the planner's error, not a hang on the
    bounded queue between the listers and the writer; no spill is left behind."""
    src = tmp_path / "src"
    for folder in range(40):  # more sub-folders than listers, more batches than the queue holds
        (src / f"{folder:02d}").mkdir(parents=True)
        for i in range(3):
            (src / f"{folder:02d}" / f"{i}.jpg").write_bytes(b"i")
    monkeypatch.setattr(listing, "SPILL_BATCH", 1)
    monkeypatch.setattr(listing, "SPILL_ROWS", 2)
    if fails == "lister":
        walk = listing.walk_local
        monkeypatch.setattr(listing, "walk_local", lambda f: (_ for _ in ()).throw(OSError("unlistable"))
                            if f.endswith("/17") else walk(f))
    else:
        write = listing.SpillWriter.flush
        monkeypatch.setattr(listing.SpillWriter, "flush", lambda self: (
            (_ for _ in ()).throw(OSError("unwritable")) if len(self.parts) == 5 else write(self)))
    with pytest.raises(OSError, match="unlistable" if fails == "lister" else "unwritable"):
        cut_partitions(str(src), Store(str(tmp_path / "out")), SourceConfig())
    assert not (tmp_path / "out" / LISTING_SPILL_DIR).exists()


def test_an_empty_folder_has_no_records(tmp_path):
    """Nothing listed: the planner's one clear error, no spill left behind."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no input records"):
        cut_partitions(str(tmp_path / "empty"), Store(str(tmp_path / "out")), SourceConfig())
    assert not (tmp_path / "out" / LISTING_SPILL_DIR).exists()


def test_a_memory_filesystem_folder_equals_the_in_memory_listing(tmp_path):
    """Object stores other than S3 list with ``find``/``ls``: the same rows."""
    fs = fsspec.filesystem("memory")
    root = f"/listing-{uuid.uuid4().hex}"
    for rel, data in REGULAR.items():
        fs.pipe(f"{root}/{rel}", data)
    assert_chunks_equal_old(f"memory://{root}", tmp_path, SourceConfig(partition_size=3))


@pytest.mark.s3
@pytest.mark.parametrize("spill_rows", [2, listing.SPILL_ROWS])
def test_s3_folder_chunks_equal_the_in_memory_listing(tmp_path, s3, monkeypatch, spill_rows):
    """A prefix on S3 (top-level objects and sub-prefixes, listed page by page), planned
    into a local root and into a root on S3 (the spill on S3, read through fsspec)."""
    import s3fs

    monkeypatch.setattr(listing, "SPILL_ROWS", spill_rows)
    monkeypatch.setattr(listing, "REMOTE_PAGE", 3)
    fs = s3fs.S3FileSystem(**s3)
    bucket = f"listing-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    for rel, data in REGULAR.items():
        fs.pipe(f"{bucket}/src/{rel}", data)
    fs.pipe(f"{bucket}/src-not-this/a.jpg", b"i")  # a sibling prefix sharing the name's start
    cfg = SourceConfig(partition_size=3, storage_options=s3)
    parts = assert_chunks_equal_old(f"s3://{bucket}/src", tmp_path, cfg)
    assert len(parts) == 7  # 19 rows (12 sidecars attached) in chunks of 3
    assert_chunks_equal_old(f"s3://{bucket}/src/", tmp_path, cfg, new_out=Store(f"s3://{bucket}/out", s3))
