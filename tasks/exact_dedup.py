"""Key uniqueness and exact deduplication by SHA-256, bucket by bucket.

Both checks are group-bys over the whole corpus. Ingest wrote, per partition, small
tables already split into hash buckets (``work/keys``, ``work/hashes``); one task per
bucket reads only its bucket from every partition, so no process ever sees more than
1/n_buckets of the corpus's hashes. Decisions go to ``work/keydup/{bucket}`` and
``work/exact/{bucket}``; :func:`resolve_partition` folds them back into each
partition's rows (``work/resolved/{part}``), the base of the manifest.

Rules: the first record of a key in input order keeps it, later ones are errors
(``duplicate_key``). Among byte-identical images the highest-resolution copy is kept,
ties broken by the smallest key; the others become ``exact_duplicate`` of it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corpusforge.chunking import cut_name
from corpusforge.contract import run_unit, unit_fingerprint
from corpusforge.hashing import stable_int
from corpusforge.layout import (DUPLICATE_SCHEMA, EXACT_DIR, HASH_SCHEMA, HASHES_DIR, KEY_SCHEMA, KEYDUP_DIR, KEYS_DIR,
                                RESOLVED_SCHEMA, exact_path, hashes_path, ingest_path, keydup_path, keys_table_path,
                                resolved_path)
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.tarshard import is_safe_key
from corpusforge.version import code_version


def _code() -> str:
    return code_version("tasks.exact_dedup")


def write_dedup_tables(store: Store, part: int, records: list[dict[str, Any]], n_buckets: int) -> dict[str, str]:
    """Write a partition's hash rows (its kept records) and key rows (every safe key), each
    sorted by bucket, as ingest leaves them for this stage; return their SHA-256s."""
    hashes = sorted(
        ({"bucket": stable_int(0, r["sha256"], n_buckets), "sha256": r["sha256"], "key": r["key"],
          "part": r["part"], "row": r["row"], "pixels": int(r["width"]) * int(r["height"])}
         for r in records if r["status"] == Status.KEPT.value),
        key=lambda r: (r["bucket"], r["sha256"], r["row"]))
    keys = sorted(
        ({"bucket": stable_int(0, r["key"], n_buckets), "key": r["key"], "part": r["part"], "row": r["row"]}
         for r in records if r["key"] and is_safe_key(r["key"])),
        key=lambda r: (r["bucket"], r["key"], r["row"]))
    return {hashes_path(part): store.write_parquet(hashes_path(part), pa.Table.from_pylist(hashes, schema=HASH_SCHEMA)),
            keys_table_path(part): store.write_parquet(keys_table_path(part),
                                                       pa.Table.from_pylist(keys, schema=KEY_SCHEMA))}


def _bucket_rows(store: Store, folder: str, bucket: int) -> pa.Table:
    return store.dataset(folder).to_table(filter=pc.field("bucket") == bucket)


def _write_decisions(store: Store, rel: str, rows: list[dict[str, Any]]) -> dict[str, str]:
    rows.sort(key=lambda r: (r["part"], r["row"]))
    return {rel: store.write_parquet(rel, pa.Table.from_pylist(rows, schema=DUPLICATE_SCHEMA))}


def find_duplicate_keys(store: Store, bucket: int, keys_digests: list[str]) -> dict[str, Any]:
    """Records reusing a key seen earlier in input order (``keys_digests``: every partition's
    ``work/keys`` digest, the inputs this bucket reads)."""
    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        table = _bucket_rows(store, KEYS_DIR, bucket).to_pylist()
        table.sort(key=lambda r: (r["key"], r["part"], r["row"]))
        decisions, previous = [], None
        for r in table:
            if previous is not None and previous["key"] == r["key"]:
                decisions.append({"part": r["part"], "row": r["row"], "duplicate_of": r["key"]})
            else:
                previous = r
        return _write_decisions(store, keydup_path(bucket), decisions), {"duplicates": len(decisions)}

    fp = unit_fingerprint("duplicate-keys", _code(), bucket, keys_digests)
    return run_unit(store, keydup_path(bucket), fp, compute)


def _rows_in(store: Store, folder: str) -> set[tuple[int, int]]:
    if not store.listdir(folder):
        return set()
    t = store.dataset(folder).to_table(columns=["part", "row"])
    return set(zip(t["part"].to_pylist(), t["row"].to_pylist(), strict=True))


def find_exact_duplicates(store: Store, bucket: int, hashes_digests: list[str],
                          keydup_digests: list[str]) -> dict[str, Any]:
    """Byte-identical images in one hash bucket (records with a reused key take no part)."""
    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        bad_keys = _rows_in(store, KEYDUP_DIR)
        rows = [r for r in _bucket_rows(store, HASHES_DIR, bucket).to_pylist()
                if (r["part"], r["row"]) not in bad_keys]
        by_hash: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_hash.setdefault(r["sha256"], []).append(r)
        decisions = []
        for group in by_hash.values():
            if len(group) < 2:
                continue
            winner = min(group, key=lambda r: (-r["pixels"], r["key"]))
            decisions += [{"part": r["part"], "row": r["row"], "duplicate_of": winner["key"]}
                          for r in group if r is not winner]
        return _write_decisions(store, exact_path(bucket), decisions), {"duplicates": len(decisions)}

    fp = unit_fingerprint("exact-duplicates", _code(), bucket, [hashes_digests, keydup_digests])
    return run_unit(store, exact_path(bucket), fp, compute)


def _decisions_for(store: Store, folder: str, part: int) -> dict[int, str]:
    if not store.listdir(folder):
        return {}
    t = store.dataset(folder).to_table(filter=pc.field("part") == part)
    return dict(zip(t["row"].to_pylist(), t["duplicate_of"].to_pylist(), strict=True))


def resolve_partition(store: Store, part: int, ingest_digest: str, decision_digests: list[str],
                      shard_size: int) -> dict[str, Any]:
    """Fold key and exact-duplicate decisions into a partition's rows.

    The marker's info gives the staging planner what it needs without reading rows: the
    number of surviving records (valid, unique key, not a duplicate) and the staging cut
    candidates among them (:mod:`corpusforge.chunking`), as (position, name).
    """
    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        rows = store.read_parquet(ingest_path(part)).to_pylist()
        dup_keys = _decisions_for(store, KEYDUP_DIR, part)
        dup_bytes = _decisions_for(store, EXACT_DIR, part)
        survivors = 0
        candidates = []
        for r in rows:
            r["duplicate_of"] = None
            if r["row"] in dup_keys:
                r["status"], r["reason"] = Status.ERROR.value, f"duplicate_key: {r['key']} appeared earlier in the input"
            elif r["row"] in dup_bytes:
                r["status"], r["reason"] = Status.EXACT_DUPLICATE.value, "sha256_match"
                r["duplicate_of"] = dup_bytes[r["row"]]
            if r["status"] == Status.KEPT.value:
                if (name := cut_name(r["key"], shard_size)) is not None:
                    candidates.append([survivors, name])
                survivors += 1
        rel = resolved_path(part)
        sha = store.write_parquet(rel, pa.Table.from_pylist(rows, schema=RESOLVED_SCHEMA))
        return {rel: sha}, {"part": part, "survivors": survivors, "candidates": candidates}

    fp = unit_fingerprint("resolve", _code(), shard_size, [ingest_digest, decision_digests])
    return run_unit(store, resolved_path(part), fp, compute)
