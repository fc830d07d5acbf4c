"""Evaluate generated images against reference statistics: FD, PRDC and MMD (GPIC §3).

Table of contents of :func:`evaluate`:

    load the reference (µ, Σ, feature subsample, provenance) → refuse a model or
    preprocessing other than the reference's (unless ``allow_mismatch``)
    → list generated images (folders, WebDataset tars) in a fixed order, in chunks (a task:
      the listing goes to ``out``'s work/evaluate/listing.parquet, the flow gets the chunks' names)
    → embed each chunk (a Prefect task on Dask; the model loads once per worker), or read
      its features back from the feature store when the same files were embedded before
      with the same model (stage contract)
    → metrics against the reference (a task reading the features back) → metrics.json and
      report.md in ``out``

From Python: ``run_evaluate(config)``.
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

from pydantic import Field, model_validator

from corpusforge.cluster import DaskConfig, cluster_flow, fan_out, run_logger
from corpusforge.config import FlowConfig
from corpusforge.contract import SKIPPED
from corpusforge.feature_files import prune_features
from corpusforge.storage import Store
from corpusforge.version import code_version
from flows.plan import flow_plan_data, plan_only, plan_only_field, size_estimate
from flows.preflight import check_models, require_exists, require_writable_root
from tasks.shared.features.config import STATISTICS_PREPROCESSING, ModelSpec, RuntimeConfig
from tasks.stats.caption_set import caption_set_claim
from tasks.stats.config import PROTOCOL_MODES, MetricsConfig, protocol_model
from tasks.stats import evaluate_plan
from tasks.stats.evaluate import (EMBED_CHUNK, EVALUATE_METRICS, LIST_GENERATED, check_model, expected_identity,
                                  load_reference, cut_generated)
from tasks.shared.provenance import public_spec

FLOW = "evaluate"
CODE_MODULES = ("tasks.stats.evaluate", "tasks.stats.caption_set")  # metrics.json's code_version


class EvaluateConfig(FlowConfig):
    """Generated images, the reference to compare them with, the model, the cluster."""

    generated: list[str] = Field(..., min_length=1, title="Generated images",
                                 description="Folders of images (jpg, png, webp) and/or WebDataset .tar files or "
                                             "folders of them; local or s3://. Listed recursively, sorted.")
    generated_storage_options: dict[str, Any] = Field(default_factory=dict, title="Generated storage options")
    reference: str = Field(..., title="Reference statistics",
                           description="stats/{split}-{model_id}.npz of a built corpus (its .json and .features.npy "
                                       "are read beside it), or GPIC's released test_stats.npz.")
    reference_storage_options: dict[str, Any] = Field(default_factory=dict, title="Reference storage options")
    out: str = Field(..., title="Output folder", description="Where metrics.json and report.md are written.")
    out_storage_options: dict[str, Any] = Field(default_factory=dict, title="Output storage options")
    feature_store: str | None = Field(
        None, title="Feature store",
        description="Where the generated images' features are kept (features/{model}/…), so evaluating the same "
                    "images again, e.g. against another reference, embeds nothing. Empty: the output folder "
                    "(pruned to this run's chunks). A shared store is never pruned; it uses out_storage_options.")
    protocol: Literal["paper", "gpic_eval_port"] = Field(
        "paper", title="Evaluation mode",
        description="paper: App. B.1 preprocessing (square centre crop, bicubic 256, then 224); gpic_eval_port: "
                    "the port of GPIC's toolkit (Resize((224, 224)) bicubic squash, no crop). Named in every output.")
    model: ModelSpec = Field(default_factory=protocol_model, title="Feature model",
                             description="Must be the reference's model (default: DINOv2 ViT-L/14 with the "
                                         "mode's preprocessing).")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, title="Model runtime")
    torchscript_allowlist: list[str] = Field(default_factory=list, title="TorchScript allow-list")
    allow_mismatch: bool = Field(False, title="Allow a model mismatch",
                                 description="Evaluate even when model or preprocessing differ from the "
                                             "reference's; recorded as a deviation.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, title="Metrics")
    chunk_size: int = Field(1000, ge=1, title="Images per task", description="Image files embedded per task.")
    caption_set: str | None = Field(
        None, title="Caption set",
        description="The evaluation caption set the generated images were made from (a corpus's "
                    "eval_captions.parquet, local or s3://); its SHA-256 is recorded and checked against the one "
                    "the reference names.")
    plan_only: bool = plan_only_field(FLOW, "chunks", "embed or read back")
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")

    @model_validator(mode="after")
    def _model_follows_mode(self) -> EvaluateConfig:
        if "model" not in self.model_fields_set:
            self.model = protocol_model(self.protocol)
        elif (self.model.resolved_preprocessing in STATISTICS_PREPROCESSING
              and self.model.resolved_preprocessing != PROTOCOL_MODES[self.protocol]
              and self.model.resolved_preprocessing in PROTOCOL_MODES.values()):
            raise ValueError(f"protocol {self.protocol!r} uses preprocessing {PROTOCOL_MODES[self.protocol]!r}, "
                             f"model.preprocessing is {self.model.resolved_preprocessing!r}")
        return self


def preflight(config: EvaluateConfig) -> None:
    """The CLI's checks before anything starts (read only): the generated images and the
    reference exist, the feature store can be written, the model has weights."""
    for g in config.generated:
        require_exists(g, config.generated_storage_options, "generated images", "a folder of images or tars")
    require_exists(config.reference, config.reference_storage_options, "reference statistics",
                   "the .npz written by `corpusforge reference-stats` (stats/{split}-{model}.npz)")
    if config.feature_store is not None:
        require_writable_root(config.feature_store, config.out_storage_options, "feature store")
    check_models(config)


def plan_run(config: EvaluateConfig) -> dict[str, Any]:
    """The plan (``corpusforge plan evaluate``, ``plan_only``): every chunk of generated images
    read back or embedded, and why, then the metrics (:mod:`tasks.stats.evaluate_plan`);
    writes nothing. The chunks are listed as the listing task lists them, out of core, and
    judged as they come: this process holds their names."""
    reference = load_reference(config.reference, config.reference_storage_options)
    check_model(reference, expected_identity(config.model), config.allow_mismatch, config.protocol)
    chunks = cut_generated(config.generated, config.generated_storage_options, config.chunk_size)
    first = next(chunks, None)
    if first is None:
        raise FileNotFoundError(f"no images or tars under {config.generated}")
    out = Store(config.out, config.out_storage_options)
    features = None if config.feature_store is None else Store(config.feature_store, config.out_storage_options)
    plans = evaluate_plan.plan_units(out, features, itertools.chain([first], chunks), config.model, config.runtime.precision,
                                     config.generated_storage_options)
    return flow_plan_data(FLOW, config.out, f"{', '.join(config.generated)} into {config.out}",
                          [(s, size_estimate(s)) for s in plans])


def evaluate(config: EvaluateConfig) -> dict[str, Any]:
    """Metrics of generated images against a reference; the embedding runs on ``config.dask``;
    with ``plan_only``, write nothing and return the plan."""
    if config.plan_only:
        return plan_only(FLOW, plan_run(config))
    log = run_logger()
    reference = load_reference(config.reference, config.reference_storage_options)
    check_model(reference, expected_identity(config.model), config.allow_mismatch, config.protocol)
    out = Store(config.out, config.out_storage_options)
    chunks = fan_out(LIST_GENERATED, [dict(out=out, sources=config.generated,
                                           storage_options=config.generated_storage_options,
                                           chunk_size=config.chunk_size)])[0]
    if not chunks:
        raise FileNotFoundError(f"no images or tars under {config.generated}")
    log.info("%d chunks of generated images; reference %s (%d images)", len(chunks), config.reference, reference.n)
    features = out if config.feature_store is None else Store(config.feature_store, config.out_storage_options)
    if config.feature_store is None:
        prune_features(out, {config.model.model_id}, [c.name for c in chunks])
    embedded = fan_out(EMBED_CHUNK, [dict(out=out, features=features, chunk=c.index, sources=config.generated,
                                           spec=config.model, runtime=config.runtime,
                                           torchscript_allowlist=config.torchscript_allowlist,
                                           storage_options=config.generated_storage_options) for c in chunks])
    reused = sum(e.action == SKIPPED for e in embedded)
    log.info("generated features: %d chunks embedded, %d read back from %s", len(chunks) - reused, reused,
             features.root)
    claims = {"sources": list(config.generated), "model_spec": public_spec(config.model),
              "code_version": code_version(*CODE_MODULES),
              "caption_set": caption_set_claim(config.caption_set, config.generated_storage_options,
                                               (reference.provenance or {}).get("eval_captions"))}
    result = fan_out(EVALUATE_METRICS, [dict(out=out, features=features, model_id=config.model.model_id,
                                             reference=config.reference,
                                             reference_options=config.reference_storage_options,
                                             cfg=config.metrics, allow_mismatch=config.allow_mismatch,
                                             mode=config.protocol, claims=claims)])[0]
    for d in result["protocol"]["deviations"]:
        log.warning("protocol deviation: %s", d)
    return {**result, "work": {"chunks_embedded": len(chunks) - reused, "chunks_reused": reused}}


evaluate_flow, run_evaluate = cluster_flow(evaluate, FLOW)
