"""Ingest one partition: read each record's bytes once, hash, validate, keep no bytes.

Output per partition (written atomically, marker last):

* ``work/ingest/{part}.parquet`` — one row per input record in input order
  (:data:`corpusforge.records.INGEST_SCHEMA`), status ``kept`` (so far), ``filtered``
  or ``error`` with a reason;
* ``work/hashes/{part}.parquet`` and ``work/keys/{part}.parquet`` — the small
  bucketed tables that exact deduplication and the key-uniqueness check read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.hashing import fingerprint, stable_int
from corpusforge.records import INGEST_SCHEMA, Status
from corpusforge.storage import Store
from corpusforge.tarshard import is_safe_key, iter_tar_samples
from tasks.sources import IMAGE_EXTS, METADATA_COLUMNS, Partition, SourceConfig, resolve_path
from tasks.validate import ValidationConfig, validate_image

HASH_SCHEMA = pa.schema([("bucket", pa.int32()), ("sha256", pa.string()), ("key", pa.string()),
                         ("part", pa.int32()), ("row", pa.int32()), ("pixels", pa.int64())])
KEY_SCHEMA = pa.schema([("bucket", pa.int32()), ("key", pa.string()),
                        ("part", pa.int32()), ("row", pa.int32())])


def ingest_path(part: int) -> str:
    return f"work/ingest/{part:06d}.parquet"


def derived_key(locator: str) -> str:
    """A safe key for a record that has none: a hash of where it came from."""
    return "k" + hashlib.sha256(locator.encode()).hexdigest()[:20]


def _blank(part: int, row: int) -> dict[str, Any]:
    record = {name: None for name in INGEST_SCHEMA.names}
    record.update(part=part, row=row, source_offset=-1, status=Status.ERROR.value, reason="")
    return record


def _judge(record: dict[str, Any], data: bytes, cfg: ValidationConfig, scores: dict[str, Any]) -> None:
    """Fill hash, size and validation facts of ``record`` from its bytes."""
    verdict = validate_image(data, cfg, scores)
    whole = len(data) <= cfg.max_bytes  # an oversized file was read only up to the limit
    record.update(sha256=hashlib.sha256(data).hexdigest() if whole else None,
                  bytes=len(data) if whole else None, status=verdict.status.value,
                  reason=verdict.reason, format=verdict.format, ext=verdict.ext,
                  width=verdict.width, height=verdict.height)


def _row_records(part: Partition, src: SourceConfig, val: ValidationConfig) -> Iterator[dict[str, Any]]:
    with fsspec.open(part.uri, "rb", **src.storage_options) as f:
        rows = pq.read_table(f).to_pylist()
    for i, meta in enumerate(rows):
        record = _blank(part.index, i)
        record.update({c: meta.get(c) for c in METADATA_COLUMNS})
        raw_path = meta.get("path") or ""
        record["source_path"] = raw_path
        record["key"] = meta.get("key") or derived_key(raw_path)
        extra = json.loads(meta["extra"]) if meta.get("extra") else {}
        location = resolve_path(part.base, raw_path)
        if not is_safe_key(record["key"]):
            record["reason"] = f"unsafe_key: {record['key']!r}"
        elif location is None:
            record["reason"] = f"unsafe_path: {raw_path!r}"
        else:
            record["source_path"] = location
            try:
                with fsspec.open(location, "rb", **src.storage_options) as f:
                    data = f.read(val.max_bytes + 1)
            except FileNotFoundError:
                record["reason"] = f"missing_file: {raw_path}"
            except (OSError, ValueError) as exc:
                record["reason"] = f"read_error: {type(exc).__name__}: {exc}"
            else:
                _judge(record, data, val, extra)
        yield record


def _tar_records(part: Partition, src: SourceConfig, val: ValidationConfig) -> Iterator[dict[str, Any]]:
    with fsspec.open(part.uri, "rb", **src.storage_options) as f:
        for i, sample in enumerate(iter_tar_samples(f)):
            record = _blank(part.index, i)
            record["source_path"] = f"{part.uri}#{sample.key}"
            meta: dict[str, Any] = {}
            if "json" in sample.members:
                try:
                    loaded = json.loads(sample.members["json"])
                    meta = loaded if isinstance(loaded, dict) else {}
                except (json.JSONDecodeError, UnicodeDecodeError):
                    meta = {}
            key = meta.get("key") if isinstance(meta.get("key"), str) else sample.key.rsplit("/", 1)[-1]
            record["key"] = key
            record.update({c: str(meta[c]) for c in METADATA_COLUMNS[1:] if meta.get(c) is not None})
            if "txt" in sample.members:
                record["caption"] = sample.members["txt"].decode("utf-8", "replace").strip()
            image_exts = sorted(e for e in sample.members if e in IMAGE_EXTS)
            if sample.error is not None:
                record["key"] = derived_key(record["source_path"])  # the name itself is not usable
                record["reason"] = f"unsafe_name: {sample.error.reason}" if "unsafe" in sample.error.reason \
                    else f"read_error: {sample.error.reason}"
            elif not is_safe_key(key):
                record["reason"] = f"unsafe_key: {key!r}"
            elif not image_exts:
                record["reason"] = f"no_image_member: members {sorted(sample.members)}"
            else:
                ext = image_exts[0]
                record["source_path"] = f"{part.uri}#{sample.key}.{ext}"
                record["source_offset"] = sample.offsets[ext]
                _judge(record, sample.members[ext], val, meta)
            yield record


def ingest_partition(store: Store, part: Partition, src: SourceConfig, val: ValidationConfig,
                     n_buckets: int, code_version: str) -> dict[str, Any]:
    """Ingest one partition (resumable); return its counts by status."""
    rel = ingest_path(part.index)
    fp = fingerprint("ingest", part.uri, part.base, src.model_dump(), val.model_dump(), n_buckets, code_version)
    if (done := store.read_done(rel)) and done.get("fingerprint") == fp:
        return done["summary"]
    reader = _tar_records if part.kind == "tar" else _row_records
    records = list(reader(part, src, val))
    table = pa.Table.from_pylist(records, schema=INGEST_SCHEMA)
    valid = [r for r in records if r["status"] == Status.KEPT.value]
    hashes = sorted(
        ({"bucket": stable_int(0, r["sha256"], n_buckets), "sha256": r["sha256"], "key": r["key"],
          "part": r["part"], "row": r["row"], "pixels": int(r["width"]) * int(r["height"])} for r in valid),
        key=lambda r: (r["bucket"], r["sha256"], r["row"]))
    keys = sorted(
        ({"bucket": stable_int(0, r["key"], n_buckets), "key": r["key"], "part": r["part"], "row": r["row"]}
         for r in records if r["key"] and is_safe_key(r["key"])),
        key=lambda r: (r["bucket"], r["key"], r["row"]))
    store.write_parquet(f"work/hashes/{part.name}.parquet", pa.Table.from_pylist(hashes, schema=HASH_SCHEMA))
    store.write_parquet(f"work/keys/{part.name}.parquet", pa.Table.from_pylist(keys, schema=KEY_SCHEMA))
    sha = store.write_parquet(rel, table)
    summary = {"part": part.index, "records": len(records),
               "by_status": {s: sum(r["status"] == s for r in records) for s in sorted({r["status"] for r in records})}}
    store.mark_done(rel, {"fingerprint": fp, "sha256": sha, "summary": summary})
    return summary
