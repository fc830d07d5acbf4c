"""Staging under source faults (issue 14, scenarios 5 and 13), caused for real on disk.

Staging copies the bytes ingest validated from the ingest spills and never re-reads the
source: a source file that vanishes, changes or turns unreadable after ingest cannot
reach the corpus half-changed, and a spill that does not hold what ingest hashed fails
its shard loudly without marking it done. Runs the stages' plain functions in-process.
"""

from __future__ import annotations

import os
from typing import Any
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusforge.contract import read_marker
from corpusforge.layout import staging_index, staging_records, staging_tar
from tasks.ingest.files import hashes_path, spill_path
from corpusforge.storage import Store
from tasks.ingest.exact_dedup import deduplicate
from tasks.ingest.partition import ingest_partition
from tasks.ingest.sources import SourceConfig, cut_partitions
from tasks.staging.stage import cut_staging, write_staging_shard
from tasks.shared.validate import ValidationConfig
from tests.test_ingest import jpeg

pytestmark = [pytest.mark.scenario(13), pytest.mark.timeout(120)]
N = 10


def ingested(tmp_path: Path) -> tuple[Store, Path, list, int]:
    """A 10-image table source ingested and resolved; returns the store, source folder,
    the staging cuts and the number of partitions."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(N):
        (src / f"{i}.jpg").write_bytes(jpeg(300, 300, i))
    pq.write_table(pa.table({"key": [f"r{i}" for i in range(N)], "path": [f"{i}.jpg" for i in range(N)]}),
                   src / "metadata.parquet")
    store = Store(str(tmp_path / "out"))
    cfg = SourceConfig(partition_size=5)
    _, parts = cut_partitions(str(src), store, cfg)
    ing = [ingest_partition(store, p, cfg, ValidationConfig(), n_buckets=1) for p in parts]
    resolved: dict[int, Any] = {}
    deduplicate(store, [m.digest for m in ing], len(ing), n_buckets=1, shard_size=100, resolved=resolved.__setitem__)
    shards = cut_staging([resolved[p].info for p in range(len(ing))], shard_size=100)
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


def test_source_files_broken_after_ingest_cannot_reach_staging(tmp_path):
    store, src, shards, _ = ingested(tmp_path)
    validated = {r["key"]: r["sha256"] for p in range(2) for r in store.read_parquet(hashes_path(p)).to_pylist()}
    break_sources(src, vanish=[1], change=[4], unreadable=[7])
    marker = write_staging_shard(store, shards[0])
    name = shards[0].name
    assert marker.info["count"] == N
    index = store.read_parquet(staging_index(name)).to_pylist()
    exts = {r["key"]: r["ext"] for r in store.read_parquet(staging_records(name)).to_pylist()}
    images = {r["key"]: r["sha256"] for r in index if r["ext"] == exts[r["key"]]}
    assert images == validated  # the bytes ingest validated, not what the source holds now
    assert [r["key"] for r in store.read_parquet(staging_records(name)).to_pylist()] == [f"r{i}" for i in range(N)]


def test_a_spill_that_lost_its_bytes_fails_the_shard_loudly_and_is_not_marked_done(tmp_path):
    store, _, shards, _ = ingested(tmp_path)
    spill = tmp_path / "out" / spill_path(0)
    data = bytearray(spill.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside some image
    spill.write_bytes(bytes(data))
    name = shards[0].name
    with pytest.raises(RuntimeError, match=r"does not hold the bytes ingest hashed"):
        write_staging_shard(store, shards[0])
    assert read_marker(store, staging_tar(name)) is None
    assert not store.exists(staging_records(name)) and not store.exists(staging_tar(name))  # checked before written
    assert not [p for p in (tmp_path / "out").rglob("*.part")]
    with pytest.raises(RuntimeError):  # a rerun is not skipped: it fails again
        write_staging_shard(store, shards[0])


def test_a_truncated_spill_fails_the_shard_and_writes_nothing(tmp_path):
    store, _, shards, _ = ingested(tmp_path)
    spill = tmp_path / "out" / spill_path(1)
    spill.write_bytes(spill.read_bytes()[:-1000])  # the last image of partition 1 cut short
    name = shards[0].name
    with pytest.raises(RuntimeError, match=r"spill incomplete"):
        write_staging_shard(store, shards[0])
    assert read_marker(store, staging_tar(name)) is None
    assert not store.exists(staging_tar(name)) and not store.exists(staging_index(name))
    assert not [p for p in (tmp_path / "out").rglob("*.part")]
