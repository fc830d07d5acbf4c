"""Staging shards: the valid, exact-deduplicated records in input order, in fixed-size tars.

They are the unit of parallel work for every later stage (one task per staging shard for
features and graph queries) and give those stages sequential reads. Per shard::

    staging/{shard}.tar               {key}.{jpg|png|webp} (original bytes), {key}.txt, {key}.json
    staging/{shard}.index.parquet     key, ext, offset, size of every member (ranged reads)
    staging/{shard}.records.parquet   key, part, row, sha256, width, height, source, caption_type,
                                      ext, bytes — one row per sample, in shard order
    staging/{shard}.tar.done.json     completion marker, written last
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from corpusforge.hashing import canonical_json, fingerprint
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.tarshard import Sample, write_tar
from tasks.exact_dedup import RESOLVED_SCHEMA

RECORDS_SCHEMA = pa.schema([RESOLVED_SCHEMA.field(c) for c in (
    "key", "part", "row", "sha256", "width", "height", "source", "caption_type", "ext", "bytes")])
SAMPLE_JSON_FIELDS = ["key", "width", "height", "license", "license_url", "attribution", "source",
                      "caption_type", "retrieved_at", "sha256"]


class StagingConfig(BaseModel):
    """Staging shard size and the bucketing of the exact-dedup group-by."""

    model_config = ConfigDict(extra="forbid")

    shard_size: int = Field(1000, ge=1, description="Samples per staging shard (the unit of parallel work).")
    dedup_buckets: int | None = Field(
        None, ge=1, description="Hash buckets of the exact-dedup and key-uniqueness group-bys; "
                                "empty for one per 4 ingest partitions (1 to 256).")

    def buckets_for(self, n_parts: int) -> int:
        return self.dedup_buckets or max(1, min(256, n_parts // 4))


@dataclass(frozen=True)
class StagingShard:
    """Survivors ``[skip, skip+take)`` of each listed partition, in input order."""

    index: int
    slices: tuple[tuple[int, int, int], ...]  # (part, skip, take)

    @property
    def name(self) -> str:
        return f"{self.index:06d}"


def plan_staging(survivors_per_part: list[int], shard_size: int) -> list[StagingShard]:
    """Cut the survivors, numbered in input order, into shards of ``shard_size``."""
    shards: list[StagingShard] = []
    current: list[tuple[int, int, int]] = []
    room = shard_size
    for part, count in enumerate(survivors_per_part):
        skip = 0
        while skip < count:
            take = min(room, count - skip)
            current.append((part, skip, take))
            skip += take
            room -= take
            if room == 0:
                shards.append(StagingShard(len(shards), tuple(current)))
                current, room = [], shard_size
    if current:
        shards.append(StagingShard(len(shards), tuple(current)))
    return shards


def read_source_bytes(record: dict[str, Any], storage_options: dict[str, Any]) -> bytes:
    """Read a record's image bytes again from its source and check they did not change."""
    location = record["source_path"]
    with fsspec.open(location.split("#", 1)[0], "rb", **storage_options) as f:
        if record["source_offset"] >= 0:  # a member inside a source tar
            f.seek(record["source_offset"])
        data = f.read(record["bytes"] + (0 if record["source_offset"] >= 0 else 1))
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise RuntimeError(f"source changed since ingest: {location} (key {record['key']})")
    return data


def sample_json(record: dict[str, Any], extra: dict[str, Any] | None = None) -> bytes:
    meta = {name: record.get(name) for name in SAMPLE_JSON_FIELDS}
    meta.update(extra or {})
    return canonical_json(meta).encode()


def to_sample(record: dict[str, Any], image: bytes, extra: dict[str, Any] | None = None) -> Sample:
    return Sample(record["key"], {record["ext"]: image, "txt": (record.get("caption") or "").encode(),
                                  "json": sample_json(record, extra)})


def shard_records(store: Store, shard: StagingShard) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for part, skip, take in shard.slices:
        rows = store.read_parquet(f"work/resolved/{part:06d}.parquet").to_pylist()
        survivors = [r for r in rows if r["status"] == Status.KEPT.value]
        records += survivors[skip:skip + take]
    return records


def write_staging_shard(store: Store, shard: StagingShard, storage_options: dict[str, Any],
                        code_version: str) -> dict[str, Any]:
    """Write one staging shard (skipped when already complete with the same content)."""
    rel = f"staging/{shard.name}.tar"
    records = shard_records(store, shard)
    fp = fingerprint("staging", [(r["key"], r["sha256"], r.get("caption")) for r in records], code_version)
    if (done := store.read_done(rel)) and done.get("fingerprint") == fp:
        return done
    samples = (to_sample(r, read_source_bytes(r, storage_options)) for r in records)
    with store.atomic_write(rel) as f:
        result = write_tar(f, samples)
    store.write_parquet(f"staging/{shard.name}.index.parquet", result.index)
    store.write_parquet(f"staging/{shard.name}.records.parquet",
                        pa.Table.from_pylist(records, schema=RECORDS_SCHEMA))
    info = {"fingerprint": fp, "shard": shard.name, "count": result.count, "sha256": result.sha256,
            "bytes": result.bytes}
    store.mark_done(rel, info)
    return info


def completed_staging_shards(store: Store) -> list[str]:
    """Names of the staging shards with a completion marker, sorted."""
    return store.completed("staging", "tar")
