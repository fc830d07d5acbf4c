"""The manifest: one row per input record with its fate and the reason.

``manifest/part-{part}.parquet`` per ingest partition, rows in input order, schema
:data:`corpusforge.records.MANIFEST_SCHEMA`; read the whole with
``pyarrow.dataset.dataset("OUT/manifest")``. Each part joins the partition's resolved
ingest rows with the facts decided after staging (``work/late``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from corpusforge.records import MANIFEST_SCHEMA
from corpusforge.storage import Store

LATE_FIELDS = ("staging_shard", "duplicate_of", "component_id", "component_size", "max_similarity",
               "split", "shard", "tier")


def manifest_path(part: int) -> str:
    return f"manifest/part-{part:06d}.parquet"


def write_manifest_part(store: Store, part: int, source: Store | None = None) -> dict[str, Any]:
    """Write one manifest part; return its counts by status and by reason code.

    The partition's resolved ingest rows come from ``source`` (default ``store``; the
    earlier version's root when a near-dedup pass writes a new version)."""
    rows = (source or store).read_parquet(f"work/resolved/{part:06d}.parquet").to_pylist()
    late_rel = f"work/late/{part:06d}.parquet"
    late = {r["row"]: r for r in store.read_parquet(late_rel).to_pylist()} if store.exists(late_rel) else {}
    for r in rows:
        facts = late.get(r["row"])
        if facts is None:
            continue
        r.update({f: facts[f] for f in LATE_FIELDS if facts[f] is not None})
        if facts["status"] != r["status"]:
            r["status"], r["reason"] = facts["status"], facts["reason"]
    sha = store.write_parquet(manifest_path(part), pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA))
    return {"part": part, "sha256": sha, "rows": len(rows),
            "by_status": dict(Counter(r["status"] for r in rows)),
            "by_reason": dict(Counter(_outcome(r) for r in rows))}


def _outcome(row: dict[str, Any]) -> str:
    """``status/reason-code``, or just the status when there is no reason (kept)."""
    code = (row["reason"] or "").split(":", 1)[0]
    return f"{row['status']}/{code}" if code else row["status"]
