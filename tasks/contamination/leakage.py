"""Cross-split leakage: held-out images (val, test) with a near-duplicate among training images.

Per held-out staging shard one unit writes the pairs at or above the review threshold and
counts, per threshold and split, the held-out images whose best training match is at or above
it (``>=``: the graph's edge rule, so the build's own threshold reads as the build reads it).
For a corpus built here the count at the build's graph threshold is 0 by construction (no
near-duplicate component straddles two splits) and is measured anyway: a non-zero count means
the build's index missed pairs or the splits were edited.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from corpusforge.contract import UnitResult, require_marker, run_unit, unit_fingerprint
from tasks.contamination.files import LEAKAGE_SCHEMA, found_matches_path, leakage_path
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.contamination.image_rates import rate
from tasks.contamination.selection import read_selection


def _key(t: float) -> str:
    return f"{t:.6g}"


def leakage_rows(out: Store, scan: str, selection: str, shard: str, thresholds: Sequence[float],
                 review_threshold: float) -> UnitResult:
    """Pairs >= review threshold and per-threshold counts of one held-out shard."""
    found = found_matches_path(scan, shard)
    fp = unit_fingerprint("contamination-leakage", code_version(__name__),
                          [sorted(thresholds), review_threshold, selection],
                          require_marker(out, found, "leakage scan").digest)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        split_of = read_selection(out, selection, shard)
        t = out.read_parquet(found)
        best: dict[str, float] = {}
        rows = {n: [] for n in LEAKAGE_SCHEMA.names}
        for q, rank, tshard, tkey, s in zip(t["query_key"].to_pylist(), t["rank"].to_pylist(),
                                            t["target_shard"].to_pylist(), t["target_key"].to_pylist(),
                                            t["similarity"].to_pylist(), strict=True):
            best[q] = max(best.get(q, float("-inf")), s)
            if s >= review_threshold:
                for n, v in zip(LEAKAGE_SCHEMA.names, (q, split_of.get(q), rank, tkey, tshard, s), strict=True):
                    rows[n].append(v)
        held = Counter(split_of.values())
        leaking = {_key(th): {} for th in thresholds}
        for q, split in split_of.items():
            for th in thresholds:
                if best.get(q, float("-inf")) >= th:
                    leaking[_key(th)][split] = leaking[_key(th)].get(split, 0) + 1
        rel = leakage_path(shard)
        info = {"held_out": dict(sorted(held.items())), "leaking": leaking, "pairs": len(rows["rank"])}
        return {rel: out.write_parquet(rel, pa.table(rows, schema=LEAKAGE_SCHEMA))}, info

    return run_unit(out, leakage_path(shard), fp, compute)


def summarize_leakage(markers: Sequence[UnitResult], thresholds: Sequence[float], review_threshold: float,
                      source: dict[str, Any]) -> dict[str, Any]:
    """Rates per threshold and split over every held-out shard."""
    held: Counter[str] = Counter()
    for m in markers:
        held.update(m.info["held_out"])
    table = []
    for th in thresholds:
        per_split = {}
        for split in sorted(held):
            n = sum(m.info["leaking"][_key(th)].get(split, 0) for m in markers)
            per_split[split] = {"leaking": n, "held_out": held[split], "rate": rate(n, held[split])}
        total = sum(v["leaking"] for v in per_split.values())
        table.append({"threshold": th, "comparison": "best similarity >= threshold", "leaking": total,
                      "held_out": sum(held.values()), "rate": rate(total, sum(held.values())),
                      "splits": per_split})
    return {**source, "review_threshold": review_threshold, "held_out": dict(sorted(held.items())),
            "rates": table, "pairs_at_review_threshold": sum(m.info["pairs"] for m in markers)}
