"""Staging shards: the valid, exact-deduplicated records in input order, in tars.

They are the unit of parallel work for every later stage (one task per staging shard for
features and graph queries) and give those stages sequential reads. Their cuts are
content-defined (:mod:`corpusforge.chunking`), so a shard keeps its name and content
while its records are unchanged, whatever happens elsewhere in the source. Per shard::

    staging/tars/{shard}.tar          {key}.{jpg|png|webp} (original bytes), {key}.txt, {key}.json
    staging/index/{shard}.parquet     key, ext, offset, size of every member (ranged reads)
    staging/records/{shard}.parquet   key, part, row, sha256, width, height, source, caption_type,
                                      ext, bytes — one row per sample, in shard order
    _markers/staging/tars/{shard}.tar.json   outputs' digests; ``info.images`` is the digest
                                      of the ordered (key, sha256, ext) list: what features read;
                                      ``info.errors`` the records that could not be staged

Staging re-reads each record's bytes from the source and checks their SHA-256 against
ingest's. A record whose file vanished, changed or cannot be read since ingest is that
record's error (``missing_file``, ``source_changed``, ``read_error``; the release plan
puts it in the manifest) and the rest of the shard proceeds — unless more than
``staging.max_error_share`` of the shard failed: then the source is broken, not one
record, and the shard raises without being written or marked done.

Fingerprint: the content of the records it holds (every field written to the tar and
the records file) and the stage's code version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from corpusforge.chunking import plan_cuts
from corpusforge.contract import run_unit, unit_fingerprint
from corpusforge.faults import fault_point
from corpusforge.hashing import canonical_json, fingerprint
from corpusforge.layout import (STAGING_RECORDS_SCHEMA, resolved_path, staging_index, staging_records,
                                staging_tar)
from corpusforge.records import Status
from corpusforge.storage import Store, with_retry_defaults
from corpusforge.tarshard import Sample, write_tar
from corpusforge.version import code_version

SAMPLE_JSON_FIELDS = ["key", "width", "height", "license", "license_url", "attribution", "source",
                      "caption_type", "retrieved_at", "sha256"]


class StagingConfig(BaseModel):
    """Staging shard size and the bucketing of the exact-dedup group-by."""

    model_config = ConfigDict(extra="forbid")

    shard_size: int = Field(1000, ge=1, description="Average samples per staging shard (the unit of parallel "
                                                    "work); content-defined cuts give shards of 1/2 to 2x this.")
    max_error_share: float = Field(
        0.1, ge=0, le=1, description="Largest share of a staging shard's records whose source bytes may fail to "
                                     "be re-read (vanished, changed since ingest, unreadable) before the shard "
                                     "fails loudly instead of completing without them.")
    dedup_buckets: int | None = Field(
        None, ge=1, description="Hash buckets of the exact-dedup and key-uniqueness group-bys; "
                                "empty for one per 4 ingest partitions (1 to 256).")

    def buckets_for(self, n_parts: int) -> int:
        return self.dedup_buckets or max(1, min(256, n_parts // 4))


@dataclass(frozen=True)
class StagingShard:
    """Survivors ``[skip, skip+take)`` of each listed partition, in input order."""

    name: str
    slices: tuple[tuple[int, int, int], ...]  # (part, skip, take)


def plan_staging(resolved: list[dict[str, Any]], shard_size: int) -> list[StagingShard]:
    """Staging shards from each partition's survivor count and cut candidates (resolve's info)."""
    firsts, candidates, total = [], [], 0
    for info in resolved:
        firsts.append(total)
        candidates += [(total + position, name) for position, name in info["candidates"]]
        total += info["survivors"]
    shards = []
    part = 0
    for cut in plan_cuts(total, candidates, shard_size):
        slices = []
        position, end = cut.start, cut.start + cut.count
        while position < end:
            while part + 1 < len(firsts) and firsts[part + 1] <= position:
                part += 1
            available = (firsts[part] + resolved[part]["survivors"]) - position
            take = min(available, end - position)
            if take > 0:
                slices.append((resolved[part]["part"], position - firsts[part], take))
                position += take
            else:
                part += 1
        shards.append(StagingShard(cut.name, tuple(slices)))
    return shards


class SourceChanged(ValueError):
    """A record's source bytes differ from what ingest hashed."""


def read_source_bytes(record: dict[str, Any], storage_options: dict[str, Any]) -> bytes:
    """Read a record's image bytes again from its source and check they did not change."""
    location = record["source_path"]
    uri = location.split("#", 1)[0]
    with fsspec.open(uri, "rb", **with_retry_defaults(uri, storage_options)) as f:
        if record["source_offset"] >= 0:  # a member inside a source tar
            f.seek(record["source_offset"])
        data = f.read(record["bytes"] + (0 if record["source_offset"] >= 0 else 1))
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise SourceChanged(f"source changed since ingest: {location} (key {record['key']})")
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
        rows = store.read_parquet(resolved_path(part)).to_pylist()
        survivors = [r for r in rows if r["status"] == Status.KEPT.value]
        records += survivors[skip:skip + take]
    return records


def images_digest(records: list[dict[str, Any]]) -> str:
    """What the feature stage reads of a shard: its images' keys, bytes (by hash) and order."""
    return fingerprint([(r["key"], r["sha256"], r["ext"]) for r in records])


def _staging_error(record: dict[str, Any], exc: Exception) -> dict[str, Any]:
    """The per-record error of a record whose source bytes could not be read back."""
    if isinstance(exc, FileNotFoundError):
        reason = f"missing_file: vanished since ingest: {record['source_path']}"
    elif isinstance(exc, SourceChanged):
        reason = f"source_changed: {exc}"
    else:
        reason = f"read_error: {type(exc).__name__}: {exc}"
    return {"key": record["key"], "part": record["part"], "row": record["row"], "reason": reason}


def write_staging_shard(store: Store, shard: StagingShard, storage_options: dict[str, Any],
                        max_error_share: float = 0.1) -> dict[str, Any]:
    """Write one staging shard (skipped when its records' content is unchanged)."""
    records = shard_records(store, shard)
    content = [[r.get(c) for c in (*SAMPLE_JSON_FIELDS, "caption", "ext", "bytes", "part", "row", "source_path",
                                    "source_offset")] for r in records]
    fp = unit_fingerprint("staging", code_version("tasks.staging"), None, content)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        staged: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []

        def samples():
            for i, r in enumerate(records):
                if i == 1:
                    fault_point("staging.write", shard.name)  # tests only: off unless CORPUSFORGE_FAULT
                try:
                    data = read_source_bytes(r, storage_options)
                except (OSError, ValueError) as exc:
                    errors.append(_staging_error(r, exc))
                    continue
                staged.append(r)
                yield to_sample(r, data)

        with store.atomic_write(staging_tar(shard.name)) as f:
            result = write_tar(f, samples())
            # error-rate guard: raised inside the write, so the tar is never committed
            if records and len(errors) / len(records) > max_error_share:
                raise RuntimeError(f"staging shard {shard.name}: {len(errors)} of {len(records)} records could "
                                   f"not be read back from the source (more than staging.max_error_share="
                                   f"{max_error_share}); first error: {errors[0]['reason']}; the shard is not "
                                   "marked done")
        outputs = {
            staging_tar(shard.name): result.sha256,
            staging_index(shard.name): store.write_parquet(staging_index(shard.name), result.index),
            staging_records(shard.name): store.write_parquet(
                staging_records(shard.name), pa.Table.from_pylist(staged, schema=STAGING_RECORDS_SCHEMA)),
        }
        return outputs, {"shard": shard.name, "count": result.count, "bytes": result.bytes,
                         "images": images_digest(staged), "errors": errors}

    return run_unit(store, staging_tar(shard.name), fp, compute)
