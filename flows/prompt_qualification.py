"""Prompt qualification for image-generation benchmarks (seed 000): three risk signals,
a quarantine ledger and an anchor-safe rotation choice.

Table of contents of :func:`qualify_prompts`:

    read the prompt set (and the pool) → per-row errors, nothing dropped silently
    → signal 1, density: sample the corpus's kept captions (1 unit) → embed them (1 task
      per staging shard) → embed prompts, pool, taxonomy → direct k-NN or taxonomy density
    → signal 2, output variance: generated images listed and cut into units (1 task), 1 task per
      (model, chunk of prompts)
      → trace of covariance per (prompt, model) → per-model flags, strong cases
    → signal 3, cohort divergence: scores per (prompt, model) → stratified old − new, bootstrap
    → decisions → quarantine ledger → rotation choice → new edition + mapping → anchor normalisation
    → summary.json, receipt.json, report.md under qualification/

Reads the corpus, the prompt table, the generated images, the scores, the taxonomy and the
pool, and never writes them: an output root equal to, inside or around any of them is
refused. Every unit follows the stage contract, so a rerun redoes only what changed.

From Python: ``run_qualify_prompts(config)``; the Prefect flow is ``prompt_qualification_flow``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from corpusforge.cluster import DaskConfig, cluster_flow, fan_out, run_logger
from corpusforge.config import FlowConfig
from corpusforge.contract import remove_tree, summarise
from tasks.report.files import RECEIPT
from tasks.prompts.files import (PROMPTS_CAPTIONS, PROMPTS_CAPTION_SAMPLE, PROMPTS_GENERATED, PROMPTS_TEXTS,
                                 PROMPT_EDITION_DIR, QUALIFICATION_CATEGORIES, QUALIFICATION_DIR, QUALIFICATION_RECEIPT,
                                 QUALIFICATION_REPORT)
from corpusforge.receipts import flow_receipt
from corpusforge.storage import Store, require_separate
from flows.plan import flow_plan_data, plan_only, plan_only_field, size_estimate
from flows.preflight import CORPUS_HINT, as_user_error, check_models, require_exists, require_writable_root
from tasks.prompts import plan as prompts_plan
from tasks.prompts import rotation, tables
from tasks.prompts.cohorts import cohort_divergence
from tasks.prompts.generated import write_prompt_order
from tasks.prompts.config import (CohortConfig, DensityConfig, PromptSetConfig, RotationConfig, TextModelConfig,
                                  VarianceConfig)
from tasks.prompts.outputs import seeds, tally, thresholds, write_outputs
from tasks.prompts.report import CLAIM_BOUNDARY, render_markdown
from tasks.prompts.signals import (EMBED_CAPTIONS, LIST_GENERATED, VARIANCE, density_signal, cut_density_units,
                                   cut_variance_units, variance_signal)
from tasks.shared.output_hashes import output_hashes

FLOW = "qualify-prompts"
CODE_MODULES = ("tasks.prompts.captions", "tasks.prompts.density", "tasks.prompts.variance", "tasks.prompts.cohorts",
                "tasks.prompts.rotation", "tasks.prompts.tables", "tasks.prompts.report", "tasks.prompts.signals",
                "tasks.prompts.outputs")


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
    plan_only: bool = plan_only_field(FLOW)
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")

    @model_validator(mode="after")
    def _density_needs_a_corpus(self) -> PromptQualificationConfig:
        if self.density is not None and not self.corpus:
            raise ValueError("the density signal needs corpus (a built corpus root); set density: null to skip it")
        return self

    def reads(self) -> list[tuple[str, str, dict[str, Any], str]]:
        """Everything this run reads, as (what, uri, storage options, what it must be): the
        preflight checks each exists, and the output root must stay clear of them all."""
        found = [("prompt table", self.prompts.path, self.prompts.storage_options, "a .parquet/.jsonl/.csv file")]
        if self.corpus:
            found.append(("corpus", self.corpus, self.corpus_storage_options, CORPUS_HINT))
        if self.density and self.density.taxonomy:
            found.append(("taxonomy", self.density.taxonomy, self.density.taxonomy_storage_options,
                          "a YAML/JSON file with categories: [{name, description}]"))
        if self.variance:
            found.append(("generated images", self.variance.generated, self.variance.storage_options,
                          "a folder laid out {model}/{prompt_id}/*.png"))
        if self.cohorts:
            found.append(("score table", self.cohorts.scores, self.cohorts.storage_options, "a .parquet/.jsonl/.csv"))
        if self.rotation.pool:
            found.append(("qualification pool", self.rotation.pool, self.rotation.pool_storage_options,
                          "a prompt table like the prompt set's"))
        return found


def check_separate(config: PromptQualificationConfig) -> None:
    """Refuse an output root equal to, inside or around anything this run reads."""
    require_separate(config.out, [(what, uri) for what, uri, _, _ in config.reads()])


def read_prompts(config: PromptQualificationConfig) -> tuple[Any, list[dict[str, Any]], Any, list[dict[str, Any]]]:
    """The prompt table and its rows, the pool table (None without one) and its valid rows:
    what the run reads first, and the plan too."""
    prompt_file = tables.read_input(config.prompts.path, config.prompts.storage_options)
    prompts = tables.prompt_rows(prompt_file, config.prompts, set(config.rotation.anchors))
    if not config.rotation.pool:
        return prompt_file, prompts, None, []
    pool_file = tables.read_input(config.rotation.pool, config.rotation.pool_storage_options)
    return prompt_file, prompts, pool_file, [q for q in tables.prompt_rows(pool_file, config.prompts)
                                             if q["status"] == "valid"]


def qualify_prompts(config: PromptQualificationConfig) -> dict[str, Any]:
    """Qualify a prompt set; results under ``config.out`` (see the module docstring); with
    ``plan_only``, write nothing and return the plan (:func:`plan_run`)."""
    if config.plan_only:
        return plan_only(FLOW, plan_run(config))
    log = run_logger()
    check_separate(config)
    out = Store(config.out, config.out_storage_options)
    prompt_file, prompts, pool_file, pool = read_prompts(config)
    inputs: dict[str, Any] = {"prompts": {"uri": prompt_file.uri, "sha256": prompt_file.sha256,
                                          "manifest_sha256": tables.manifest_of(prompts)}}
    if pool_file is not None:
        inputs["pool"] = {"uri": pool_file.uri, "sha256": pool_file.sha256, "valid": len(pool)}
    for p in prompts + pool:
        p["category_source"] = "given" if p["category"] else None
    valid = [p for p in prompts if p["status"] == "valid"]
    log.info("prompt set %s: %d rows, %d valid", prompt_file.uri, len(prompts), len(valid))
    results: dict[str, Any] = {"prompts": {"rows": len(prompts), "valid": len(valid),
                                           "errors": len(prompts) - len(valid),
                                           "error_reasons": tally(p["reason"] for p in prompts if p["reason"])}}
    warnings: list[str] = []
    work: dict[str, Any] = {}  # units computed and reused: returned, never in the receipt
    category_rows: list[dict[str, Any]] = []

    if config.density is not None:
        corpus = Store(config.corpus, config.corpus_storage_options)
        density_cuts = cut_density_units(corpus, out, config.density, config.text_model)
        embedded = fan_out(EMBED_CAPTIONS, density_cuts.calls)
        work["caption_shards"] = summarise("density.caption_embeddings", embedded).counts()
        results["density"], category_rows = density_signal(density_cuts, out, config.density, config.text_model,
                                                           prompts, pool)
        inputs["corpus"] = {"root": corpus.root, "manifest_digest": results["density"]["sample"]["manifest_digest"],
                            "receipt_sha256": corpus.sha256(RECEIPT) if corpus.exists(RECEIPT) else None}
        if config.density.taxonomy:
            tax = tables.read_input(config.density.taxonomy, config.density.taxonomy_storage_options)
            inputs["taxonomy"] = {"uri": tax.uri, "sha256": tax.sha256}
    else:
        remove_tree(out, PROMPTS_CAPTION_SAMPLE, PROMPTS_CAPTIONS, PROMPTS_TEXTS, QUALIFICATION_CATEGORIES)

    variance_rows: list[dict[str, Any]] = []
    if config.variance is not None:
        write_prompt_order(out, prompts)  # what the listing cuts units by: it returns O(models + units)
        listing = fan_out(LIST_GENERATED, [dict(out=out, generated=config.variance.generated,
                                                options=config.variance.storage_options,
                                                prompts_per_unit=config.variance.prompts_per_unit)])[0]
        variance_cuts = cut_variance_units(config.variance, out, listing)
        markers = fan_out(VARIANCE, variance_cuts.calls)
        work["variance_units"] = summarise("variance", markers).counts()
        results["variance"], variance_rows = variance_signal(variance_cuts, markers, config.variance, out, prompts)
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
    choice = rotation.choose_rotation(prompts, pool, config.rotation)
    edition_rows, mapping = rotation.edition_tables(prompts, pool, choice, config.rotation.edition)
    ledger = rotation.ledger_rows(prompts, choice)
    normalization = (rotation.anchor_normalization(prompts, scores) if config.cohorts is not None
                     else {"computed": False, "reason": "no score table (cohorts section)"})
    results["decisions"] = {**tally(p["decision"] for p in prompts), "strong": sum(p["strong"] for p in prompts)}
    results["rotation"] = {**choice, "edition": config.rotation.edition,
                           "reasons": tally(why for _, why in choice["leaving"])}
    results["normalization"] = normalization

    write_outputs(out, prompts, variance_rows, results, category_rows, ledger, edition_rows, mapping, normalization,
                  config.rotation.edition, prompt_file.sha256)
    receipt = flow_receipt(
        FLOW, CODE_MODULES, config, config_exclude={"dask", "plan_only"},
        claim_boundary=CLAIM_BOUNDARY,
        inputs=inputs,
        text_model=results.get("density", {}).get("text_model"),
        image_model=results.get("variance", {}).get("image_model"),
        thresholds=thresholds(config.density, config.variance, config.cohorts, config.rotation),
        seeds=seeds(config.density, config.cohorts, config.rotation),
        results=results,
        warnings=warnings,
        outputs=output_hashes(out, (QUALIFICATION_DIR, PROMPT_EDITION_DIR), skip=(QUALIFICATION_RECEIPT,
                                                                               QUALIFICATION_REPORT)),
    )
    out.write_json(QUALIFICATION_RECEIPT, receipt)
    out.write_bytes(QUALIFICATION_REPORT, render_markdown(receipt).encode())
    log.info("prompt qualification results in %s/%s (ledger, receipt, report.md)", config.out, QUALIFICATION_DIR)
    return {"out": config.out, "decisions": results["decisions"], "rotation": {
        "leaving": len(choice["leaving"]), "joining": len(choice["joining"]), "deferred": len(choice["deferred"])},
        "warnings": warnings, "work": work}


prompt_qualification_flow, run_qualify_prompts = cluster_flow(qualify_prompts, FLOW)


def plan_run(config: PromptQualificationConfig) -> dict[str, Any]:
    """The plan (``corpusforge plan qualify-prompts``, ``plan_only``): every unit of the two
    signals with a model, then the decisions (every run), per unit (:mod:`tasks.prompts.plan`);
    writes nothing. The estimate is the size of the work (no run log)."""
    out = Store(config.out, config.out_storage_options)
    corpus = Store(config.corpus, config.corpus_storage_options) if config.corpus else None
    _, prompts, _, pool = read_prompts(config)
    plans = prompts_plan.plan_units(out, corpus, config.density, config.variance, config.text_model, prompts, pool)
    return flow_plan_data(FLOW, config.out, f"{config.prompts.path} into {config.out}",
                          [(s, size_estimate(s)) for s in plans])


def preflight(config: PromptQualificationConfig) -> None:
    """The CLI's checks before anything starts (read only): every input exists, the output
    root is clear of them, the prompt table has its columns, the taxonomy parses, the models
    have weights."""
    for what, uri, options, hint in config.reads():
        require_exists(uri, options, what, hint)
    require_writable_root(config.out, config.out_storage_options, "output root")
    with as_user_error():
        check_separate(config)
        tables.prompt_rows(tables.read_input(config.prompts.path, config.prompts.storage_options), config.prompts)
        if config.density and config.density.taxonomy:
            tables.taxonomy_categories(tables.read_input(config.density.taxonomy,
                                                         config.density.taxonomy_storage_options))
        if config.cohorts:
            tables.score_rows(tables.read_input(config.cohorts.scores, config.cohorts.storage_options), config.cohorts)
    check_models(config)
