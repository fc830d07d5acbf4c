"""``corpusforge plan``: what a build would skip, recompute or delete, and why, before it runs;
and the plan's data, estimates, text and ``plan_only`` run that every flow's plan hook
(``plan_run`` in its own module) shares. It imports no flow: the flows import it.

Like ``dvc status`` or ``terraform plan``, it writes nothing; each stage keys its units with the
function its run calls, so plan and run cannot disagree. docs/contract.md ("Before a run") gives
the rules: what is planned per unit, which stages are judged as a whole, what is read.
"""

from __future__ import annotations

import tempfile
from typing import Any

from pydantic import Field

from corpusforge.artifacts import publish_plan_artifact
from corpusforge.config import FlowConfig
from corpusforge.contract import COMPUTED, MAYBE, SKIPPED
from corpusforge.layout import MANIFEST_DIR, features_dir, part_name
from tasks.release.files import RELEASE_DIR, RELEASE_ASSIGNMENT_DIR
from tasks.report.files import RECEIPT, RUN_LOG
from tasks.stats.files import STATS_DIR
from tasks.captions.files import CAPTIONS_DIR, CAPTION_JOURNAL_DIR, CAPTION_ASSIGNMENT_DIR
from tasks.graph.files import GRAPH_DIR, GRAPH_WORK
from corpusforge.plans import (ACTIONS, StagePlan, changed_fields, marker_files, mtime, newest_marker, staged_size,
                               switched_off)
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.ingest import plan as ingest_plan
from tasks.ingest.fetch import plan as fetch_plan
from tasks.ingest.sources import cut_partitions
from tasks.shared.features import plan as features_plan
from tasks.staging import plan as staging_plan

# The later stages judged as a whole: (plan stage, the receipt config sections it reads,
# the marker folders of its units, the config section whose null switches it off).
WHOLE_STAGES = [
    ("graph", ("near_dedup", "features"), (GRAPH_DIR, GRAPH_WORK), "near_dedup"),
    ("captioning", ("captioning", "near_dedup"), (CAPTIONS_DIR, CAPTION_ASSIGNMENT_DIR, CAPTION_JOURNAL_DIR),
     "captioning"),
    ("release", ("splits", "near_dedup", "captioning"), (RELEASE_ASSIGNMENT_DIR, RELEASE_DIR), None),
    ("manifest", ("splits", "near_dedup", "captioning"), (MANIFEST_DIR,), None),
    ("statistics", ("reference_stats",), (STATS_DIR,), "reference_stats"),
]


def plan_build(config: FlowConfig, code_modules: tuple[str, ...]) -> list[StagePlan]:
    """The plan of the build ``config`` (a :class:`flows.build_corpus.BuildConfig`) whose code is
    ``code_modules``, from the markers under ``config.out``: each stage plans its units, upstream
    plans hand the next their ``outputs`` (digests and markers of the units that skip)."""
    store = Store(config.out, config.storage_options)
    with tempfile.TemporaryDirectory(prefix="corpusforge-plan-") as scratch_dir:
        scratch = Store(scratch_dir)  # input chunks are keyed by their bytes: written here, not under out
        kind, parts = cut_partitions(config.source, scratch, config.input)
        fetch = fetch_plan.plan_units(store, scratch, parts, config.fetch, config.licenses) if kind == "urls" else None
        plans = [fetch] if fetch else []
        plans += ingest_plan.plan_units(store, scratch, parts, config.input, config.validation, config.licenses,
                                        config.staging.buckets_for(len(parts)), config.staging.shard_size, fetch)
    resolve = plans[-1]
    plans += staging_plan.plan_units(store, [resolve.outputs.get(part_name(p.index)) for p in parts],
                                     config.staging.shard_size)
    staging = plans[-1]
    keep = [config.reference_stats.model.model_id] if config.reference_stats is not None else []
    plans += features_plan.plan_units(store, config.features, None if staging.open else staging.outputs, keep)
    plans += _whole_stages(store, config, plans, code_modules)
    return plans


def _whole_stages(store: Store, config: FlowConfig, upstream: list[StagePlan],
                  code_modules: tuple[str, ...]) -> list[StagePlan]:
    """The stages after features, judged as a whole: all skipped when nothing upstream recomputes,
    their config sections and the build's code version are unchanged and the last build completed
    (no marker newer than its run log); else every unit is "recompute if upstream output changes"."""
    receipt = store.read_json(RECEIPT) if store.exists(RECEIPT) else None
    now = config.model_dump(mode="json")
    code_changed = receipt is not None and receipt.get("code_version") != code_version(*code_modules)
    upstream_changes = any(u.action != SKIPPED for s in upstream for u in s.units)
    run_log_time = mtime(store, RUN_LOG)
    plans = []
    for name, sections, folders, switch in WHOLE_STAGES:
        stage = StagePlan(name)
        if name == "statistics" and config.reference_stats is not None:  # its features of the held-out records
            folders = (*folders, f"{features_dir(config.reference_stats.model.model_id)}/subsets")
        if switch is not None and now.get(switch) is None:
            plans.append(switched_off(stage, store, folders, f"{switch} is switched off"))
            continue
        units = [rel for f in folders for rel in marker_files(store, f)]
        reasons = []
        if upstream_changes:
            reasons.append("an upstream unit is recomputed or deleted")
        if receipt is None:
            reasons.append("no earlier completed build")
        else:
            changed = changed_fields({s: receipt["config"].get(s) for s in sections},
                                      {s: now.get(s) for s in sections})
            if changed:
                reasons.append("config " + ", ".join(changed))
            if code_changed:
                reasons.append("the build's code version changed")
        newest = newest_marker(store, units)
        if run_log_time is None or newest > run_log_time:
            reasons.append("the last build did not complete")
        action = MAYBE if reasons else SKIPPED
        for rel in units:
            stage.add(rel, action, "; ".join(reasons) or "unchanged")
        stage.open = bool(reasons)
        plans.append(stage)
    return plans


def estimate(stage: StagePlan, run_log: dict[str, Any] | None) -> dict[str, Any]:
    """Seconds the stage's recomputes cost: the stage's seconds in the last run log per unit
    (``basis`` says so), or nothing when no run was logged."""
    todo = [u for u in stage.units if u.action == COMPUTED]
    maybe = [u for u in stage.units if u.action == MAYBE]
    seconds = (run_log or {}).get("seconds", {}).get(stage.stage.split(".")[0])
    if not (seconds and stage.units):
        return {"seconds": None, "seconds_if_upstream_changes": None, "basis": "no times recorded"}
    typical = seconds / len(stage.units)
    return {"seconds": round(typical * len(todo), 1), "seconds_if_upstream_changes": round(typical * len(maybe), 1),
            "basis": "the last run log's stage time per unit"}


def plan_data(config: FlowConfig, plans: list[StagePlan]) -> dict[str, Any]:
    """The build's plan as data (``--json``): per stage, counts, estimate and every unit."""
    store = Store(config.out, config.storage_options)
    run_log = store.read_json(RUN_LOG) if store.exists(RUN_LOG) else None
    return {"out": config.out, "stages": [_stage_data(s, estimate(s, run_log)) for s in plans]}


def flow_plan_data(flow: str, root: str, where: str, stages: list[tuple[StagePlan, dict[str, Any]]]
                   ) -> dict[str, Any]:
    """The plan of a flow on a built corpus as data: per stage (with its estimate), counts and
    every unit; ``root`` is where its markers are read, ``where`` how the title names the run."""
    return {"flow": flow, "corpus": root, "where": where, "title": f"Plan for {flow} on {where}:",
            "stages": [_stage_data(s, e) for s, e in stages]}


def _stage_data(stage: StagePlan, estimate: dict[str, Any]) -> dict[str, Any]:
    return {"stage": stage.stage, "counts": stage.counts(), "units_may_be_added": stage.open, "estimate": estimate,
            **({"facts": stage.facts} if stage.facts else {}),
            "units": [{"unit": u.unit, "action": ACTIONS[u.action], "reason": u.reason} for u in stage.units]}


def feature_estimates(store: Store, plans: list[StagePlan]) -> list[tuple[StagePlan, dict[str, Any]]]:
    """Each stage of a flow on the built corpus ``store`` with its cost: for feature units, the last
    build's seconds per feature unit computed and their size (from the staging markers)."""
    run_log = store.read_json(RUN_LOG) if store.exists(RUN_LOG) else None
    return [(s, _feature_estimate(store, s, run_log)) for s in plans]


def _feature_estimate(store: Store, stage: StagePlan, run_log: dict[str, Any] | None) -> dict[str, Any]:
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


def size_estimate(stage: StagePlan, staged: Store | None = None) -> dict[str, Any]:
    """The size of a scan's stage (these flows keep no run log): units to compute, and with
    ``staged``, the images of the staged chunks they read."""
    todo = [u.unit for u in stage.units if u.action == COMPUTED]
    maybe = [u.unit for u in stage.units if u.action == MAYBE]
    basis = "no times recorded (no run log for this flow): the size of the work"
    estimate: dict[str, Any] = {"seconds": None, "seconds_if_upstream_changes": None, "basis": basis,
                                "units": len(todo), "units_if_upstream_changes": len(maybe)}
    if staged is not None:
        estimate.update(staged_size(staged, todo))
    return estimate


def plan_only_field(flow: str, units: str = "units", verb: str = "skip or recompute") -> Any:
    """The ``plan_only`` parameter of a flow on a built corpus, as its deployment form shows it."""
    return Field(False, title="Plan only",
                 description=f"Write nothing: report which {units} a run would {verb}, why, and what they cost "
                             f"(the run's result and its '{flow}-plan' markdown artifact), like "
                             f"`corpusforge plan {flow}`.")


def plan_only(flow: str, data: dict[str, Any]) -> dict[str, Any]:
    """A ``plan_only`` run of ``flow``: its plan ``data`` as the result and as the ``{flow}-plan``
    artifact (described by where the run reads and writes: ``where``, a build's ``out``); writes nothing."""
    publish_plan_artifact(flow, render_plan(data), data.get("where") or data["out"])
    return data


def render_plan(data: dict[str, Any], listed: int = 20) -> str:
    """The plan as text: one line per stage, then the units that do not skip (the first ``listed``)."""
    lines = [data.get("title") or f"Plan for a build into {data['out']}:", ""]
    for s in data["stages"]:
        c, est = s["counts"], s["estimate"]
        cost = "" if est["seconds"] is None else f"  ~{est['seconds']:.0f} s"
        if est["seconds_if_upstream_changes"]:
            cost += f" (+ up to {est['seconds_if_upstream_changes']:.0f} s if upstream output changes)"
        if c["recompute"] and "images" in est:
            cost += f"  ({est['images']} images, {est['bytes'] / 1e6:.1f} MB of staging shards)"
        more = " (units may be added: planned from upstream output)" if s["units_may_be_added"] else ""
        if "urls" in s.get("facts", {}):
            f = s["facts"]
            more += f"  ({f['urls']} URLs to request from {f['hosts']} hosts; {f['host_units']} host units)"
        lines.append(f"{s['stage']:<18} skip {c['skip']:>6}  recompute {c['recompute']:>6}  "
                     f"if-upstream-changes {c[ACTIONS[MAYBE]]:>6}  delete {c['delete']:>6}{cost}{more}")
        shown = [u for u in s["units"] if u["action"] != "skip"]
        for u in shown[:listed]:
            lines.append(f"    {u['action']:<36} {u['unit']:<28} {u['reason']}")
        if len(shown) > listed:
            lines.append(f"    … {len(shown) - listed} more (--json lists every unit)")
    if any(s["counts"][ACTIONS[MAYBE]] or s["units_may_be_added"] for s in data["stages"]):
        lines += ["", "'recompute if upstream output changes': its inputs are written by units that recompute "
                      "first; whether they change is known only after the run."]
    return "\n".join(lines)
