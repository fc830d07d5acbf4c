"""The generated images' listings, out of core, against the in-memory listings they replaced.

Evaluate's listing (tasks/stats/evaluate.py) and qualify-prompts' (tasks/prompts/variance.py)
spill a folder's entries and read them back sorted a key range at a time
(tasks/shared/listing.py); the reference here is the listing as it was: every path sorted in
memory (tasks.shared.inputs.list_folder), resolved and stamped, cut into chunks.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

import pyarrow as pa
import pytest

from corpusforge.storage import Store, url_to_fs
from tasks.shared import listing
from tasks.shared.inputs import list_folder
from tasks.stats import evaluate
from tasks.stats.evaluate import (GENERATED_LISTING, LISTING_SCHEMA, GeneratedChunk, plan_generated,
                                  write_generated_listing)


def in_memory_chunks(sources: list[str], so: dict[str, Any], chunk_size: int) -> list[GeneratedChunk]:
    """The listing as evaluate cut it before it streamed: every path sorted in memory."""
    roots = tuple(s.rstrip("/") for s in sources)
    files, tars = [], []
    for source in roots:
        fs, root = url_to_fs(source, so)
        found = ([(posixpath.join(source, rel), info) for rel, info in list_folder(source, so)]
                 if fs.isdir(root) else [(source, None)])
        for uri, info in found:
            ext = evaluate._ext(uri)
            if ext in evaluate.IMAGE_EXTS:
                files.append((uri, evaluate._stamp(uri, info, roots, so)))
            elif ext == "tar":
                tars.append((uri, evaluate._stamp(uri, info, roots, so)))
    chunks = [GeneratedChunk("files", *map(tuple, zip(*files[i:i + chunk_size], strict=True)), roots=roots)
              for i in range(0, len(files), chunk_size)]
    return chunks + [GeneratedChunk("tar", (t,), (stamp,), roots) for t, stamp in tars]


def in_memory_listing(chunks: list[GeneratedChunk]) -> bytes:
    """The listing file as evaluate wrote it from the whole table, one row group a chunk."""
    labels = [i for i, c in enumerate(chunks) for _ in c.uris]
    table = pa.table({"chunk": pa.array(labels, pa.int32()), "name": [chunks[i].name for i in labels],
                      "kind": [chunks[i].kind for i in labels], "uri": [u for c in chunks for u in c.uris],
                      "stamp": [t for c in chunks for t in c.stamps]}, schema=LISTING_SCHEMA)
    from corpusforge.storage import parquet_bytes

    return parquet_bytes(table, labels)


def hostile_tree(tmp_path) -> str:
    """Nested folders, links in and out (a file, a folder), a FIFO named as an image, tars,
    files that are neither, names that sort across the folder boundary ('a/…' vs 'a-…')."""
    gen = tmp_path / "gen"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"s")
    for rel in ("a/b/c/1.png", "a/b/2.jpg", "a/3.webp", "a-4.png", "a.5.jpeg", "z/9.PNG", "0.png",
                "m/x.txt", "m/y.json", "m/deep/t.tar", "top.tar"):
        (gen / rel).parent.mkdir(parents=True, exist_ok=True)
        (gen / rel).write_bytes(rel.encode())
    for i in range(40):
        (gen / f"many/{i % 4}").mkdir(parents=True, exist_ok=True)
        (gen / f"many/{i % 4}/{i:03d}.png").write_bytes(b"x" * i)
    os.symlink(gen / "a" / "3.webp", gen / "link-in.png")
    os.symlink(outside / "secret.png", gen / "a" / "link-out.png")
    os.symlink(outside, gen / "folder-link.png")
    os.mkfifo(gen / "m" / "pipe.jpg")
    return str(gen)


@pytest.mark.parametrize("spill_rows,range_rows,chunk_size", [(3, 4, 5), (2, 1, 1), (16_384, 16_384, 1000)])
def test_the_streamed_listing_equals_the_in_memory_one(tmp_path, monkeypatch, spill_rows, range_rows, chunk_size):
    """Spilled in parts of a few entries, sorted in ranges of a few rows (splits several levels
    deep), over two sources (a folder, a single file): the same chunks, refusals and stamps,
    and the listing file byte for byte."""
    monkeypatch.setattr(listing, "SPILL_ROWS", spill_rows)
    monkeypatch.setattr(listing, "LISTING_RANGE_ROWS", range_rows)
    monkeypatch.setattr(listing, "LISTING_FAN_OUT", 3)
    gen = hostile_tree(tmp_path)
    sources = [gen + "/", os.path.join(gen, "a", "b", "2.jpg")]
    expected = in_memory_chunks(sources, {}, chunk_size)
    assert list(plan_generated(sources, {}, chunk_size)) == expected
    refused = {u: s for c in expected for u, s in zip(c.uris, c.stamps, strict=True) if s.startswith("unsafe_path")}
    assert {posixpath.relpath(u, gen) for u in refused} == {"a/link-out.png", "folder-link.png", "m/pipe.jpg"}
    assert sum(len(c.uris) for c in expected) == 40 + 7 + 3 + 1 + 1 + 2  # the link in is an image too
    out = Store(str(tmp_path / "out"))
    listed = write_generated_listing(out, sources, {}, chunk_size)
    assert [(c.name, c.files) for c in listed] == [(c.name, len(c.uris)) for c in expected]
    assert out.read_bytes(GENERATED_LISTING) == in_memory_listing(expected)
    assert [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()] == ["listing.parquet"]  # no spill left
