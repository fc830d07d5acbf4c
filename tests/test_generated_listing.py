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
from tasks.stats.evaluate import (GENERATED_LISTING, LISTING_SCHEMA, GeneratedChunk, cut_generated,
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
    assert list(cut_generated(sources, {}, chunk_size)) == expected
    refused = {u: s for c in expected for u, s in zip(c.uris, c.stamps, strict=True) if s.startswith("unsafe_path")}
    assert {posixpath.relpath(u, gen) for u in refused} == {"a/link-out.png", "folder-link.png", "m/pipe.jpg"}
    assert sum(len(c.uris) for c in expected) == 40 + 7 + 3 + 1 + 1 + 2  # the link in is an image too
    out = Store(str(tmp_path / "out"))
    listed = write_generated_listing(out, sources, {}, chunk_size)
    assert [(c.name, c.files) for c in listed] == [(c.name, len(c.uris)) for c in expected]
    assert out.read_bytes(GENERATED_LISTING) == in_memory_listing(expected)
    assert [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()] == ["listing.parquet"]  # no spill left


def in_memory_units(generated: str, so: dict[str, Any], valid: list[str], per_unit: int
                    ) -> tuple[dict[str, Any], list[tuple[str, int, list[tuple[str, list[tuple[str, str]]]]]]]:
    """Qualify-prompts' listing and units as they were cut before they streamed: the whole
    listing held as {model: {prompt: [(file, stamp)]}}, units cut from it and the prompt set."""
    import fsspec

    from corpusforge.storage import file_stamp
    from tasks.prompts.generated import IMAGE_EXTS
    from tasks.prompts.tables import SAFE_ID
    from tasks.shared.inputs import resolve_input

    fs, _ = url_to_fs(generated, so)
    root = generated.rstrip("/")
    found: dict[str, dict[str, list[tuple[str, str]]]] = {}
    unusable = []
    for rel, info in list_folder(root, so):
        parts = rel.split("/")
        if (len(parts) != 3 or not rel.lower().endswith(IMAGE_EXTS)
                or not (SAFE_ID.fullmatch(parts[0]) and SAFE_ID.fullmatch(parts[1]))):
            unusable.append(rel)
            continue
        location, refusal = resolve_input(root, rel, [root])
        stamp = file_stamp(fs, fsspec.core.strip_protocol(location), info) if location else refusal
        found.setdefault(parts[0], {}).setdefault(parts[1], []).append((parts[2], stamp))
    units = []
    for model in sorted(found):
        chosen = [(p, found[model][p]) for p in valid if p in found[model]]
        units += [(model, n, chosen[lo:lo + per_unit]) for n, lo in enumerate(range(0, len(chosen), per_unit))]
    summary = {"models": sorted(found), "unusable": unusable[:100], "unusable_count": len(unusable),
               "unknown_prompt_folders": sorted({f"{m}/{p}" for m in found for p in found[m] if p not in valid})}
    return summary, units


def prompt_tree(tmp_path) -> str:
    """Three models; prompts with images in some models only, a prompt not in the set, links in
    and out, a FIFO, unsafe names, files too deep or too shallow, a non-image."""
    gen = tmp_path / "generated"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.png").write_bytes(b"o")
    for model, prompts in (("m-a", "p1 p2 p3 p4 p5 p6"), ("m.b", "p6 p2 p9"), ("mc", "p3")):
        for prompt in prompts.split():
            for i in range(3):
                (gen / model / prompt).mkdir(parents=True, exist_ok=True)
                (gen / model / prompt / f"{i}{'.png' if i else '.JPG'}").write_bytes(f"{model}{prompt}{i}".encode())
    os.symlink(gen / "m-a" / "p1" / "1.png", gen / "m-a" / "p2" / "in.png")
    os.symlink(outside / "x.png", gen / "m-a" / "p3" / "out.png")
    os.mkfifo(gen / "m.b" / "p2" / "pipe.webp")
    for rel in ("m-a/p1/deeper/5.png", "top.png", "m-a/p1.png", "m-a/p1/notes.txt", "m-a/.hidden/1.png",
                "m-a/p 7/1.png"):
        (gen / rel).parent.mkdir(parents=True, exist_ok=True)
        (gen / rel).write_bytes(b"u")
    return str(gen)


@pytest.mark.parametrize("spill_rows,range_rows,per_unit", [(3, 4, 2), (1, 1, 1), (16_384, 16_384, 100)])
def test_the_streamed_prompt_listing_cuts_the_in_memory_units(tmp_path, monkeypatch, spill_rows, range_rows,
                                                              per_unit):
    """Qualify-prompts' listing, spilled in parts of a few entries, joined to the prompt set
    and sorted in ranges of a few rows: the same units with the same prompts, files, stamps and
    refusals (so the same unit keys), and the same models, unknown folders and unusable files."""
    from tasks.prompts.generated import list_generated, unit_prompts, write_prompt_order

    monkeypatch.setattr(listing, "SPILL_ROWS", spill_rows)
    monkeypatch.setattr(listing, "LISTING_RANGE_ROWS", range_rows)
    monkeypatch.setattr(listing, "LISTING_FAN_OUT", 3)
    gen = prompt_tree(tmp_path)
    valid = ["p6", "p3", "p1", "p2", "p5", "p4"]  # the set's order, not the folders'
    summary, units = in_memory_units(gen, {}, valid, per_unit)
    out = Store(str(tmp_path / "out"))
    write_prompt_order(out, [{"prompt_id": p, "status": "valid"} for p in valid] + [
        {"prompt_id": "p9", "status": "error"}])
    got = list_generated(out, gen + "/", {}, per_unit)
    assert {k: got[k] for k in summary} == summary
    assert summary["unusable_count"] == 6 and summary["unknown_prompt_folders"] == ["m.b/p9"]
    assert got["units"] == {m: sum(u[0] == m for u in units) for m in summary["models"]}
    assert [(m, n, unit_prompts(out, m, n)) for m, count in got["units"].items() for n in range(count)] == units
    stamps = {f"{m}/{p}/{f}": s for m, _, prompts in units for p, files in prompts for f, s in files}
    assert {k for k, s in stamps.items() if s.startswith("unsafe_path")} == {"m-a/p3/out.png", "m.b/p2/pipe.webp"}
    assert not stamps["m-a/p2/in.png"].startswith("unsafe_path")
