"""Exact deduplication's bucketed exchange (issue 22): over several partition groups and
hash buckets the decisions equal a direct reference, and each task opens only its own
files (counted by the scale benchmark's counting filesystem), so files opened grow with
the corpus, not with partitions × buckets."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest

from bench.scale import CountingFileSystem
from corpusforge.contract import finish_unit
from corpusforge.layout import INGEST_SCHEMA, MARKERS
from tasks.ingest.files import (dedup_hashes_path, dedup_keys_path, exact_path, hashes_path, ingest_path, keydup_path,
                                keys_table_path, resolved_path)
from corpusforge.storage import Store
from tasks.ingest.exact_dedup import (combine_digests, deduplicate, exchange_keys, find_duplicate_keys,
                                      partition_groups, write_dedup_tables)

P, PER, B = 40, 30, 4  # 40 partitions of 30 records, 4 buckets: 3 groups of (at least) 16 partitions
N = P * PER


def _record(i: int) -> dict[str, Any]:
    """Record i: every 37th reuses the key of a record ~500 earlier (another group), every
    11th has the bytes of another record anywhere in the input, every 13th was filtered."""
    key = f"k{i - 500:05d}" if i % 37 == 0 and i >= 500 else f"k{i:05d}"
    content = (i * 7) % N if i % 11 == 0 else i
    filtered = i % 13 == 0
    record = {name: None for name in INGEST_SCHEMA.names}
    record.update(part=i // PER, row=i % PER, key=key, status="filtered" if filtered else "kept",
                  reason="license: not allowed" if filtered else "", sha256=None if filtered else f"{content:064x}",
                  width=100 + i % 3, height=100, source_offset=-1, spill_offset=-1)
    return record


def _reference() -> dict[tuple[int, int], tuple[str, str | None]]:
    """(part, row) -> (status, duplicate_of), straight from the rules."""
    records = [_record(i) for i in range(N)]
    seen: set[str] = set()
    fate: dict[tuple[int, int], tuple[str, str | None]] = {}
    by_hash: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["key"] in seen:
            fate[(r["part"], r["row"])] = ("error", None)
            continue
        seen.add(r["key"])
        fate[(r["part"], r["row"])] = (r["status"], None)
        if r["status"] == "kept":
            by_hash.setdefault(r["sha256"], []).append(r)
    for group in by_hash.values():
        winner = min(group, key=lambda r: (-r["width"] * r["height"], r["key"]))
        for r in group:
            if r is not winner:
                fate[(r["part"], r["row"])] = ("exact_duplicate", winner["key"])
    return fate


@pytest.fixture
def ingested(tmp_path) -> tuple[Store, list[dict[str, Any]]]:
    store = Store(str(tmp_path / "out"), fsync=False)
    markers = []
    for part in range(P):
        rows = [_record(i) for i in range(part * PER, (part + 1) * PER)]
        outputs = write_dedup_tables(store, part, rows, B)
        outputs[ingest_path(part)] = store.write_parquet(ingest_path(part),
                                                         pa.Table.from_pylist(rows, schema=INGEST_SCHEMA))
        markers.append(finish_unit(store, ingest_path(part), f"test-{part}", outputs, {}))
    store.fs = CountingFileSystem()
    return store, markers


def _opened(run, call: dict[str, Any]) -> tuple[Any, list[str]]:
    """Run a unit; return its result and the data files it opened (markers aside), sorted."""
    paths: list[str] = []
    CountingFileSystem.reset(paths)
    try:
        result = run(**call)
    finally:
        CountingFileSystem.reset()
    rels = [os.path.relpath(p, call["store"].root) for p in paths]
    return result, sorted(r for r in rels if not r.startswith(f"{MARKERS}/"))


def test_decisions_equal_the_rules_and_each_task_opens_only_its_own_files(ingested):
    store, markers = ingested
    groups = partition_groups(P, B)
    assert len(groups) == 3 and len(groups[0]) == 16 and groups[-1] == range(32, 40)
    opened: dict[str, list[tuple[dict[str, Any], list[str]]]] = {}

    class Counting:  # a fan-out that records the data files each unit opens
        def stream(self, unit, calls: list[dict[str, Any]], sink) -> None:
            for i, call in enumerate(calls):
                result, files = _opened(unit.fn, call)
                opened.setdefault(unit.fn.__name__, []).append((call, files))
                sink(i, result)

    by_part: dict[int, Any] = {}
    summary = deduplicate(store, [m.digest for m in markers], P, B, 1000, by_part.__setitem__, Counting())
    resolved = [by_part[p] for p in range(P)]
    keydup_files, exact_files = [keydup_path(b) for b in range(B)], [exact_path(b) for b in range(B)]
    for call, files in opened["exchange_keys"]:
        assert files == [keys_table_path(p) for p in call["parts"]]
    for _, files in opened["find_duplicate_keys"]:  # its row group of each group file
        assert files == [dedup_keys_path(g) for g in range(len(groups))]
    for call, files in opened["exchange_hashes"]:
        assert files == sorted([hashes_path(p) for p in call["parts"]] + keydup_files)
    for _, files in opened["find_exact_duplicates"]:
        assert files == [dedup_hashes_path(g) for g in range(len(groups))]
    for call, files in opened["resolve_group"]:
        assert files == sorted([ingest_path(p) for p in call["parts"]] + keydup_files + exact_files)
    # 3 data files per partition and 5 per (group, bucket) (markers aside), where reading every
    # partition's tables in each bucket task and every decision file per partition took 4·B
    total = sum(len(files) for runs in opened.values() for _, files in runs)
    assert total == 3 * P + 5 * len(groups) * B < 4 * B * P
    assert summary.computed == 2 * len(groups) + 2 * B and summary.skipped == 0

    got = {(r["part"], r["row"]): (r["status"], r["duplicate_of"])
           for p in range(P) for r in store.read_parquet(resolved_path(p)).to_pylist()}
    want = _reference()
    assert got == want
    assert sum(s == "exact_duplicate" for s, _ in got.values()) > 50 and sum(s == "error" for s, _ in got.values()) > 10
    assert [m.info["survivors"] for m in resolved] == [
        sum(want[(p, r)][0] == "kept" for r in range(PER)) for p in range(P)]


def test_a_bucket_task_reads_only_its_row_groups(tmp_path):
    """The exchange files hold one row group per bucket, and a bucket task's filter reads
    only those (with files large enough that the footer's read-ahead is not the whole file)."""
    import hashlib

    import pyarrow.parquet as pq

    store = Store(str(tmp_path / "out"), fsync=False)
    parts, per = range(16), 4000
    for part in parts:
        rows = [{"part": part, "row": row, "key": hashlib.sha256(b"%d" % (part * per + row)).hexdigest()[:24],
                 "status": "kept", "sha256": "0" * 64, "width": 1, "height": 1} for row in range(per)]
        write_dedup_tables(store, part, rows, B)
    keys_x = exchange_keys(store, 0, parts, "ingested")
    meta = pq.ParquetFile(store.path(dedup_keys_path(0))).metadata
    buckets = [meta.row_group(i).column(0).statistics for i in range(meta.num_row_groups)]
    assert [(s.min, s.max) for s in buckets] == [(b, b) for b in range(B)]
    store.fs = CountingFileSystem()
    CountingFileSystem.reset()
    find_duplicate_keys(store, 1, combine_digests([keys_x.digest]), len(parts))
    whole = os.path.getsize(store.path(dedup_keys_path(0)))
    assert whole > 1 << 20
    assert whole / B < CountingFileSystem.bytes_read < whole / 2
