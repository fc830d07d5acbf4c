"""``corpusforge plan`` for the flows that run on a built corpus: what they would skip or recompute, and why.

The build's plan is :mod:`flows.plan`; this module plans the other flows that spend GPU
hours on a corpus, and writes nothing either (the scans of a corpus — contamination,
qualify-prompts, evaluate — are planned in :mod:`flows.plan_scans`). The stages plan their
own units (``plan_units``); what is judged here is judged against the flows' own records:

- ``extract-features``: per unit, exactly (:func:`tasks.shared.features.plan.plan_shard_units`:
  for every completed staging shard and every model, the check the run's ``extract_shard``
  makes says skip or recompute, with the reason from the unit's marker).
- ``reference-stats``: the same feature units with the statistics' selection, the subset
  files the run then removes, and the statistics themselves (:mod:`tasks.stats.plan`).
- ``near-dedup``: per stage, like the build's graph stage. The graph is skipped when the
  new version's root holds a completed graph over the same staging shards with the same
  feature digests (:mod:`tasks.graph.plan`), the same ``near_dedup`` settings and code
  version (its lineage and receipt, judged here); the release (shards, manifest, receipt)
  likewise against the source's receipt and the ``splits``.

Costs: the last build's run log gives the seconds per feature unit it computed; without
one, the size of the work (images and bytes to read, from the staging markers).
"""

from __future__ import annotations

from typing import Any

from corpusforge.artifacts import publish_plan_artifact
from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, completed_units
from corpusforge.layout import (LINEAGE, MANIFEST_DIR, RECEIPT, RELEASE_DIR, RELEASE_PLAN_DIR, RUN_LOG,
                                STAGING_TARS)
from corpusforge.plans import ACTIONS, WHOLE, StagePlan, changed_fields, staged_size, unfinished
from corpusforge.storage import Store
from corpusforge.version import code_version
from flows.extract_features import ExtractFeaturesConfig
from flows.near_dedup import CODE_MODULES, NearDedupFlowParams
from flows.plan import render_plan
from flows.plan_scans import SCAN_PLANNERS, scan_estimate, scan_root
from flows.reference_stats import ReferenceStatsFlowParams
from tasks.graph import plan as graph_plan
from tasks.shared.features.plan import plan_shard_units
from tasks.stats import plan as stats_plan


def plan_extract_features(config: ExtractFeaturesConfig) -> list[StagePlan]:
    """One stage per model: every completed staging shard of the corpus, skip or recompute."""
    store = Store(config.corpus, config.storage_options)
    return plan_shard_units(store, completed_units(store, STAGING_TARS, ".tar"), config.features)


def plan_reference_stats(config: ReferenceStatsFlowParams) -> list[StagePlan]:
    """The statistics' feature units (with their selection), the subset files the run
    removes, and the statistics, which every run recomputes."""
    return stats_plan.plan_units(Store(config.corpus, config.storage_options), config)


def plan_near_dedup(config: NearDedupFlowParams) -> list[StagePlan]:
    """The graph and the release of the new version, each judged as a whole."""
    from tasks.release.splits import SplitConfig

    source = Store(config.source, config.storage_options)
    out = Store(config.out, config.storage_options if config.out_storage_options is None
                else config.out_storage_options)
    receipt = out.read_json(RECEIPT) if out.exists(RECEIPT) else None
    lineage = out.read_json(LINEAGE) if out.exists(LINEAGE) else None
    code_changed = receipt is not None and receipt.get("code_version") != code_version(*CODE_MODULES)

    recorded = []  # what changed since the graph in out was built, by the flow's record of it
    if lineage is not None and (fields := changed_fields(lineage.get("near_dedup"),
                                                          config.near_dedup.model_dump(mode="json"), "near_dedup")):
        recorded.append("config " + ", ".join(fields))
    if code_changed:
        recorded.append("the flow's code version changed")
    plans = graph_plan.plan_units(source, out, config.near_dedup.model_id, recorded)
    graph = plans[0]

    release = StagePlan("release")
    if not source.exists(RECEIPT):
        plans.append(release)  # the flow writes the graph only
        return plans
    source_receipt = source.read_json(RECEIPT)
    reasons = []
    if receipt is None:
        reasons.append("no completed release in the new version's root")
    else:
        if lineage is None or lineage.get("source_receipt_sha256") != source.sha256(RECEIPT):
            reasons.append("the source's receipt changed")
        splits = config.splits or SplitConfig.model_validate(source_receipt["config"]["splits"])
        # splits given, or else the source's (whose receipt is compared above)
        before = receipt.get("config", {}).get("splits") or source_receipt["config"]["splits"]
        if fields := changed_fields(before, splits.model_dump(mode="json"), "splits"):
            reasons.append("config " + ", ".join(fields))
        if code_changed:
            reasons.append("the flow's code version changed")
        if unfinished(out, (RELEASE_PLAN_DIR, RELEASE_DIR, MANIFEST_DIR), RECEIPT):
            reasons.append("the last near-dedup run did not complete")
    if reasons:
        release.add(WHOLE, COMPUTED, "; ".join(reasons))
    elif graph.units[0].action != SKIPPED:
        release.add(WHOLE, MAYBE, "the graph is recomputed first; the release changes where its decisions do")
    else:
        release.add(WHOLE, SKIPPED, "unchanged")
    plans.append(release)
    return plans


PLANNERS = {"extract-features": plan_extract_features, "reference-stats": plan_reference_stats,
            "near-dedup": plan_near_dedup, **SCAN_PLANNERS}


def flow_plan_data(flow: str, config: Any) -> dict[str, Any]:
    """The plan of ``flow`` (a key of :data:`PLANNERS`) as data: per stage, counts, estimate, every unit."""
    plans = PLANNERS[flow](config)
    if flow in SCAN_PLANNERS:
        root, where = scan_root(flow, config)
        stages = [(s, scan_estimate(flow, config, s)) for s in plans]
    else:
        root = config.source if flow == "near-dedup" else config.corpus
        store = Store(root, config.storage_options)
        run_log = store.read_json(RUN_LOG) if store.exists(RUN_LOG) else None
        where = f"{root} into {config.out}" if flow == "near-dedup" else root
        stages = [(s, _estimate(store, s, run_log)) for s in plans]
    return {"flow": flow, "corpus": root, "where": where, "title": f"Plan for {flow} on {where}:", "stages": [
        {"stage": s.stage, "counts": s.counts(), "units_may_be_added": s.open, "estimate": estimate,
         "units": [{"unit": u.unit, "action": ACTIONS[u.action], "reason": u.reason} for u in s.units]}
        for s, estimate in stages]}


def _estimate(store: Store, stage: StagePlan, run_log: dict[str, Any] | None) -> dict[str, Any]:
    """The recomputed feature units' cost: seconds per unit the last build's run log measured
    (its features seconds over the feature units it computed), and their size (images and
    bytes to read, from the staging markers). Stages judged as a whole: none."""
    if not stage.stage.startswith("features."):
        return {"seconds": None, "seconds_if_upstream_changes": None, "basis": "not estimated (judged per stage)"}
    todo = [u.unit for u in stage.units if u.action == COMPUTED]
    size = staged_size(store, todo)
    seconds = (run_log or {}).get("seconds", {}).get("features")
    computed = sum(c.get(COMPUTED, 0) for c in (run_log or {}).get("features", {}).values() if isinstance(c, dict))
    if not (seconds and computed):
        return {"seconds": None, "seconds_if_upstream_changes": None, **size,
                "basis": "no times recorded: the size of the work (all images of each shard, at most)"}
    return {"seconds": round(seconds / computed * len(todo), 1), "seconds_if_upstream_changes": None, **size,
            "basis": "the last run log's seconds per feature unit computed"}


def plan_only(flow: str, config: Any) -> dict[str, Any]:
    """A ``plan_only`` run of ``flow``: the plan as its result and as the ``{flow}-plan`` artifact; writes nothing."""
    data = flow_plan_data(flow, config)
    publish_plan_artifact(flow, render_plan(data), data["where"])
    return data
