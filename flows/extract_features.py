"""Compute features for an already built corpus: the feature stage on its own.

Runs :func:`tasks.features.extract.extract_features` over every completed staging shard
(``staging/{shard}.tar.done.json``) of ``config.corpus``, one task per shard on the Dask
cluster from ``config.dask``. Finished (model, shard) pairs with a matching fingerprint
are skipped, so a rerun only does missing or invalidated work. Output layout: see
:mod:`tasks.features.extract`.

From Python: ``run_extract_features(config)`` (starts a Prefect API for the Dask workers
when none is configured) or the flow ``extract_features_flow(config)`` itself.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from pydantic import Field

from corpusforge.cluster import DaskConfig, on_cluster, prefect_api
from corpusforge.config import FlowConfig
from corpusforge.storage import Store
from tasks.features.base import CODE_VERSION
from tasks.features.config import FeaturesConfig
from tasks.features.extract import extract_features, summarize
from tasks.staging import completed_staging_shards


class ExtractFeaturesConfig(FlowConfig):
    """Which corpus, which models, which cluster."""

    corpus: str = Field(..., title="Corpus root",
                        description="Root of a built corpus (with staging/ shards); local or s3://.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options",
                                            description="fsspec options for the corpus root (endpoint, keys).")
    features: FeaturesConfig = Field(default_factory=FeaturesConfig, title="Features",
                                     description="Models, stored dtype, runtime, TorchScript allow-list.")
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")


@flow(name="extract-features-on-dask")
def extract_features_on_dask(config: ExtractFeaturesConfig) -> dict[str, Any]:
    log = get_run_logger()
    store = Store(config.corpus, config.storage_options)
    shards = completed_staging_shards(store)
    log.info("%d completed staging shards in %s; models %s", len(shards), config.corpus,
             [m.model_id for m in config.features.models])
    summary = summarize(extract_features(store, shards, config.features, CODE_VERSION))
    if "warning" in summary:
        log.warning(summary["warning"])
    for model_id, totals in summary["models"].items():
        log.info("%s: %d ok, %d errors; shards computed %d, recomputed %d, skipped %d", model_id,
                 totals["ok"], totals["errors"], totals["computed"], totals["recomputed"], totals["skipped"])
    return summary


@flow(name="extract-features")
def extract_features_flow(config: ExtractFeaturesConfig) -> dict[str, Any]:
    """Features for every completed staging shard; the work runs on ``config.dask``."""
    return on_cluster(extract_features_on_dask, config)


def run_extract_features(config: ExtractFeaturesConfig) -> dict[str, Any]:
    """Run the flow from Python or the CLI, with a Prefect API available to Dask workers."""
    with prefect_api():
        return extract_features_flow(config)
