"""Staging shards: the valid, exact-deduplicated records in input order, in tars.

They are the unit of parallel work for every later stage and give those stages sequential reads.
docs/staging.md describes their files, content-defined cuts (:mod:`corpusforge.chunking`), and
why the image bytes come from the ingest spills, checked against ingest's XXH3-64 checksum (eight
times cheaper than SHA-256), never from the source.

Fingerprint: the content of the records it holds (every field written to the tar and
the records file) and the stage's code version. The marker also keeps ``info.slices``: the
digest of the resolved partitions the shard's slices come from, with the slices and the code
version. Those fix the records, so a shard whose slices' digests are unchanged is current
from its marker and the resolved markers alone: the flow probes it without reading a table
(:data:`WRITE_STAGING_SHARD`). When a resolved partition changed elsewhere, the records are
read and compared by content, and a shard whose content is unchanged only gets its marker's
``info.slices`` brought up to date (the bytes a fresh build writes).
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash
from pydantic import Field

from corpusforge.config import StrictModel
from corpusforge.chunking import cut_survivors
from corpusforge.contract import (SKIPPED, Unit, UnitResult, finish_unit, must_compute, read_marker, require_marker,
                                  run_unit, unit_fingerprint)
from corpusforge.faults import fault_point
from corpusforge.hashing import fingerprint, sha256_bytes
from corpusforge.layout import RESOLVED_SCHEMA, STAGING_RECORDS_SCHEMA, staging_index, staging_records, staging_tar
from tasks.ingest.files import resolved_path, spill_path
from corpusforge.records import Status
from corpusforge.storage import Store, parquet_bytes
from corpusforge.tarshard import Sample, write_tar
from corpusforge.version import code_version
from tasks.shared.samples import SAMPLE_JSON_FIELDS, sample_json


class StagingConfig(StrictModel):
    """Staging shard size and the bucketing of the exact-dedup group-by."""

    shard_size: int = Field(1000, ge=1, description="Average samples per staging shard (the unit of parallel "
                                                    "work); content-defined cuts give shards of 1/2 to 2x this.")
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


def cut_staging(resolved: Iterable[dict[str, Any]], shard_size: int) -> list[StagingShard]:
    """Staging shards from each partition's survivor count and cut candidates (resolve's info, in
    partition order, read once): it keeps O(shards) integers and tuples, never a record."""
    parts, firsts, survivors = array("q"), array("q"), array("q")  # 8 bytes a partition, not a dict
    candidates, total = [], 0
    for info in resolved:
        parts.append(info["part"])
        firsts.append(total)
        survivors.append(info["survivors"])
        candidates += [(total + position, name) for position, name in info["candidates"]]
        total += info["survivors"]
    shards = []
    part = 0
    for cut in cut_survivors(total, candidates, shard_size):
        slices = []
        position, end = cut.start, cut.start + cut.count
        while position < end:
            while part + 1 < len(firsts) and firsts[part + 1] <= position:
                part += 1
            available = (firsts[part] + survivors[part]) - position
            take = min(available, end - position)
            if take > 0:
                slices.append((parts[part], position - firsts[part], take))
                position += take
            else:
                part += 1
        shards.append(StagingShard(cut.name, tuple(slices)))
    return shards


class SpillReader:
    """One partition's ingest spill, read at offsets: mapped into memory locally (no copy through
    Python objects; spills are only ever replaced by a rename, so a mapping stays valid), ranged
    reads of one open file on an object store."""

    def __init__(self, store: Store, part: int):
        self.name, self.file, self.view = spill_path(part), None, memoryview(b"")
        if store.remote:
            self.file = store.open(self.name)
            return
        with open(store.path(self.name), "rb") as f:
            if os.fstat(f.fileno()).st_size:  # an empty file cannot be mapped
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                mapped.madvise(mmap.MADV_SEQUENTIAL)
                self.view = memoryview(mapped)  # the mapping lives while any slice of it does

    def read(self, offset: int, size: int) -> bytes | memoryview:
        if self.file is None:
            return self.view[offset:offset + size]
        self.file.seek(offset)
        return self.file.read(size)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def spilled_bytes(store: Store, records: Iterable[dict[str, Any]]) -> Iterator[bytes | memoryview]:
    """Each record's image bytes from its partition's ingest spill, in order (each spill is read
    forward); bytes that fail the checksum ingest recorded raise: they are not what ingest hashed."""
    part, spill = None, None
    try:
        for r in records:
            if r["part"] != part:
                if spill is not None:
                    spill.close()
                part, spill = r["part"], SpillReader(store, r["part"])
            data = spill.read(r["spill_offset"], r["bytes"]) if r["spill_offset"] >= 0 else b""
            if r["spill_offset"] < 0 or len(data) != r["bytes"]:
                raise RuntimeError(f"{spill_path(part)}: no {r['bytes']} bytes at {r['spill_offset']} for key "
                                   f"{r['key']} (spill incomplete; rerun ingest by removing its marker)")
            if xxhash.xxh3_64_intdigest(data) != r["spill_xxh3"]:
                raise RuntimeError(f"spill of part {part} does not hold the bytes ingest hashed for key {r['key']} "
                                   f"({r['bytes']} bytes at {r['spill_offset']} fail their XXH3 checksum; "
                                   "rerun ingest by removing its marker)")
            yield data
    finally:
        if spill is not None:
            spill.close()


def to_sample(record: dict[str, Any], image: bytes | memoryview) -> Sample:
    """The staged sample; ``image`` must be the bytes ingest hashed (its SHA-256 goes to the index)."""
    return Sample(record["key"], {record["ext"]: image, "txt": (record.get("caption") or "").encode(),
                                  "json": sample_json(record)}, digests={record["ext"]: record["sha256"]})


# What a staging shard's output depends on, per record: every field written to its tar or
# records file, and where the bytes came from.
CONTENT_FIELDS = (*SAMPLE_JSON_FIELDS, "caption", "ext", "bytes", "part", "row", "source_path", "source_offset")
# The columns of the resolved rows staging reads: those, the records file's and where the spill holds the bytes.
STAGING_COLUMNS = list(dict.fromkeys((*CONTENT_FIELDS, *STAGING_RECORDS_SCHEMA.names, "spill_offset", "spill_xxh3")))


def shard_table(store: Store, shard: StagingShard) -> pa.Table:
    """The shard's records: the kept rows of each partition slice, in order (:data:`STAGING_COLUMNS`)."""
    tables = []
    for part, skip, take in shard.slices:
        with store.open(resolved_path(part)) as f:  # ParquetFile: a third of read_table's fixed cost
            rows = pq.ParquetFile(f).read(columns=["status", *STAGING_COLUMNS], use_threads=False)
        tables.append(rows.filter(pc.equal(rows["status"], Status.KEPT.value)).slice(skip, take).drop_columns("status"))
    schema = pa.schema([RESOLVED_SCHEMA.field(c) for c in STAGING_COLUMNS])
    return pa.concat_tables(tables) if tables else schema.empty_table()


def shard_records(store: Store, shard: StagingShard) -> list[dict[str, Any]]:
    return shard_table(store, shard).to_pylist()


def images_digest(records: list[dict[str, Any]]) -> str:
    """What the feature stage reads of a shard: its images' keys, bytes (by hash) and order."""
    return fingerprint([(r["key"], r["sha256"], r["ext"]) for r in records])


def staging_key(table: pa.Table) -> str:
    """A staging shard's fingerprint from its records (the run and ``corpusforge plan`` share it)."""
    content = list(zip(*(table[c].to_pylist() for c in CONTENT_FIELDS)))  # rows, as JSON arrays
    return unit_fingerprint("staging", code_version("tasks.staging.stage"), None, content)


def slices_key(store: Store, shard: StagingShard) -> str:
    """What fixes a shard's records without reading them: the code version, its slices and
    the digest of each resolved partition they come from (markers only)."""
    digests = [require_marker(store, resolved_path(part), "resolved partition").digest for part, _, _ in shard.slices]
    return fingerprint(["staging-slices", code_version("tasks.staging.stage"), shard.slices, digests])


def write_staging_shard(store: Store, shard: StagingShard) -> UnitResult:
    """Write one staging shard: tar, index and records file fsynced together, then the marker.
    Current when its marker's ``info.slices`` matches (:func:`slices_key`), before any table is read."""
    slices = slices_key(store, shard)
    tar = staging_tar(shard.name)
    marker = read_marker(store, tar)
    if marker is not None and marker.info.get("slices") == slices:
        return UnitResult.of(marker, SKIPPED)
    must_compute()
    table = shard_table(store, shard)
    fp = staging_key(table)
    if marker is not None and marker.fingerprint == fp:  # same records from changed partitions
        return UnitResult.of(finish_unit(store, tar, fp, marker.outputs, {**marker.info, "slices": slices}), SKIPPED)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        records = table.to_pylist()

        def samples() -> Iterator[Sample]:
            for i, (r, data) in enumerate(zip(records, spilled_bytes(store, records), strict=True)):
                if i == 1:
                    fault_point("staging.write", shard.name)  # tests only: off unless CORPUSFORGE_FAULT
                yield to_sample(r, data)

        tar, index, listing = staging_tar(shard.name), staging_index(shard.name), staging_records(shard.name)
        with store.atomic_writes(tar, index, listing) as (tar_file, index_file, listing_file):
            # the spill check raises inside: then nothing is written
            result = write_tar(tar_file, samples(), sync_ahead=store.durable)
            index_bytes = parquet_bytes(result.index)
            listing_bytes = parquet_bytes(table.select(STAGING_RECORDS_SCHEMA.names).cast(STAGING_RECORDS_SCHEMA))
            index_file.write(index_bytes)
            listing_file.write(listing_bytes)
        outputs = {tar: result.sha256, index: sha256_bytes(index_bytes), listing: sha256_bytes(listing_bytes)}
        return outputs, {"shard": shard.name, "count": result.count, "bytes": result.bytes,
                         "images": images_digest(records), "slices": slices}

    return run_unit(store, tar, fp, compute)


WRITE_STAGING_SHARD = Unit(write_staging_shard, "write-staging-shard", probe=True)
