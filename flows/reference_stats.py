"""Reference statistics of a built corpus (GPIC §3) as a flow of its own.

The stage is :func:`tasks.stats.stage.reference_stats_stage` (the build runs it too when
its config has a ``reference_stats`` section). From Python: ``run_reference_stats(config)``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from corpusforge.cluster import DaskConfig, cluster_flow
from corpusforge.storage import Store
from flows.plan import feature_estimates, flow_plan_data, plan_only, plan_only_field
from flows.preflight import check_corpus_models
from tasks.stats import plan as stats_plan
from tasks.stats.stage import ReferenceStatsConfig, reference_stats_stage

FLOW = "reference-stats"


class ReferenceStatsFlowParams(ReferenceStatsConfig):
    """Which corpus and splits, which feature model, which cluster."""

    corpus: str = Field(..., title="Corpus root", description="Root of a built corpus; local or s3://.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options",
                                            description="fsspec options for the corpus root (endpoint, secret_block: a "
                                                        "Prefect Secret block holding the keys).")
    plan_only: bool = plan_only_field(FLOW, "feature units")
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")


preflight = check_corpus_models  # the CLI's checks before anything starts (read only)


def plan_run(config: ReferenceStatsFlowParams) -> dict[str, Any]:
    """The plan (``corpusforge plan reference-stats``, ``plan_only``): the statistics' feature
    units (with their selection), the subset files the run removes, and the statistics, which
    every run recomputes (:mod:`tasks.stats.plan`); writes nothing."""
    store = Store(config.corpus, config.storage_options)
    plans = stats_plan.plan_units(store, config)
    return flow_plan_data(FLOW, config.corpus, config.corpus, feature_estimates(store, plans))


def reference_stats(config: ReferenceStatsFlowParams) -> dict[str, Any]:
    """Reference statistics of ``config.splits`` of the corpus at ``config.corpus``; with
    ``plan_only``, write nothing and return the plan."""
    if config.plan_only:
        return plan_only(FLOW, plan_run(config))
    return reference_stats_stage(Store(config.corpus, config.storage_options), config)


reference_stats_flow, run_reference_stats = cluster_flow(reference_stats, FLOW)
