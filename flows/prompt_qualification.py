"""Prompt qualification for image-generation benchmarks (seed 000): three risk signals,
a quarantine ledger and an anchor-safe rotation plan.

Table of contents of :func:`qualify_prompts`:

    read the prompt set (and the pool) → per-row errors, nothing dropped silently
    → signal 1, density: sample the corpus's kept captions (1 unit) → embed them (1 task
      per staging shard) → embed prompts, pool, taxonomy → direct k-NN or taxonomy density
    → signal 2, output variance: generated images, 1 task per (model, chunk of prompts)
      → trace of covariance per (prompt, model) → per-model flags, strong cases
    → signal 3, cohort divergence: scores per (prompt, model) → stratified old − new, bootstrap
    → decisions → quarantine ledger → rotation plan → new edition + mapping → anchor normalisation
    → summary.json, receipt.json, report.md under qualification/

Reads the corpus, the prompt table, the generated images, the scores, the taxonomy and the
pool, and never writes them: an output root equal to, inside or around any of them is
refused. Every unit follows the stage contract, so a rerun redoes only what changed.

From Python: ``run_qualify_prompts(config)``; the Prefect flow is ``prompt_qualification_flow``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from corpusforge.cluster import DaskConfig, as_task, cluster_flow, run_logger, run_tasks
from corpusforge.config import FlowConfig
from corpusforge.contract import count_actions, remove_tree
from corpusforge.hashing import canonical_json, sha256_bytes
from corpusforge.layout import (GENERATED_VARIANCE_SCHEMA, PROMPT_EDITION_MAPPING, PROMPT_EDITION_META,
                                PROMPT_EDITION_NORMALIZATION, PROMPT_EDITION_PROMPTS, PROMPTS_CAPTION_SAMPLE,
                                PROMPTS_CAPTIONS, PROMPTS_GENERATED, PROMPTS_TEXTS, QUALIFICATION_CATEGORIES,
                                QUALIFICATION_COHORTS, QUALIFICATION_DIR, QUALIFICATION_PROMPTS,
                                QUALIFICATION_RECEIPT, QUALIFICATION_REPORT, QUALIFICATION_SUMMARY,
                                QUALIFICATION_VARIANCE, QUARANTINE_LEDGER, RECEIPT, generated_variance_path)
from corpusforge.storage import Store, is_remote
from corpusforge.version import code_version
from flows.preflight import overlapping
from tasks.prompts import captions, density, rotation, tables, variance
from tasks.prompts.cohorts import cohort_divergence
from tasks.prompts.config import (CohortConfig, DensityConfig, PromptSetConfig, RotationConfig, TextModelConfig,
                                  VarianceConfig)
from tasks.prompts.report import CLAIM_BOUNDARY, render_markdown
from tasks.prompts.text_model import text_model_identity
from tasks.report.receipt import redact

MODULES = ("tasks.prompts.captions", "tasks.prompts.density", "tasks.prompts.variance", "tasks.prompts.cohorts",
           "tasks.prompts.rotation", "tasks.prompts.tables", "tasks.prompts.report")


class PromptQualificationConfig(FlowConfig):
    """The prompt set, the three signals' inputs and settings, the rotation, the cluster."""

    prompts: PromptSetConfig = Field(..., title="Prompt set")
    out: str = Field(..., title="Output root",
                     description="Where work/prompts/, qualification/ and prompt_edition/ are written.")
    out_storage_options: dict[str, Any] = Field(default_factory=dict, title="Output storage options")
    corpus: str | None = Field(None, title="Training corpus root",
                               description="A corpus built by corpusforge (manifest/, staging/); read only. "
                                           "Needed by the density signal.")
    corpus_storage_options: dict[str, Any] = Field(default_factory=dict, title="Corpus storage options")
    text_model: TextModelConfig = Field(default_factory=TextModelConfig, title="Text model")
    density: DensityConfig | None = Field(default_factory=DensityConfig, title="Signal 1: category density")
    variance: VarianceConfig | None = Field(None, title="Signal 2: output variance")
    cohorts: CohortConfig | None = Field(None, title="Signal 3: cohort divergence")
    rotation: RotationConfig = Field(default_factory=RotationConfig, title="Rotation plan")
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")

    @model_validator(mode="after")
    def _density_needs_a_corpus(self) -> PromptQualificationConfig:
        if self.density is not None and not self.corpus:
            raise ValueError("the density signal needs corpus (a built corpus root); set density: null to skip it")
        return self

    def reads(self) -> list[tuple[str, str]]:
        """Everything this run reads (what its output root must stay clear of)."""
        found = [("prompt table", self.prompts.path)]
        if self.corpus:
            found.append(("corpus", self.corpus))
        if self.density and self.density.taxonomy:
            found.append(("taxonomy", self.density.taxonomy))
        if self.variance:
            found.append(("generated images", self.variance.generated))
        if self.cohorts:
            found.append(("score table", self.cohorts.scores))
        if self.rotation.pool:
            found.append(("qualification pool", self.rotation.pool))
        return found


def check_separate(config: PromptQualificationConfig) -> None:
    """Refuse an output root equal to, inside or around anything this run reads."""
    for what, uri in config.reads():
        if is_remote(uri) == is_remote(config.out) and overlapping(uri, config.out):
            raise ValueError(f"output root {config.out} overlaps the {what} {uri}: nothing read is ever written to")


embed_captions_task = as_task(captions.embed_shard_captions, "embed-caption-sample")
variance_task = as_task(variance.variance_unit, "generated-output-variance")

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


# ---- signal 1 ---------------------------------------------------------------------------

def density_signal(config: PromptQualificationConfig, out: Store, prompts: list[dict[str, Any]],
                   pool: list[dict[str, Any]], work: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Density of every valid prompt (and pool prompt) against the corpus's caption sample.
    Sets ``density`` (and ``category``) on those rows; returns the summary and category table."""
    cfg, tm = config.density, config.text_model
    corpus = Store(config.corpus, config.corpus_storage_options)
    identity = text_model_identity(tm.name)
    sample = captions.sample_captions(corpus, out, cfg.sample_size, cfg.sample_seed, cfg.splits)
    by_shard = captions.sampled_keys_by_shard(out)
    shards = sorted(by_shard)
    captions.prune_caption_embeddings(out, shards)
    work["caption_shards"] = count_actions(run_tasks(embed_captions_task, [
        {"corpus": corpus, "out": out, "shard": s, "keys": by_shard[s], "text_model": tm, "identity": identity}
        for s in shards]))
    corpus_vectors = captions.load_caption_embeddings(out, shards)
    valid = [p for p in prompts if p["status"] == "valid"]
    prompt_vectors = captions.embed_text_list(out, "prompts", [p["text"] for p in valid], tm, identity)
    pool_vectors = captions.embed_text_list(out, "pool", [q["text"] for q in pool], tm, identity)
    summary: dict[str, Any] = {"mode": cfg.mode, "text_model": identity, "sample": sample["info"],
                               "captions_embedded": len(corpus_vectors), "scored": len(valid)}
    category_rows: list[dict[str, Any]] = []
    if cfg.mode == "direct":
        d = density.direct_density(np.concatenate([prompt_vectors, pool_vectors]), corpus_vectors, cfg.k,
                                   cfg.reference_quantile, cfg.reference_queries, cfg.sample_seed)
        for row, score, flag in zip(valid + pool, d["scores"], d["flags"], strict=True):
            row["density"] = {"mode": "direct", "score": float(score), "threshold": d["threshold"],
                              "flagged": bool(flag), "rule": f"density:knn{d['k']}_similarity>{d['threshold']:.4f}"}
        summary.update(k=d["k"], threshold=d["threshold"], reference_quantile=cfg.reference_quantile,
                       reference_n=d["reference_n"], reference_quantiles=d["reference_quantiles"])
    else:
        taxonomy = tables.taxonomy_categories(tables.read_input(cfg.taxonomy, cfg.taxonomy_storage_options))
        names = [c["name"] for c in taxonomy]
        cat_vectors = captions.embed_text_list(out, "taxonomy", [tables.category_text(c) for c in taxonomy], tm,
                                               identity)
        caption_cats, _ = density.assign(corpus_vectors, cat_vectors)
        assigned, similarity = density.assign(np.concatenate([prompt_vectors, pool_vectors]), cat_vectors)
        rows = valid + pool
        chosen = np.array([names.index(r["category"]) if r["category"] in names else int(a)
                           for r, a in zip(rows, assigned, strict=True)], dtype=np.int64)
        d = density.taxonomy_density(chosen[:len(valid)], caption_cats, len(names), cfg.category_quantile)
        for i, row in enumerate(rows):
            c = int(chosen[i])
            given = row["category"] in names
            row["category_source"] = "given" if given else "assigned"
            row["category"] = names[c]
            row["density"] = {"mode": "taxonomy", "category": names[c], "score": float(d["shares"][c]),
                              "threshold": d["threshold"], "flagged": bool(d["dense"][c]),
                              "similarity": None if given else float(similarity[i]),
                              "rule": f"density:category[{names[c]}]_share>={d['threshold']:.4f}"}
        category_rows = [{"name": n, "corpus_captions": int(d["corpus_counts"][c]),
                          "corpus_share": float(d["shares"][c]),
                          "prompts": int(d["prompt_counts"][c]), "dense": bool(d["dense"][c])}
                         for c, n in enumerate(names)]
        summary.update(threshold=d["threshold"], category_quantile=cfg.category_quantile, categories=category_rows,
                       prompt_divergence=d["prompt_divergence"], corpus_divergence=d["corpus_divergence"])
    summary["flagged"] = sum(bool(p["density"]["flagged"]) for p in valid)
    summary["pool_flagged"] = sum(bool(q["density"]["flagged"]) for q in pool)
    return summary, category_rows


# ---- signal 2 ---------------------------------------------------------------------------

def variance_signal(cfg: VarianceConfig, out: Store, prompts: list[dict[str, Any]], work: dict[str, Any]
                    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per (prompt, model) variance and flags; sets ``variance`` on valid prompt rows."""
    valid = [p for p in prompts if p["status"] == "valid"]
    listed = variance.list_generated(cfg.generated, cfg.storage_options)
    ids = {p["prompt_id"] for p in valid}
    plan: dict[str, list[str]] = {}
    calls = []
    for model in sorted(listed):
        chosen = [(p["prompt_id"], listed[model][p["prompt_id"]]) for p in valid if p["prompt_id"] in listed[model]]
        for n, lo in enumerate(range(0, len(chosen), cfg.prompts_per_unit)):
            chunk = variance.chunk_name(n)
            plan.setdefault(model, []).append(chunk)
            calls.append({"out": out, "generated": cfg.generated, "options": cfg.storage_options, "model": model,
                          "chunk": chunk, "prompts": chosen[lo:lo + cfg.prompts_per_unit], "cfg": cfg})
    variance.prune_generated(out, plan)
    markers = run_tasks(variance_task, calls)
    work["variance_units"] = count_actions(markers)
    identities = {canonical_json(m["info"]["identity"]): m["info"]["identity"] for m in markers}
    identity = next(iter(identities.values()), {"model_id": cfg.model.model_id})
    rows = [r for model, chunks in plan.items() for c in chunks
            for r in out.read_parquet(generated_variance_path(model, c)).to_pylist()]
    per_model = []
    by_prompt: dict[str, dict[str, Any]] = {p["prompt_id"]: {} for p in valid}
    for model in sorted(listed):
        model_rows = {r["prompt_id"]: r for r in rows if r["model"] == model}
        values = np.array([np.nan if model_rows.get(p["prompt_id"], {}).get("variance") is None
                           else model_rows[p["prompt_id"]]["variance"] for p in valid], dtype=np.float64)
        f = variance.variance_flags(values, cfg.sd_threshold)
        for p, value, flag in zip(valid, values, f["flags"], strict=True):
            r = model_rows.get(p["prompt_id"])
            by_prompt[p["prompt_id"]][model] = {
                "variance": None if np.isnan(value) else float(value), "flagged": bool(flag), "cut": f["cut"],
                "mean": f["mean"], "sd": f["sd"], "n_images": r["n_images"] if r else 0,
                "n_embedded": r["n_embedded"] if r else 0}
        per_model.append({"model": model, "n": f["n"], "mean": f["mean"], "sd": f["sd"], "cut": f["cut"],
                          "flagged": int(f["flags"].sum()), "prompts_without_images": int(sum(
                              p["prompt_id"] not in model_rows for p in valid)),
                          "images_digest": sha256_bytes(canonical_json(
                              [[r["prompt_id"], r["images"]] for r in sorted(model_rows.values(),
                                                                             key=lambda r: r["prompt_id"])]).encode())})
    for p in valid:
        p["variance"] = by_prompt[p["prompt_id"]]
    strong = sum(sum(v["flagged"] for v in p["variance"].values()) >= cfg.strong_min_models for p in valid)
    summary = {"image_model": identity, "sd_threshold": cfg.sd_threshold, "min_images": cfg.min_images,
               "strong_min_models": cfg.strong_min_models, "models": per_model, "strong": int(strong),
               "unknown_prompt_folders": sorted({f"{m}/{pid}" for m in listed for pid in listed[m] if pid not in ids}),
               "unusable_files": variance.unusable_entries(cfg.generated, cfg.storage_options)[:100],
               "image_errors": sum(r["n_images"] - r["n_embedded"] for r in rows)}
    return summary, rows


# ---- the flow ----------------------------------------------------------------------------

def qualify_prompts(config: PromptQualificationConfig) -> dict[str, Any]:
    """Qualify a prompt set; results under ``config.out`` (see the module docstring)."""
    log = run_logger()
    check_separate(config)
    out = Store(config.out, config.out_storage_options)
    prompt_file = tables.read_input(config.prompts.path, config.prompts.storage_options)
    prompts = tables.prompt_rows(prompt_file, config.prompts, set(config.rotation.anchors))
    inputs: dict[str, Any] = {"prompts": {"uri": prompt_file.uri, "sha256": prompt_file.sha256,
                                          "manifest_sha256": tables.manifest_of(prompts)}}
    pool: list[dict[str, Any]] = []
    if config.rotation.pool:
        pool_file = tables.read_input(config.rotation.pool, config.rotation.pool_storage_options)
        pool = [q for q in tables.prompt_rows(pool_file, config.prompts) if q["status"] == "valid"]
        inputs["pool"] = {"uri": pool_file.uri, "sha256": pool_file.sha256, "valid": len(pool)}
    for p in prompts + pool:
        p["category_source"] = "given" if p["category"] else None
    valid = [p for p in prompts if p["status"] == "valid"]
    log.info("prompt set %s: %d rows, %d valid", prompt_file.uri, len(prompts), len(valid))
    results: dict[str, Any] = {"prompts": {"rows": len(prompts), "valid": len(valid),
                                           "errors": len(prompts) - len(valid),
                                           "error_reasons": _count(p["reason"] for p in prompts if p["reason"])}}
    warnings: list[str] = []
    work: dict[str, Any] = {}  # units computed and reused: returned, never in the receipt
    category_rows: list[dict[str, Any]] = []

    if config.density is not None:
        results["density"], category_rows = density_signal(config, out, prompts, pool, work)
        corpus = Store(config.corpus, config.corpus_storage_options)
        inputs["corpus"] = {"root": corpus.root, "manifest_digest": results["density"]["sample"]["manifest_digest"],
                            "receipt_sha256": corpus.sha256(RECEIPT) if corpus.exists(RECEIPT) else None}
        if config.density.taxonomy:
            tax = tables.read_input(config.density.taxonomy, config.density.taxonomy_storage_options)
            inputs["taxonomy"] = {"uri": tax.uri, "sha256": tax.sha256}
    else:
        for folder in (PROMPTS_CAPTION_SAMPLE, PROMPTS_CAPTIONS, PROMPTS_TEXTS, QUALIFICATION_CATEGORIES):
            remove_tree(out, folder)

    variance_rows: list[dict[str, Any]] = []
    if config.variance is not None:
        results["variance"], variance_rows = variance_signal(config.variance, out, prompts, work)
        inputs["generated"] = {"root": config.variance.generated,
                               "images_digest": {m["model"]: m["images_digest"] for m in results["variance"]["models"]}}
        if results["variance"]["image_model"].get("random_init"):
            warnings.append(f"RANDOM-INIT image features ({results['variance']['image_model'].get('model_id')}): "
                            "output variances carry no semantic meaning")
    else:
        remove_tree(out, PROMPTS_GENERATED)

    scores: list[tuple[str, str, float]] = []
    if config.cohorts is not None:
        score_file = tables.read_input(config.cohorts.scores, config.cohorts.storage_options)
        scores, rejected = tables.score_rows(score_file, config.cohorts)
        use_difficulty = any(p["difficulty"] is not None for p in valid)
        results["cohorts"] = {**cohort_divergence(valid, scores, config.cohorts, use_difficulty),
                              "bootstrap": config.cohorts.bootstrap, "confidence": config.cohorts.confidence,
                              "seed": config.cohorts.seed, "rejected_score_rows": rejected}
        inputs["scores"] = {"uri": score_file.uri, "sha256": score_file.sha256, "rows_used": len(scores)}

    strong_min = config.variance.strong_min_models if config.variance else 1
    for p in prompts:
        p.update(rotation.decide(p, strong_min))
    plan = rotation.plan_rotation(prompts, pool, config.rotation)
    edition_rows, mapping = rotation.edition_tables(prompts, pool, plan, config.rotation.edition)
    ledger = rotation.ledger_rows(prompts, plan)
    normalization = (rotation.anchor_normalization(prompts, scores) if config.cohorts is not None
                     else {"computed": False, "reason": "no score table (cohorts section)"})
    results["decisions"] = {**_count(p["decision"] for p in prompts), "strong": sum(p["strong"] for p in prompts)}
    results["rotation"] = {**plan, "edition": config.rotation.edition,
                           "reasons": _count(why for _, why in plan["leaving"])}
    results["normalization"] = normalization

    _write_outputs(out, prompts, variance_rows, results, category_rows, ledger, edition_rows, mapping, normalization,
                   config.rotation.edition, prompt_file.sha256)
    receipt = {
        "corpusforge": "prompt-qualification",
        "code_version": code_version(*MODULES),
        "claim_boundary": CLAIM_BOUNDARY,
        "inputs": inputs,
        "text_model": results.get("density", {}).get("text_model"),
        "image_model": results.get("variance", {}).get("image_model"),
        "config": redact(config.model_dump(mode="json", exclude={"dask"})),
        "thresholds": _thresholds(config),
        "seeds": _seeds(config),
        "results": results,
        "warnings": warnings,
        "outputs": _output_hashes(out),
    }
    out.write_json(QUALIFICATION_RECEIPT, receipt)
    out.write_bytes(QUALIFICATION_REPORT, render_markdown(receipt).encode())
    log.info("prompt qualification results in %s/%s (ledger, receipt, report.md)", config.out, QUALIFICATION_DIR)
    return {"out": config.out, "decisions": results["decisions"], "rotation": {
        "leaving": len(plan["leaving"]), "joining": len(plan["joining"]), "deferred": len(plan["deferred"])},
        "warnings": warnings, "work": work}


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))


def _write_outputs(out: Store, prompts: list[dict[str, Any]], variance_rows: list[dict[str, Any]],
                   results: dict[str, Any], category_rows: list[dict[str, Any]], ledger: list[dict[str, Any]],
                   edition_rows: list[dict[str, Any]], mapping: list[dict[str, Any]], normalization: dict[str, Any],
                   edition: str, previous_sha256: str) -> None:
    out.write_parquet(QUALIFICATION_PROMPTS, pa.Table.from_pylist([{
        **{k: p.get(k) for k in ("prompt_id", "row", "cohort", "category", "category_source", "anchor", "status",
                                 "reason", "n_variance_flags", "strong", "decision")},
        "density_score": (p.get("density") or {}).get("score"),
        "density_flagged": (p.get("density") or {}).get("flagged"),
        "variance_flags": json.dumps(sorted(m for m, v in (p.get("variance") or {}).items() if v["flagged"])),
        "rules": json.dumps(p["rules"])} for p in prompts], schema=PROMPT_SCHEMA))
    if variance_rows:
        out.write_parquet(QUALIFICATION_VARIANCE, pa.Table.from_pylist(variance_rows, schema=GENERATED_VARIANCE_SCHEMA))
    else:
        out.remove(QUALIFICATION_VARIANCE)
    cohorts = results.get("cohorts")
    if cohorts and cohorts.get("models"):
        out.write_parquet(QUALIFICATION_COHORTS, pa.Table.from_pylist([{
            **{k: v for k, v in m.items() if k != "interval"},
            "interval_low": m["interval"][0] if m["interval"] else None,
            "interval_high": m["interval"][1] if m["interval"] else None} for m in cohorts["models"]],
            schema=COHORT_SCHEMA))
    else:
        out.remove(QUALIFICATION_COHORTS)
    if category_rows:
        out.write_parquet(QUALIFICATION_CATEGORIES, pa.Table.from_pylist(category_rows))
    else:
        out.remove(QUALIFICATION_CATEGORIES)
    out.write_parquet(QUARANTINE_LEDGER, pa.Table.from_pylist(ledger, schema=LEDGER_SCHEMA))
    out.write_parquet(PROMPT_EDITION_PROMPTS, pa.Table.from_pylist(edition_rows, schema=EDITION_SCHEMA))
    out.write_parquet(PROMPT_EDITION_MAPPING, pa.Table.from_pylist(mapping, schema=MAPPING_SCHEMA))
    out.write_json(PROMPT_EDITION_NORMALIZATION, normalization)
    out.write_json(PROMPT_EDITION_META, {"edition": edition, "previous_prompt_table_sha256": previous_sha256,
                                         "prompts": len(edition_rows), "rotation": results["rotation"]})
    out.write_json(QUALIFICATION_SUMMARY, results)


def _output_hashes(out: Store) -> dict[str, str]:
    rels = [QUALIFICATION_PROMPTS, QUALIFICATION_VARIANCE, QUALIFICATION_COHORTS, QUALIFICATION_CATEGORIES,
            QUARANTINE_LEDGER, QUALIFICATION_SUMMARY, PROMPT_EDITION_PROMPTS, PROMPT_EDITION_MAPPING,
            PROMPT_EDITION_META, PROMPT_EDITION_NORMALIZATION]
    return {rel: out.sha256(rel) for rel in rels if out.exists(rel)}


def _thresholds(config: PromptQualificationConfig) -> dict[str, Any]:
    t: dict[str, Any] = {}
    if config.density:
        d = config.density
        t["density"] = ({"mode": "direct", "k": d.k, "reference_quantile": d.reference_quantile, "comparison": ">"}
                        if d.mode == "direct" else
                        {"mode": "taxonomy", "category_quantile": d.category_quantile, "comparison": ">="})
    if config.variance:
        v = config.variance
        t["variance"] = {"sd_threshold": v.sd_threshold, "comparison": "variance < mean - sd_threshold * sd (ddof 1)",
                         "min_images": v.min_images, "strong_min_models": v.strong_min_models}
    if config.cohorts:
        t["cohorts"] = {"threshold": config.cohorts.threshold, "comparison": ">",
                        "confidence": config.cohorts.confidence}
    t["rotation"] = {"fraction": config.rotation.fraction}
    return t


def _seeds(config: PromptQualificationConfig) -> dict[str, Any]:
    s: dict[str, Any] = {"rotation": config.rotation.seed}
    if config.density:
        s["caption_sample"] = config.density.sample_seed
    if config.cohorts:
        s["bootstrap"] = config.cohorts.seed
    return s


prompt_qualification_flow, run_qualify_prompts = cluster_flow(qualify_prompts, "qualify-prompts")


def preflight(config: PromptQualificationConfig) -> None:
    """The CLI's checks before anything starts (read only): every input exists, the output
    root is clear of them, the prompt table has its columns, the taxonomy parses."""
    from flows.preflight import UserError, check_corpus, require_exists, require_writable_root

    require_exists(config.prompts.path, config.prompts.storage_options, "prompt table", "a .parquet/.jsonl/.csv file")
    if config.corpus:
        check_corpus(config.corpus, config.corpus_storage_options)
    if config.density and config.density.taxonomy:
        require_exists(config.density.taxonomy, config.density.taxonomy_storage_options, "taxonomy",
                       "a YAML/JSON file with categories: [{name, description}]")
    if config.variance:
        require_exists(config.variance.generated, config.variance.storage_options, "generated images",
                       "a folder laid out {model}/{prompt_id}/*.png")
    if config.cohorts:
        require_exists(config.cohorts.scores, config.cohorts.storage_options, "score table", "a .parquet/.jsonl/.csv")
    if config.rotation.pool:
        require_exists(config.rotation.pool, config.rotation.pool_storage_options, "qualification pool",
                       "a prompt table like the prompt set's")
    require_writable_root(config.out, config.out_storage_options, "output root")
    try:
        check_separate(config)
        tables.prompt_rows(tables.read_input(config.prompts.path, config.prompts.storage_options), config.prompts)
        if config.density and config.density.taxonomy:
            tables.taxonomy_categories(tables.read_input(config.density.taxonomy,
                                                         config.density.taxonomy_storage_options))
        if config.cohorts:
            tables.score_rows(tables.read_input(config.cohorts.scores, config.cohorts.storage_options), config.cohorts)
    except ValueError as exc:
        raise UserError(str(exc)) from None
