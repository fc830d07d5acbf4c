"""Staging's error-rate guard (issue 14, scenario 13): source files that vanish, change or
cannot be read between ingest and staging, caused for real on disk.

A few such records are per-record errors that reach the manifest with their reason while
the rest of the shard is staged; past ``staging.max_error_share`` the shard fails loudly,
writes nothing and is not marked done. Runs the stages' plain functions in-process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from corpusforge.contract import read_marker
from corpusforge.layout import hashes_path, keys_table_path, staging_records, staging_tar
from corpusforge.storage import Store
from tasks.exact_dedup import find_duplicate_keys, find_exact_duplicates, resolve_partition
from tasks.ingest import ingest_partition
from tasks.publish import publish
from tasks.sources import SourceConfig, plan_partitions
from tasks.splits import SplitConfig
from tasks.staging import plan_staging, write_staging_shard
from tasks.validate import ValidationConfig
from tests.test_ingest import jpeg

pytestmark = [pytest.mark.scenario(13), pytest.mark.timeout(120)]
N = 10


def ingested(tmp_path: Path) -> tuple[Store, Path, list, int]:
    """A 10-image table source ingested and resolved; returns the store, source folder,
    the staging plan and the number of partitions."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(N):
        (src / f"{i}.jpg").write_bytes(jpeg(300, 300, i))
    pq.write_table(pa.table({"key": [f"r{i}" for i in range(N)], "path": [f"{i}.jpg" for i in range(N)]}),
                   src / "metadata.parquet")
    store = Store(str(tmp_path / "out"))
    cfg = SourceConfig(partition_size=5)
    _, parts = plan_partitions(str(src), store, cfg)
    ing = [ingest_partition(store, p, cfg, ValidationConfig(), n_buckets=1) for p in parts]
    keydup = [find_duplicate_keys(store, 0, [m["outputs"][keys_table_path(p.index)] for p, m in zip(parts, ing, strict=True)])]
    exact = [find_exact_duplicates(store, 0, [m["outputs"][hashes_path(p.index)] for p, m in zip(parts, ing, strict=True)],
                                   [keydup[0]["digest"]])]
    resolved = [resolve_partition(store, p.index, m["digest"], [keydup[0]["digest"], exact[0]["digest"]],
                                  shard_size=100) for p, m in zip(parts, ing, strict=True)]
    shards = plan_staging([m["info"] for m in resolved], shard_size=100)
    assert len(shards) == 1
    return store, src, shards, len(parts)


def break_sources(src: Path, vanish: list[int], change: list[int], unreadable: list[int]) -> None:
    for i in vanish:
        (src / f"{i}.jpg").unlink()
    for i in change:
        (src / f"{i}.jpg").write_bytes(jpeg(300, 300, 1000 + i))
    for i in unreadable:  # a directory where the file was: opening it fails (as root too)
        (src / f"{i}.jpg").unlink()
        os.mkdir(src / f"{i}.jpg")


def test_past_the_limit_the_shard_fails_loudly_and_is_not_marked_done(tmp_path):
    store, src, shards, _ = ingested(tmp_path)
    break_sources(src, vanish=[1], change=[4], unreadable=[])   # 2 of 10 = 0.2 > 0.1 (default)
    with pytest.raises(RuntimeError, match=r"2 of 10 records could not be read back .*max_error_share=0.1.*"
                                           r"first error: missing_file.*not marked done"):
        write_staging_shard(store, shards[0], {})
    name = shards[0].name
    assert read_marker(store, staging_tar(name)) is None
    assert not store.exists(staging_tar(name)) and not store.exists(staging_records(name))
    assert not [p for p in (tmp_path / "out").rglob("*.part")]
    with pytest.raises(RuntimeError):  # a rerun is not skipped: it fails again
        write_staging_shard(store, shards[0], {})


def test_under_the_limit_each_failure_is_that_records_error_in_the_manifest(tmp_path):
    store, src, shards, n_parts = ingested(tmp_path)
    break_sources(src, vanish=[1], change=[4], unreadable=[7])  # 3 of 10 = 0.3 <= 0.5
    marker = write_staging_shard(store, shards[0], {}, max_error_share=0.5)
    name = shards[0].name
    assert marker["info"]["count"] == 7
    assert [r["key"] for r in store.read_parquet(staging_records(name)).to_pylist()] == \
        [f"r{i}" for i in range(N) if i not in (1, 4, 7)]
    publish(store, [name], n_parts, SplitConfig(val=0, test=0, shard_size=100), near_dedup=False)
    rows = {r["key"]: r for r in ds.dataset(tmp_path / "out" / "manifest", format="parquet").to_table().to_pylist()}
    assert len(rows) == N
    got = {k: (r["status"], r["reason"].split(":", 1)[0]) for k, r in rows.items() if r["status"] != "kept"}
    assert got == {"r1": ("error", "missing_file"), "r4": ("error", "source_changed"),
                   "r7": ("error", "read_error")}
    assert all(r["shard"] is None and r["staging_shard"] == name for k, r in rows.items() if k in got)
    assert sum(r["status"] == "kept" and r["shard"] is not None for r in rows.values()) == 7
    # an unchanged rerun skips the shard and the errors still come from its marker
    again = write_staging_shard(store, shards[0], {}, max_error_share=0.5)
    assert again["action"] == "skipped" and len(again["info"]["errors"]) == 3
