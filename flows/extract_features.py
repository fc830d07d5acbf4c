"""Compute features for an already built corpus: the feature stage on its own.

Runs :func:`tasks.shared.features.extract.extract_features` over every completed staging shard
of ``config.corpus``, one task per shard on the Dask
cluster from ``config.dask``. Finished (model, shard) pairs with a matching fingerprint
are skipped, so a rerun only does missing or invalidated work. Output layout: see
:mod:`tasks.shared.features.extract`.

From Python: ``run_extract_features(config)`` (starts a Prefect API for the Dask workers
when none is configured) or the flow ``extract_features_flow(config)`` itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from corpusforge.cluster import DaskConfig, cluster_flow, fan_out, run_logger
from corpusforge.config import FlowConfig
from corpusforge.contract import completed_units
from corpusforge.layout import STAGING_TARS
from corpusforge.storage import Store
from flows.plan import feature_estimates, flow_plan_data, plan_only, plan_only_field
from flows.preflight import check_corpus_models
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.extract import extract_features, receipt_section
from tasks.shared.features.plan import plan_shard_units

FLOW = "extract-features"


class ExtractFeaturesConfig(FlowConfig):
    """Which corpus, which models, which cluster."""

    corpus: str = Field(..., title="Corpus root",
                        description="Root of a built corpus (with staging/ shards); local or s3://.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options",
                                            description="fsspec options for the corpus root (endpoint, secret_block: a "
                                                        "Prefect Secret block holding the keys).")
    features: FeaturesConfig = Field(default_factory=FeaturesConfig, title="Features",
                                     description="Models, stored dtype, runtime, TorchScript allow-list.")
    plan_only: bool = plan_only_field(FLOW, "(model, shard) units")
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")


preflight = check_corpus_models  # the CLI's checks before anything starts (read only)


def plan_run(config: ExtractFeaturesConfig) -> dict[str, Any]:
    """The plan (``corpusforge plan extract-features``, ``plan_only``): per model, every
    completed staging shard skipped or recomputed, exactly as ``extract_shard`` will decide
    (:func:`tasks.shared.features.plan.plan_shard_units`); writes nothing."""
    store = Store(config.corpus, config.storage_options)
    plans = plan_shard_units(store, completed_units(store, STAGING_TARS, ".tar"), config.features)
    return flow_plan_data(FLOW, config.corpus, config.corpus, feature_estimates(store, plans))


def extract(config: ExtractFeaturesConfig) -> dict[str, Any]:
    """Features for every completed staging shard of ``config.corpus``; with ``plan_only``,
    write nothing and return the plan."""
    if config.plan_only:
        return plan_only(FLOW, plan_run(config))
    log = run_logger()
    store = Store(config.corpus, config.storage_options)
    shards = completed_units(store, STAGING_TARS, ".tar")
    log.info("%d completed staging shards in %s; models %s", len(shards), config.corpus,
             [m.model_id for m in config.features.models])
    summary = receipt_section(extract_features(store, shards, config.features, fan_out=fan_out))
    if "warning" in summary:
        log.warning(summary["warning"])
    for model_id, totals in summary["models"].items():
        log.info("%s: %d ok, %d errors; shards computed %d, skipped %d", model_id,
                 totals["ok"], totals["errors"], totals["computed"], totals["skipped"])
    return summary


extract_features_flow, run_extract_features = cluster_flow(extract, FLOW)
