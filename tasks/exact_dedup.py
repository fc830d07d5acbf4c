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

from corpusforge.records import INGEST_SCHEMA, Status
from corpusforge.storage import Store
from tasks.ingest import ingest_path

DECISION_SCHEMA = pa.schema([("part", pa.int32()), ("row", pa.int32()), ("duplicate_of", pa.string())])
RESOLVED_SCHEMA = INGEST_SCHEMA.append(pa.field("duplicate_of", pa.string()))


def _bucket_rows(store: Store, folder: str, bucket: int) -> pa.Table:
    return store.dataset(folder).to_table(filter=pc.field("bucket") == bucket)


def _write_decisions(store: Store, rel: str, rows: list[dict[str, Any]]) -> int:
    rows.sort(key=lambda r: (r["part"], r["row"]))
    store.write_parquet(rel, pa.Table.from_pylist(rows, schema=DECISION_SCHEMA))
    return len(rows)


def find_duplicate_keys(store: Store, bucket: int) -> int:
    """Records reusing a key seen earlier in input order; returns how many."""
    table = _bucket_rows(store, "work/keys", bucket).to_pylist()
    table.sort(key=lambda r: (r["key"], r["part"], r["row"]))
    decisions, previous = [], None
    for r in table:
        if previous is not None and previous["key"] == r["key"]:
            decisions.append({"part": r["part"], "row": r["row"], "duplicate_of": r["key"]})
        else:
            previous = r
    return _write_decisions(store, f"work/keydup/{bucket:04d}.parquet", decisions)


def _rows_in(store: Store, folder: str) -> set[tuple[int, int]]:
    if not store.listdir(folder):
        return set()
    t = store.dataset(folder).to_table(columns=["part", "row"])
    return set(zip(t["part"].to_pylist(), t["row"].to_pylist(), strict=True))


def find_exact_duplicates(store: Store, bucket: int) -> int:
    """Byte-identical images in one hash bucket; returns how many are removed."""
    bad_keys = _rows_in(store, "work/keydup")
    rows = [r for r in _bucket_rows(store, "work/hashes", bucket).to_pylist()
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
    return _write_decisions(store, f"work/exact/{bucket:04d}.parquet", decisions)


def _decisions_for(store: Store, folder: str, part: int) -> dict[int, str]:
    if not store.listdir(folder):
        return {}
    t = store.dataset(folder).to_table(filter=pc.field("part") == part)
    return dict(zip(t["row"].to_pylist(), t["duplicate_of"].to_pylist(), strict=True))


def resolve_partition(store: Store, part: int) -> dict[str, Any]:
    """Fold key and exact-duplicate decisions into a partition's rows.

    Returns the number of surviving records (valid, unique key, not a duplicate) so the
    staging plan can number them in input order.
    """
    rows = store.read_parquet(ingest_path(part)).to_pylist()
    dup_keys = _decisions_for(store, "work/keydup", part)
    dup_bytes = _decisions_for(store, "work/exact", part)
    survivors = 0
    for r in rows:
        r["duplicate_of"] = None
        if r["row"] in dup_keys:
            r["status"], r["reason"] = Status.ERROR.value, f"duplicate_key: {r['key']} appeared earlier in the input"
        elif r["row"] in dup_bytes:
            r["status"], r["reason"] = Status.EXACT_DUPLICATE.value, "sha256_match"
            r["duplicate_of"] = dup_bytes[r["row"]]
        survivors += r["status"] == Status.KEPT.value
    store.write_parquet(f"work/resolved/{part:06d}.parquet", pa.Table.from_pylist(rows, schema=RESOLVED_SCHEMA))
    return {"part": part, "survivors": survivors}
