"""The manifest: one row per input record with its fate and the reason.

``manifest/part-{part}.parquet`` per ingest partition, rows in input order, schema
:data:`corpusforge.layout.MANIFEST_SCHEMA`; read the whole with
``pyarrow.dataset.dataset("OUT/manifest")``. Each part joins the partition's resolved
ingest rows with the facts decided after staging (``work/late``). Every ``kept`` row
must have a split and a release shard: a part that would say otherwise is an error.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, TypedDict

import pyarrow as pa

from corpusforge.contract import UnitResult, run_unit, unit_fingerprint
from corpusforge.layout import MANIFEST_SCHEMA, manifest_path
from tasks.ingest.files import resolved_path
from tasks.release.files import LATE_SCHEMA, late_path
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.version import code_version

# The late facts a manifest row takes (its status and reason only when they changed).
LATE_FIELDS = tuple(f for f in LATE_SCHEMA.names if f not in ("row", "status", "reason"))


class ManifestPartInfo(TypedDict):
    """A manifest part's marker info: its rows, counted by status and by ``status/reason-code``."""

    part: int
    rows: int
    by_status: dict[str, int]
    by_reason: dict[str, int]


def write_manifest_part(store: Store, part: int, resolved_digest: str, late_digest: str | None,
                        source: Store | None = None) -> UnitResult[ManifestPartInfo]:
    """Write one manifest part; the marker's info has its counts by status and by reason code.

    The partition's resolved ingest rows come from ``source`` (default ``store``; the
    earlier version's root when a near-dedup pass writes a new version)."""
    def compute() -> tuple[dict[str, str], ManifestPartInfo]:
        rows = (source or store).read_parquet(resolved_path(part)).to_pylist()
        late = {r["row"]: r for r in store.read_parquet(late_path(part)).to_pylist()} if late_digest else {}
        for r in rows:
            facts = late.get(r["row"])
            if facts is not None:
                r.update({f: facts[f] for f in LATE_FIELDS if facts[f] is not None})
                if facts["status"] != r["status"]:
                    r["status"], r["reason"] = facts["status"], facts["reason"]
            if r["status"] == Status.KEPT.value and not (r.get("split") and r.get("shard")):
                raise ValueError(f"manifest part {part}: kept record {r['key']} has no split or release shard "
                                 "(staged without a release decision)")
        sha = store.write_parquet(manifest_path(part), pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA))
        return {manifest_path(part): sha}, ManifestPartInfo(part=part, rows=len(rows),
                                                            by_status=dict(Counter(r["status"] for r in rows)),
                                                            by_reason=dict(Counter(_outcome(r) for r in rows)))

    fp = unit_fingerprint("manifest", code_version(__name__), None, [resolved_digest, late_digest])
    return run_unit(store, manifest_path(part), fp, compute)


def _outcome(row: dict[str, Any]) -> str:
    """``status/reason-code``, or just the status when there is no reason (kept)."""
    code = (row["reason"] or "").split(":", 1)[0]
    return f"{row['status']}/{code}" if code else row["status"]
