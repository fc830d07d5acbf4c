"""The image-only contamination rate (seed 001): flagged evaluation images over all embedded ones.

Per evaluation chunk one unit joins the items, the feature stage's per-image errors and the
scan's top-k matches into ``contamination/images/{chunk}.parquet``. ``flagged``: similarity
*strictly greater* than the threshold (the seed's ``max(clip_score) > 0.9``). Images that could
not be read or embedded are counted apart, not in the denominator. A flag says "overlap found"
between the supplied sets, nothing about any model trained on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from corpusforge.contract import UnitResult, require_marker, run_unit, unit_fingerprint
from corpusforge.feature_files import feature_marker, read_shard_errors
from tasks.contamination.files import IMAGE_ROW_SCHEMA, eval_items_path, found_matches_path, image_rows_path
from corpusforge.storage import Store
from corpusforge.version import code_version


def image_rows(out: Store, eval_store: Store, chunk: str, model_id: str, scan: str, threshold: float
               ) -> UnitResult:
    """Write one chunk's per-image rows; returns the marker (info: counts)."""
    has_features = feature_marker(eval_store, model_id, chunk) is not None
    found = found_matches_path(scan, chunk)
    inputs = [require_marker(out, eval_items_path(chunk), "evaluation items").digest,
              require_marker(out, found, "image scan").digest if has_features else None]
    fp = unit_fingerprint("contamination-image-rows", code_version(__name__), [model_id, threshold], inputs)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        items = out.read_parquet(eval_items_path(chunk)).to_pylist()
        errors = read_shard_errors(eval_store, model_id, chunk) if has_features else {}
        matches: dict[str, list[tuple[str, str, str, float]]] = {}
        if has_features:
            t = out.read_parquet(found)
            for q, shard, key, sha, s in zip(t["query_key"].to_pylist(), t["target_shard"].to_pylist(),
                                             t["target_key"].to_pylist(), t["target_sha256"].to_pylist(),
                                             t["similarity"].to_pylist(), strict=True):
                matches.setdefault(q, []).append((shard, key, sha, s))
        rows = []
        for item in items:
            row = {"item_id": item["item_id"], "key": item["key"], "image_sha256": item["image_sha256"],
                   "status": "embedded", "error": None, "max_similarity": None, "match_key": None,
                   "match_shard": None, "match_sha256": None, "exact_copy": None, "flagged": None, "matches": None}
            if item["image_sha256"] is None:
                row["status"] = "image_error" if item["image_error"] else "no_image"
                row["error"] = item["image_error"]
            elif item["key"] in errors or not has_features:
                row["status"], row["error"] = "image_error", errors.get(item["key"], "not embedded")
            else:
                found_rows = matches.get(item["key"], [])
                if found_rows:
                    shard, key, sha, s = found_rows[0]
                    row.update(max_similarity=s, match_key=key, match_shard=shard, match_sha256=sha,
                               exact_copy=sha == item["image_sha256"])
                row["flagged"] = bool(found_rows) and found_rows[0][3] > threshold
                row["matches"] = json.dumps([[k, round(float(s), 6)] for _, k, _, s in found_rows])
            rows.append(row)
        table = pa.Table.from_pylist(rows, schema=IMAGE_ROW_SCHEMA)
        rel = image_rows_path(chunk)
        return {rel: out.write_parquet(rel, table)}, count_rows(rows)

    return run_unit(out, image_rows_path(chunk), fp, compute)


def count_rows(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts = {"items": 0, "embedded": 0, "flagged": 0, "exact_copies": 0, "image_errors": 0, "no_image": 0}
    for r in rows:
        counts["items"] += 1
        if r["status"] == "embedded":
            counts["embedded"] += 1
            counts["flagged"] += bool(r["flagged"])
            counts["exact_copies"] += bool(r["exact_copy"])
        elif r["status"] == "image_error":
            counts["image_errors"] += 1
        else:
            counts["no_image"] += 1
    return counts


def rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def rate_curve(similarities: Sequence[float | None], thresholds: Sequence[float]) -> list[dict[str, Any]]:
    """Flagged count and rate at each threshold (strictly greater), over embedded images."""
    embedded = [s for s in similarities if s is not None]
    flagged = [(t, sum(1 for s in embedded if s > t)) for t in thresholds]
    return [{"threshold": t, "flagged": n, "embedded": len(embedded), "rate": rate(n, len(embedded))}
            for t, n in flagged]


def summarize_images(out: Store, chunks: Sequence[str], threshold: float, curve: Sequence[float], top_pairs: int,
                     ) -> dict[str, Any]:
    """Totals, the rate, the curve and the highest-similarity pairs over all chunks."""
    counts = count_rows([])
    sims: list[float | None] = []
    pairs: list[dict[str, Any]] = []
    for chunk in chunks:
        rows = out.read_parquet(image_rows_path(chunk)).to_pylist()
        for k, v in count_rows(rows).items():
            counts[k] += v
        for r in rows:
            if r["status"] == "embedded":
                sims.append(r["max_similarity"] if r["max_similarity"] is not None else float("-inf"))
                if r["match_key"] is not None:
                    pairs.append({k: r[k] for k in ("item_id", "key", "match_key", "match_shard", "max_similarity",
                                                    "exact_copy", "flagged")} | {"chunk": chunk})
    pairs.sort(key=lambda p: (-p["max_similarity"], p["item_id"]))
    return {"threshold": threshold, "comparison": "similarity > threshold", **counts,
            "rate": rate(counts["flagged"], counts["embedded"]),
            "curve": rate_curve(sims, curve), "top_pairs": pairs[:top_pairs]}
