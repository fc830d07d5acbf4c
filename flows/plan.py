"""``corpusforge plan``: what a build would skip, recompute or delete, and why, before it runs.

Like ``dvc status`` or ``terraform plan``, it writes nothing. It walks the build's stages in
order and, for every unit, computes the fingerprint the run would compute — with the same
function the stage calls (``ingest_key``, ``resolve_key``, ``staging_key``,
``feature_fingerprint``…) — and compares it with the unit's marker
(:func:`corpusforge.contract.explain`). A unit's inputs are known exactly when every unit
that produces them is skipped (their digests are in their markers). When an upstream unit
recomputes, its new digest is only known after it ran, so the units reading it are
**recompute if upstream output changes** (terraform's "known after apply"), unless their
own code or config changed, which makes them recompute whatever upstream writes.

The stages after features (near-duplicate graph, captioning, release shards, manifest,
statistics) are judged per stage, not per unit: all skipped when nothing upstream
recomputes, their settings (against the last receipt's config) and the build's code
version are unchanged, and the last build completed (no marker newer than its run log);
else every unit is "recompute if upstream output changes". A stage switched off is
deleted exactly.

It reads the source listing or table and stats the image files (as the run's input
planning does), the markers, and, to key staging shards, the resolved partitions'
metadata rows; never images, spills, features or release shards. Costs come from the
last run log's seconds per stage and unit (markers hold nothing timed, so that the same
inputs give the same marker bytes).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, completed_units, explain, read_marker
from corpusforge.layout import (CAPTION_JOURNAL_DIR, CAPTION_PLAN_DIR, CAPTIONS_DIR, DEDUP_HASHES_DIR, DEDUP_KEYS_DIR,
                                EXACT_DIR, FEATURES_DIR, GRAPH_DIR, GRAPH_FOUND, GRAPH_INDEX_WORK, INGEST_DIR,
                                KEYDUP_DIR, MANIFEST_DIR, MARKERS, RECEIPT, RELEASE_DIR, RELEASE_PLAN_DIR, RESOLVED_DIR,
                                RUN_LOG, STAGING_TARS, STATS_DIR, bucket_name, dedup_group_name, dedup_hashes_path,
                                dedup_keys_path, exact_path, feature_vectors, features_dir, ingest_path, keydup_path,
                                part_name, resolved_path, staging_tar)
from corpusforge.storage import Store
from corpusforge.version import code_version
from flows.build_corpus import BUILD_MODULES, BuildConfig
from tasks.ingest.exact_dedup import (combine_digests, duplicate_keys_key, exact_duplicates_key, exchange_hashes_key,
                               exchange_keys_key, partition_groups, resolve_key)
from tasks.ingest.partition import ingest_key
from tasks.ingest.sources import plan_partitions
from tasks.staging import images_digest, plan_staging, shard_table, staging_key

DELETE = "delete"
ACTIONS = {SKIPPED: "skip", COMPUTED: "recompute", MAYBE: "recompute if upstream output changes", DELETE: "delete"}

# The later stages judged as a whole: (plan stage, the receipt config sections it reads,
# the marker folders of its units, the config section whose null switches it off).
WHOLE_STAGES = [
    ("graph", ("near_dedup", "features"), (GRAPH_DIR, GRAPH_FOUND, GRAPH_INDEX_WORK), "near_dedup"),
    ("captioning", ("captioning", "near_dedup"), (CAPTIONS_DIR, CAPTION_PLAN_DIR, CAPTION_JOURNAL_DIR), "captioning"),
    ("release", ("splits", "near_dedup", "captioning"), (RELEASE_PLAN_DIR, RELEASE_DIR), None),
    ("manifest", ("splits", "near_dedup", "captioning"), (MANIFEST_DIR,), None),
    ("statistics", ("reference_stats",), (STATS_DIR,), "reference_stats"),
]
# The build config fields behind the positions of a stage key's config (explain names positions).
CONFIG_NAMES = {
    "ingest": {"[0]": "validation", "[1]": "hash buckets (staging.buckets)", "[2]": "input.allow_roots"},
    "resolve": {"config config": "config staging.shard_size"},
    "features": {"[0]": "model", "[1]": "features.dtype", "[2]": "decode size", "[3]": "features.runtime.precision"},
}


@dataclass
class UnitPlan:
    """What the run will do with one unit, and why."""

    unit: str
    action: str
    reason: str


@dataclass
class StagePlan:
    """One stage's units. ``open``: the set of units is itself known only after upstream runs
    (units may be added), so only its recomputes are certain."""

    stage: str
    units: list[UnitPlan] = field(default_factory=list)
    open: bool = False

    def add(self, unit: str, action: str, reason: str) -> None:
        for part, name in CONFIG_NAMES.get(self.stage.split(".")[0], {}).items():
            reason = reason.replace(part, name)
        self.units.append(UnitPlan(unit, action, reason))

    def counts(self) -> dict[str, int]:
        return {ACTIONS[a]: sum(u.action == a for u in self.units) for a in ACTIONS}

    def known(self) -> bool:
        """True when every unit's action is certain (nothing depends on upstream output)."""
        return not self.open and all(u.action != MAYBE for u in self.units)


def plan_build(config: BuildConfig) -> list[StagePlan]:
    """The build's plan, stage by stage, from the markers under ``config.out``; writes nothing."""
    store = Store(config.out, config.storage_options)
    plans: list[StagePlan] = []
    with tempfile.TemporaryDirectory(prefix="corpusforge-plan-") as scratch_dir:
        scratch = Store(scratch_dir)  # input chunks are keyed by their bytes: written here, not under out
        _, parts = plan_partitions(config.source, scratch, config.input)
        n_buckets = config.staging.buckets_for(len(parts))
        names = [part_name(p.index) for p in parts]

        ingest = StagePlan("ingest")
        ingested: list[dict[str, Any] | None] = []
        for p in parts:
            marker = read_marker(store, ingest_path(p.index))
            key = ingest_key(scratch, p, config.input, config.validation, n_buckets, config.licenses)
            action, reason = explain(marker, key)
            ingest.add(names[p.index], action, reason)
            ingested.append(marker if action == SKIPPED else None)
        _deletions(ingest, store, INGEST_DIR, ".parquet", names)
        plans.append(ingest)

    # exact dedup's units in the order tasks.ingest.exact_dedup.deduplicate runs them
    digests = [m["digest"] if m else None for m in ingested]
    groups = partition_groups(len(parts), n_buckets)
    size = len(groups[0]) if groups else 0
    inputs = [_combined(digests[ps.start:ps.stop]) for ps in groups]
    buckets = [bucket_name(b) for b in range(n_buckets)]
    group_names = [dedup_group_name(g) for g in range(len(groups))]
    exact = StagePlan("exact_dedup")
    keys_x = [_judge(exact, store, dedup_keys_path(g), f"key exchange {group_names[g]}", exchange_keys_key, ps,
                     inputs[g]) for g, ps in enumerate(groups)]
    keydup = [_judge(exact, store, keydup_path(b), f"keys {buckets[b]}", duplicate_keys_key, b, size,
                     _combined(keys_x)) for b in range(n_buckets)]
    hashes_x = [_judge(exact, store, dedup_hashes_path(g), f"hash exchange {group_names[g]}", exchange_hashes_key,
                       ps, inputs[g], _combined(keydup)) for g, ps in enumerate(groups)]
    exact_out = [_judge(exact, store, exact_path(b), f"hashes {buckets[b]}", exact_duplicates_key, b, size,
                        _combined(hashes_x)) for b in range(n_buckets)]
    _deletions(exact, store, DEDUP_KEYS_DIR, ".parquet", group_names, "key exchange ")
    _deletions(exact, store, KEYDUP_DIR, ".parquet", buckets, "keys ")
    _deletions(exact, store, DEDUP_HASHES_DIR, ".parquet", group_names, "hash exchange ")
    _deletions(exact, store, EXACT_DIR, ".parquet", buckets, "hashes ")
    plans.append(exact)

    resolve = StagePlan("resolve")
    decisions = _combined(keydup + exact_out)
    resolved = [_judge(resolve, store, resolved_path(i), names[i], resolve_key, config.staging.shard_size,
                       digests[i], decisions, full=True) for i in range(len(parts))]
    _deletions(resolve, store, RESOLVED_DIR, ".parquet", names)
    plans.append(resolve)

    staging = StagePlan("staging")
    images: dict[str, str] | None = None
    if all(m is not None for m in resolved):
        images = {}
        shards = plan_staging([m["info"] for m in resolved], config.staging.shard_size)
        for shard in shards:
            table = shard_table(store, shard)
            marker = read_marker(store, staging_tar(shard.name))
            staging.add(shard.name, *explain(marker, staging_key(table)))
            images[shard.name] = images_digest(table.to_pylist())
        _deletions(staging, store, STAGING_TARS, ".tar", list(images))
    else:
        _unknown(staging, store, STAGING_TARS, ".tar")
    plans.append(staging)

    plans += _features(store, config, images)
    plans += _whole_stages(store, config, plans)
    return plans


def _judge(stage: StagePlan, store: Store, rel: str, unit: str, key_of: Any, *args: Any,
           full: bool = False) -> dict[str, Any] | str | None:
    """Judge a unit whose key takes upstream digests (None: not known before the run).
    Returns what downstream reads: the unit's digest, or its marker with ``full``; None when
    it is recomputed."""
    known = all(_known(a) for a in args)
    marker = read_marker(store, rel)
    key = key_of(*(a if _known(a) else _placeholder(a) for a in args))
    action, reason = explain(marker, key, inputs_known=known)
    stage.add(unit, action, reason)
    if action != SKIPPED:
        return None
    return marker if full else marker["digest"]


def _combined(digests: list[str | None]) -> str | None:
    """The combined digest a task of the run takes (None while any of them is unknown)."""
    return combine_digests(digests) if all(d is not None for d in digests) else None


def _known(value: Any) -> bool:
    if isinstance(value, list):
        return all(v is not None for v in value)
    return value is not None


def _placeholder(value: Any) -> Any:
    """Stands for unknown digests when only the code and config parts of a key are compared."""
    return [v if isinstance(v, str) else "?" for v in value] if isinstance(value, list) else "?"


def _deletions(stage: StagePlan, store: Store, folder: str, suffix: str, keep: list[str], prefix: str = "") -> None:
    """Completed units of ``folder`` the run's pruning removes (not in the current plan)."""
    kept = set(keep)
    for name in completed_units(store, folder, suffix):
        if name not in kept:
            stage.add(prefix + name, DELETE, "no longer in the plan")


def _unknown(stage: StagePlan, store: Store, folder: str, suffix: str) -> None:
    """A stage whose units are planned from upstream output that will be recomputed."""
    stage.open = True
    for name in completed_units(store, folder, suffix):
        stage.add(name, MAYBE, "planned from upstream output that is recomputed first")


def _features(store: Store, config: BuildConfig, images: dict[str, str] | None) -> list[StagePlan]:
    """One stage per configured model (the run log counts them so), keyed as the run keys them."""
    from tasks.shared.features.extract import decode_size, feature_fingerprint, load_models

    kept = {m.model_id for m in config.features.models}
    if config.reference_stats is not None:
        kept.add(config.reference_stats.model.model_id)
    plans = []
    models = load_models(config.features) if config.features.models else []
    draft = decode_size(models) if models else None
    cfg = config.features
    for model in models:
        stage = StagePlan(f"features.{model.model_id}")
        folder = f"{features_dir(model.model_id)}/vectors"
        if images is None:
            for name in completed_units(store, folder, ".npy"):
                marker = read_marker(store, feature_vectors(model.model_id, name))
                key = feature_fingerprint(model, cfg.dtype, draft, cfg.runtime.precision, "?")
                stage.add(name, *explain(marker, key, inputs_known=False))
            stage.open = True
        else:
            for name, digest in images.items():
                marker = read_marker(store, feature_vectors(model.model_id, name))
                stage.add(name, *explain(marker, feature_fingerprint(model, cfg.dtype, draft, cfg.runtime.precision,
                                                                     digest)))
            _deletions(stage, store, folder, ".npy", list(images))
        plans.append(stage)
    dropped = StagePlan("features.removed")
    for name in store.listdir(FEATURES_DIR):
        if name not in kept:
            for shard in completed_units(store, f"{features_dir(name)}/vectors", ".npy"):
                dropped.add(f"{name}/{shard}", DELETE, f"model {name} is no longer configured")
    return plans + ([dropped] if dropped.units else [])


def _whole_stages(store: Store, config: BuildConfig, upstream: list[StagePlan]) -> list[StagePlan]:
    """The stages after features, judged as a whole (see the module docstring)."""
    receipt = store.read_json(RECEIPT) if store.exists(RECEIPT) else None
    now = config.model_dump(mode="json")
    code_changed = receipt is not None and receipt.get("code_version") != code_version(*BUILD_MODULES)
    upstream_changes = any(u.action != SKIPPED for s in upstream for u in s.units)
    run_log_time = mtime(store, RUN_LOG)
    plans = []
    for name, sections, folders, switch in WHOLE_STAGES:
        stage = StagePlan(name)
        if name == "statistics" and config.reference_stats is not None:  # its features of the held-out records
            folders = (*folders, f"{features_dir(config.reference_stats.model.model_id)}/subsets")
        units = [(f, rel) for f in folders for rel in marker_files(store, f)]
        if switch is not None and now.get(switch) is None:
            for folder, rel in units:
                stage.add(rel, DELETE, f"{switch} is switched off")
            plans.append(stage)
            continue
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
        newest = max((mtime(store, f"{MARKERS}/{rel}.json") or 0.0 for _, rel in units), default=0.0)
        if run_log_time is None or newest > run_log_time:
            reasons.append("the last build did not complete")
        action = MAYBE if reasons else SKIPPED
        for _, rel in units:
            stage.add(rel, action, "; ".join(reasons) or "unchanged")
        stage.open = bool(reasons)
        plans.append(stage)
    return plans


def marker_files(store: Store, folder: str) -> list[str]:
    """Relative output paths of every unit with a marker under ``folder`` (recursively)."""
    base = store.path(f"{MARKERS}/{folder}")
    fs = store.fs
    root = fs._strip_protocol(base)
    if not fs.exists(root):
        return []
    return sorted(f"{folder}/{p[len(root) + 1:-len('.json')]}" for p in fs.find(root) if p.endswith(".json"))


def mtime(store: Store, rel: str) -> float | None:
    """The modification time of ``rel`` in seconds, or None when it does not exist."""
    path = store.fs._strip_protocol(store.path(rel))
    if not store.fs.exists(path):
        return None
    info = store.fs.info(path)
    value = info.get("mtime") or info.get("LastModified") or info.get("created")
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def changed_fields(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted names of the config fields that differ between two config dumps."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [f for k in sorted(set(old) | set(new))
                for f in changed_fields(old.get(k), new.get(k), f"{path}.{k}" if path else k)]
    return [] if old == new else [path]


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


def plan_data(config: BuildConfig, plans: list[StagePlan]) -> dict[str, Any]:
    """The plan as data (``--json``): per stage, counts, estimate and every unit."""
    store = Store(config.out, config.storage_options)
    run_log = store.read_json(RUN_LOG) if store.exists(RUN_LOG) else None
    return {"out": config.out, "stages": [
        {"stage": s.stage, "counts": s.counts(), "units_may_be_added": s.open, "estimate": estimate(s, run_log),
         "units": [{**asdict(u), "action": ACTIONS[u.action]} for u in s.units]} for s in plans]}


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
