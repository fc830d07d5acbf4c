"""What prompt qualification writes: its tables' schemas, the files under ``qualification/``
and ``prompt_edition/``, and the receipt's threshold and seed sections.

Every file is written from rows the signals and the rotation computed; nothing here
decides anything, so the files of one run are byte-identical to a fresh run's."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from tasks.prompts.files import (GENERATED_VARIANCE_SCHEMA, PROMPT_EDITION_MAPPING, PROMPT_EDITION_META,
                                 PROMPT_EDITION_NORMALIZATION, PROMPT_EDITION_PROMPTS, QUALIFICATION_CATEGORIES,
                                 QUALIFICATION_COHORTS, QUALIFICATION_PROMPTS, QUALIFICATION_SUMMARY,
                                 QUALIFICATION_VARIANCE, QUARANTINE_LEDGER)
from corpusforge.storage import Store
from tasks.prompts.config import CohortConfig, DensityConfig, RotationConfig, VarianceConfig

PROMPT_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("row", pa.int64()), ("cohort", pa.string()), ("category", pa.string()),
    ("category_source", pa.string()), ("anchor", pa.bool_()), ("status", pa.string()), ("reason", pa.string()),
    ("density_score", pa.float64()), ("density_flagged", pa.bool_()), ("variance_flags", pa.string()),
    ("n_variance_flags", pa.int32()), ("strong", pa.bool_()), ("decision", pa.string()), ("rules", pa.string()),
])
LEDGER_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("row", pa.int64()), ("text", pa.string()), ("cohort", pa.string()),
    ("anchor", pa.bool_()), ("strong", pa.bool_()), ("n_variance_flags", pa.int32()), ("rules", pa.string()),
    ("evidence", pa.string()), ("fate", pa.string()),
])
EDITION_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("text", pa.string()), ("cohort", pa.string()), ("category", pa.string()),
    ("difficulty", pa.string()), ("anchor", pa.bool_()), ("origin", pa.string()),
])
MAPPING_SCHEMA = pa.schema([("previous_id", pa.string()), ("row", pa.int64()), ("new_id", pa.string()),
                            ("status", pa.string()),
                            ("reason", pa.string())])
COHORT_SCHEMA = pa.schema([
    ("model", pa.string()), ("n_old", pa.int64()), ("n_new", pa.int64()), ("mean_old", pa.float64()),
    ("mean_new", pa.float64()), ("raw_divergence", pa.float64()), ("divergence", pa.float64()),
    ("interval_low", pa.float64()), ("interval_high", pa.float64()), ("strata_used", pa.int32()),
    ("strata_dropped", pa.int32()), ("flagged", pa.bool_()),
])
def tally(values: Iterable[str]) -> dict[str, int]:
    """How often each value occurs, sorted by value (the summary's counts)."""
    return dict(sorted(Counter(values).items()))


def write_outputs(out: Store, prompts: list[dict[str, Any]], variance_rows: list[dict[str, Any]],
                  results: dict[str, Any], category_rows: list[dict[str, Any]], ledger: list[dict[str, Any]],
                  edition_rows: list[dict[str, Any]], mapping: list[dict[str, Any]], normalization: dict[str, Any],
                  edition: str, previous_sha256: str) -> None:
    """Every table and JSON file of a run; a table a signal did not produce is removed."""
    out.write_parquet(QUALIFICATION_PROMPTS, pa.Table.from_pylist([{
        **{k: p.get(k) for k in ("prompt_id", "row", "cohort", "category", "category_source", "anchor", "status",
                                 "reason", "n_variance_flags", "strong", "decision")},
        "density_score": (p.get("density") or {}).get("score"),
        "density_flagged": (p.get("density") or {}).get("flagged"),
        "variance_flags": json.dumps(sorted(m for m, v in (p.get("variance") or {}).items() if v["flagged"])),
        "rules": json.dumps(p["rules"])} for p in prompts], schema=PROMPT_SCHEMA))
    _write_or_remove(out, QUALIFICATION_VARIANCE, variance_rows, GENERATED_VARIANCE_SCHEMA)
    _write_or_remove(out, QUALIFICATION_COHORTS, [{
        **{k: v for k, v in m.items() if k != "interval"},
        "interval_low": m["interval"][0] if m["interval"] else None,
        "interval_high": m["interval"][1] if m["interval"] else None}
        for m in (results.get("cohorts") or {}).get("models") or []], COHORT_SCHEMA)
    _write_or_remove(out, QUALIFICATION_CATEGORIES, category_rows)
    out.write_parquet(QUARANTINE_LEDGER, pa.Table.from_pylist(ledger, schema=LEDGER_SCHEMA))
    out.write_parquet(PROMPT_EDITION_PROMPTS, pa.Table.from_pylist(edition_rows, schema=EDITION_SCHEMA))
    out.write_parquet(PROMPT_EDITION_MAPPING, pa.Table.from_pylist(mapping, schema=MAPPING_SCHEMA))
    out.write_json(PROMPT_EDITION_NORMALIZATION, normalization)
    out.write_json(PROMPT_EDITION_META, {"edition": edition, "previous_prompt_table_sha256": previous_sha256,
                                         "prompts": len(edition_rows), "rotation": results["rotation"]})
    out.write_json(QUALIFICATION_SUMMARY, results)


def _write_or_remove(out: Store, rel: str, rows: list[dict[str, Any]], schema: pa.Schema | None = None) -> None:
    """A table a signal produced, or no file where it produced none (a stale one would mislead)."""
    if rows:
        out.write_parquet(rel, pa.Table.from_pylist(rows, schema=schema))
    else:
        out.remove(rel)


def thresholds(density: DensityConfig | None, variance: VarianceConfig | None, cohorts: CohortConfig | None,
               rotation: RotationConfig) -> dict[str, Any]:
    """Every threshold of the signals run, with its comparison."""
    t: dict[str, Any] = {}
    if density:
        d = density
        t["density"] = ({"mode": "direct", "k": d.k, "reference_quantile": d.reference_quantile, "comparison": ">"}
                        if d.mode == "direct" else
                        {"mode": "taxonomy", "category_quantile": d.category_quantile, "comparison": ">="})
    if variance:
        v = variance
        t["variance"] = {"sd_threshold": v.sd_threshold, "comparison": "variance < mean - sd_threshold * sd (ddof 1)",
                         "min_images": v.min_images, "strong_min_models": v.strong_min_models}
    if cohorts:
        t["cohorts"] = {"threshold": cohorts.threshold, "comparison": ">", "confidence": cohorts.confidence}
    t["rotation"] = {"fraction": rotation.fraction}
    return t


def seeds(density: DensityConfig | None, cohorts: CohortConfig | None, rotation: RotationConfig) -> dict[str, Any]:
    """Every seed of the signals and the rotation."""
    s: dict[str, Any] = {"rotation": rotation.seed}
    if density:
        s["caption_sample"] = density.sample_seed
    if cohorts:
        s["bootstrap"] = cohorts.seed
    return s
