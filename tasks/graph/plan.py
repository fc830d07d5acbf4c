"""A near-dedup run's graph planned before the run (``corpusforge plan``), judged as a whole:
skipped when the output root holds a completed graph over the same staging shards, with the
same feature digests and staging records as the source's now (the digests its units are keyed
by). The flow adds what it judges against its own record (config, code version).
"""

from __future__ import annotations

from corpusforge.contract import COMPUTED, SKIPPED, require_marker
from corpusforge.feature_files import feature_marker
from corpusforge.layout import staging_records, staging_tar
from tasks.graph.files import (GRAPH_DIR, GRAPH_FOUND, GRAPH_INDEX_WORK, GRAPH_SHARD_TABLE, GRAPH_SUMMARY,
                               graph_digests_path)
from corpusforge.plans import WHOLE, StagePlan, names, unfinished
from corpusforge.storage import Store
from tasks.graph.derived import staged_with_features


def plan_units(source: Store, out: Store, model_id: str, recorded: list[str]) -> list[StagePlan]:
    """The graph in ``out`` of the source's ``model_id`` features: recomputed when its inputs
    changed, for the flow's ``recorded`` reasons (what changed since its last run), or when
    its last run did not complete; else skipped."""
    reasons = changed_inputs(source, out, model_id, staged_with_features(source, model_id)) + recorded
    if not reasons and unfinished(out, (GRAPH_DIR, GRAPH_FOUND, GRAPH_INDEX_WORK), GRAPH_SUMMARY):
        reasons.append("the last near-dedup run did not complete")
    graph = StagePlan("graph")
    graph.add(WHOLE, COMPUTED if reasons else SKIPPED, "; ".join(reasons) or "unchanged")
    return [graph]


def changed_inputs(source: Store, out: Store, model_id: str, shards: list[str]) -> list[str]:
    """Why the graph in ``out`` is not the graph of the source's current features and staging
    records (none: it is)."""
    records = graph_digests_path("records")
    if not all(out.exists(p) for p in (GRAPH_SUMMARY, GRAPH_SHARD_TABLE, records)):
        return ["no completed graph in the new version's root"]
    table = out.read_parquet(GRAPH_SHARD_TABLE, columns=["shard", "features"])
    old = dict(zip(table["shard"].to_pylist(), table["features"].to_pylist(), strict=True))
    now = {s: feature_marker(source, model_id, s).digest for s in shards}
    reasons = []
    for what, changed in (("staging shards added", sorted(set(now) - set(old))),
                          ("staging shards removed", sorted(set(old) - set(now))),
                          ("feature digest changed", sorted(s for s in now if s in old and old[s] != now[s]))):
        if changed:
            reasons.append(f"{what}: {len(changed)} ({names(changed)})")
    table = out.read_parquet(records, columns=["shard", "digest"])
    old = dict(zip(table["shard"].to_pylist(), table["digest"].to_pylist(), strict=True))
    changed = [s for s in shards if s in old and old[s] != require_marker(
        source, staging_tar(s), "staging shard").outputs[staging_records(s)]]
    if changed:
        reasons.append(f"staging records changed: {len(changed)} ({names(changed)})")
    return reasons
