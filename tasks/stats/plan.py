"""Reference statistics' units planned before a run (``corpusforge plan``): the feature
units of the held-out groups' records (with their selection, judged by
:func:`tasks.shared.features.extract.judge_shard`), the subset files the run then removes,
and the statistics, which every run recomputes from the features (no model).
"""

from __future__ import annotations

from corpusforge.contract import COMPUTED, completed_units
from corpusforge.layout import feature_subset_dir
from corpusforge.plans import DELETE, StagePlan
from corpusforge.storage import Store
from tasks.shared.features.extract import REUSED
from tasks.shared.features.plan import plan_shard_units
from tasks.stats.reference import GroupSelection, scan_manifest
from tasks.stats.stage import STATS_SUBSET, ReferenceStatsConfig, refuse_thin_splits


def plan_units(store: Store, config: ReferenceStatsConfig) -> list[StagePlan]:
    """Reference statistics on the corpus in ``store``: the feature units (with ``config.extract``),
    then one statistics unit per group."""
    model_id = config.model.model_id
    scan = scan_manifest(store, config.groups(), config.sample, config.tiers, config.test_subset,
                         config.test_subset_seed)
    refuse_thin_splits(config, scan.counts)
    plans: list[StagePlan] = []
    if config.extract:
        plans = plan_shard_units(store, scan.largest_first(), config.features(),
                                 GroupSelection(STATS_SUBSET, scan.rule))
        kept = {u.unit for u in plans[0].units if u.reason != REUSED}
        folder = f"{feature_subset_dir(model_id, STATS_SUBSET)}/vectors"
        for name in completed_units(store, folder, ".npy"):
            if name not in kept:
                plans[0].add(f"{STATS_SUBSET}/{name}", DELETE, "features of every image are used instead"
                             if name in scan.shards else "no longer in the selection")
    stats = StagePlan("statistics")
    for group in scan.rule.groups:
        stats.add(f"{group}-{model_id}", COMPUTED, "recomputed on every run from the features (no model)")
    plans.append(stats)
    return plans
