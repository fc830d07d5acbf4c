"""``corpusforge plan`` for the flows that run on a built corpus: what they would skip or recompute, and why.

The build's plan is :mod:`flows.plan`; this module plans the other flows that spend GPU
hours on a corpus, and writes nothing either (the scans of a corpus — contamination,
qualify-prompts, evaluate — are planned in :mod:`flows.plan_scans`):

- ``extract-features``: per unit, exactly. For every completed staging shard and every
  model, :func:`tasks.shared.features.extract.judge_shard` — the function the run's
  ``extract_shard`` calls to decide — says skip or recompute, with the reason from the
  unit's marker (no completed output, the code version, a named config field, the
  input digest).
- ``reference-stats``: the same feature units with the statistics' selection (the
  held-out groups' records, from the manifest), the subset files the run then removes,
  and the statistics themselves, which every run recomputes from the features (no GPU).
- ``near-dedup``: per stage, like the build's graph stage. The graph is skipped when the
  new version's root holds a completed graph over the same staging shards with the same
  feature digests, the same ``near_dedup`` settings and code version; the release
  (shards, manifest, receipt) likewise against the source's receipt and the ``splits``.

Costs: the last build's run log gives the seconds per feature unit it computed; without
one, the size of the work (images and bytes to read, from the staging markers).
"""

from __future__ import annotations

from typing import Any

from corpusforge.artifacts import publish_plan_artifact
from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, completed_units, read_marker, require_marker
from corpusforge.feature_files import feature_marker
from corpusforge.layout import (GRAPH_DIR, GRAPH_FOUND, GRAPH_INDEX_WORK, GRAPH_SHARD_TABLE, GRAPH_SUMMARY, LINEAGE,
                                MANIFEST_DIR, MARKERS, RECEIPT, RELEASE_DIR, RELEASE_PLAN_DIR, RUN_LOG, STAGING_TARS,
                                feature_subset_dir, graph_digests_path, staging_records, staging_tar)
from corpusforge.storage import Store
from corpusforge.version import code_version
from flows.extract_features import ExtractFeaturesConfig
from flows.near_dedup import CODE_MODULES, NearDedupFlowParams
from flows.plan import ACTIONS, DELETE, StagePlan, changed_fields, marker_files, mtime, render_plan
from flows.plan_scans import SCAN_PLANNERS, scan_estimate, scan_root
from flows.reference_stats import ReferenceStatsFlowParams
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.extract import REUSED, Selection, decode_size, judge_shard, load_models

WHOLE = "(whole stage)"


def plan_extract_features(config: ExtractFeaturesConfig) -> list[StagePlan]:
    """One stage per model: every completed staging shard of the corpus, skip or recompute."""
    store = Store(config.corpus, config.storage_options)
    return feature_plans(store, completed_units(store, STAGING_TARS, ".tar"), config.features)


def feature_plans(store: Store, shards: list[str], cfg: FeaturesConfig, selection: Selection | None = None
                  ) -> list[StagePlan]:
    """The feature units of ``shards`` as :func:`tasks.shared.features.extract.extract_features`
    runs them (decode size of all configured models, as its ``draft="auto"``)."""
    models = load_models(cfg) if cfg.models else []
    draft = decode_size(models) if models else None
    stages = {m.model_id: StagePlan(f"features.{m.model_id}") for m in models}
    for shard in shards:
        for model_id, verdict in judge_shard(store, shard, cfg, models, draft, selection).models.items():
            stages[model_id].add(shard, verdict.action, verdict.reason)
    return list(stages.values())


def plan_reference_stats(config: ReferenceStatsFlowParams) -> list[StagePlan]:
    """The statistics' feature units (with their selection), the subset files the run
    removes, and the statistics, which every run recomputes."""
    from tasks.stats.reference import GroupSelection, scan_manifest
    from tasks.stats.stage import STATS_SUBSET

    store = Store(config.corpus, config.storage_options)
    model_id = config.model.model_id
    scan = scan_manifest(store, config.groups(), config.sample, config.tiers, config.test_subset,
                         config.test_subset_seed)
    if empty := [g for g in config.splits if scan.counts[g] < 2]:
        raise ValueError(f"splits with fewer than 2 kept records in the manifest: {empty}")
    plans: list[StagePlan] = []
    if config.extract:
        plans = feature_plans(store, scan.largest_first(), config.features(),
                              GroupSelection(STATS_SUBSET, scan.plan))
        kept = {u.unit for u in plans[0].units if u.reason != REUSED}
        folder = f"{feature_subset_dir(model_id, STATS_SUBSET)}/vectors"
        for name in completed_units(store, folder, ".npy"):
            if name not in kept:
                plans[0].add(f"{STATS_SUBSET}/{name}", DELETE, "features of every image are used instead"
                             if name in scan.shards else "no longer in the selection")
    stats = StagePlan("statistics")
    for group in scan.plan.groups:
        stats.add(f"{group}-{model_id}", COMPUTED, "recomputed on every run from the features (no model)")
    plans.append(stats)
    return plans


def plan_near_dedup(config: NearDedupFlowParams) -> list[StagePlan]:
    """The graph and the release of the new version, each judged as a whole."""
    from tasks.graph.derived import staged_with_features
    from tasks.release.splits import SplitConfig

    source = Store(config.source, config.storage_options)
    out = Store(config.out, config.storage_options if config.out_storage_options is None
                else config.out_storage_options)
    cfg = config.near_dedup
    shards = staged_with_features(source, cfg.model_id)
    receipt = out.read_json(RECEIPT) if out.exists(RECEIPT) else None
    lineage = out.read_json(LINEAGE) if out.exists(LINEAGE) else None
    code_changed = receipt is not None and receipt.get("code_version") != code_version(*CODE_MODULES)

    graph = StagePlan("graph")
    reasons = _graph_reasons(source, out, cfg.model_id, shards)
    if lineage is not None and (fields := changed_fields(lineage.get("near_dedup"), cfg.model_dump(mode="json"),
                                                          "near_dedup")):
        reasons.append("config " + ", ".join(fields))
    if code_changed:
        reasons.append("the flow's code version changed")
    graph_folders = (GRAPH_DIR, GRAPH_FOUND, GRAPH_INDEX_WORK)
    if not reasons and _newer_markers(out, graph_folders, GRAPH_SUMMARY):
        reasons.append("the last near-dedup run did not complete")
    graph.add(WHOLE, COMPUTED if reasons else SKIPPED, "; ".join(reasons) or "unchanged")
    plans = [graph]

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
        if _newer_markers(out, (RELEASE_PLAN_DIR, RELEASE_DIR, MANIFEST_DIR), RECEIPT):
            reasons.append("the last near-dedup run did not complete")
    if reasons:
        release.add(WHOLE, COMPUTED, "; ".join(reasons))
    elif graph.units[0].action != SKIPPED:
        release.add(WHOLE, MAYBE, "the graph is recomputed first; the release changes where its decisions do")
    else:
        release.add(WHOLE, SKIPPED, "unchanged")
    plans.append(release)
    return plans


def _graph_reasons(source: Store, out: Store, model_id: str, shards: list[str]) -> list[str]:
    """Why the graph in ``out`` is not the graph of the source's current features and staging
    records (the digests its units are keyed by; none: it is)."""
    records = graph_digests_path("records")
    if not all(out.exists(p) for p in (GRAPH_SUMMARY, GRAPH_SHARD_TABLE, records)):
        return ["no completed graph in the new version's root"]
    table = out.read_parquet(GRAPH_SHARD_TABLE, columns=["shard", "features"])
    old = dict(zip(table["shard"].to_pylist(), table["features"].to_pylist(), strict=True))
    now = {s: feature_marker(source, model_id, s)["digest"] for s in shards}
    reasons = []
    for what, names in (("staging shards added", sorted(set(now) - set(old))),
                        ("staging shards removed", sorted(set(old) - set(now))),
                        ("feature digest changed", sorted(s for s in now if s in old and old[s] != now[s]))):
        if names:
            reasons.append(f"{what}: {len(names)} ({_names(names)})")
    table = out.read_parquet(records, columns=["shard", "digest"])
    old = dict(zip(table["shard"].to_pylist(), table["digest"].to_pylist(), strict=True))
    changed = [s for s in shards if s in old and old[s] != require_marker(
        source, staging_tar(s), "staging shard")["outputs"][staging_records(s)]]
    if changed:
        reasons.append(f"staging records changed: {len(changed)} ({_names(changed)})")
    return reasons


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", …" if len(names) > 5 else "")


def _newer_markers(store: Store, folders: tuple[str, ...], written_last: str) -> bool:
    """True when a unit under ``folders`` completed after the file the stage writes last."""
    last = mtime(store, written_last)
    newest = max((mtime(store, f"{MARKERS}/{rel}.json") or 0.0 for f in folders for rel in marker_files(store, f)),
                 default=0.0)
    return last is None or newest > last


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
    infos = [(read_marker(store, staging_tar(shard)) or {}).get("info", {}) for shard in todo]
    size = {"images": sum(int(i.get("count", 0)) for i in infos), "bytes": sum(int(i.get("bytes", 0)) for i in infos)}
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
