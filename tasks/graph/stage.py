"""The near-duplicate stage: one entry point, built from thin Prefect tasks.

    plan node ids → build index (1 task) → query (1 task per staging shard)
    → merge edges (1 task per owner-shard group) → recall (1 task)
    → decisions (1 task) ∥ collision models (1 task) → calibration sheet (1 task)
    → graph/summary.json

Inside a flow run the tasks go to the flow's task runner (a ``DaskTaskRunner``: one
query task per shard spreads over the workers); called outside a flow, the same
functions run in this process, one after the other. Shards are sorted first and every
task's output depends only on its inputs, so results are identical for any shard
order or worker count. Every step writes a completion marker with a fingerprint and
is skipped on a rerun with the same inputs and settings.

Inputs are read from ``source`` (default: the output store itself); everything is
written under ``graph/`` of the output store — a new corpus version can therefore be
written beside an old one without touching it (``flows/near_dedup.py``).
"""

from __future__ import annotations

from typing import Any

from prefect.context import FlowRunContext

from corpusforge.cluster import as_task, run_tasks
from corpusforge.hashing import fingerprint
from corpusforge.storage import Store
from tasks.graph.calibration import calibration_sheet
from tasks.graph.collision import collision_models
from tasks.graph.config import NearDedupConfig
from tasks.graph.decisions import decide_near_duplicates, read_decisions
from tasks.graph.edges import build_index, graph_recall, merge_edges, merge_fingerprint, merge_groups, query_shard
from tasks.graph.nodes import plan_nodes

SUMMARY_PATH = "graph/summary.json"
NODES_PATH = "graph/nodes.json"

__all__ = ["near_duplicate_stage", "read_decisions", "SUMMARY_PATH"]


build_index_task = as_task(build_index, "graph-build-index")
query_shard_task = as_task(query_shard, "graph-query-shard")
merge_edges_task = as_task(merge_edges, "graph-merge-edges")
recall_task = as_task(graph_recall, "graph-recall")
decide_task = as_task(decide_near_duplicates, "graph-decisions")
collision_task = as_task(collision_models, "graph-collision-models")
calibration_task = as_task(calibration_sheet, "graph-calibration-sheet")


def near_duplicate_stage(store: Store, cfg: NearDedupConfig, shards: list[str], *,
                         source: Store | None = None) -> dict[str, Any]:
    """Build the graph, decide every image, write reports; return the stage summary.

    ``store``: output root (``graph/…`` is written there). ``source``: where
    ``staging/`` and ``features/`` are read (default ``store``). ``shards``: staging
    shard names, any order. Per-key decisions: :func:`read_decisions`.
    """
    if not shards:
        raise ValueError("near-duplicate stage needs at least one staging shard")
    source = source or store
    nodes = plan_nodes(source, shards)
    store.write_json(NODES_PATH, nodes.to_json())
    common = dict(source=source, out=store, cfg=cfg, nodes=nodes)
    info = run_tasks(build_index_task, [common])[0]
    queried = run_tasks(query_shard_task, [dict(common, shard=s, info=info) for s in nodes.shards])
    mfp = merge_fingerprint([m["fingerprint"] for m in queried])
    groups = merge_groups(nodes, [m["pairs"] for m in queried], cfg.merge_max_edges)
    merged = run_tasks(merge_edges_task, [dict(out=store, nodes=nodes, group=g, mfp=mfp) for g in groups])
    recall = run_tasks(recall_task, [dict(out=store, nodes=nodes, cfg=cfg)])[0]

    later = [(decide_task, dict(common, edges_fp=mfp))]
    cfp = fingerprint("graph-collision", info["fingerprint"], cfg.model_id, cfg.seed,
                      cfg.collision.model_dump(mode="json"), cfg.index.model_dump(mode="json"))
    if cfg.collision.enabled:
        later.append((collision_task, dict(common, n_vectors=info["n_vectors"], fp=cfp)))
    if FlowRunContext.get() is None:
        results = [t.fn(**kw) for t, kw in later]
    else:
        results = [f.result() for f in [t.submit(**kw) for t, kw in later]]
    decisions = results[0]
    collision = results[1] if cfg.collision.enabled else None
    calibration = None
    if cfg.calibration.enabled:
        kfp = fingerprint("graph-calibration", mfp, cfp if collision else None,
                          cfg.calibration.model_dump(mode="json"), cfg.graph_threshold,
                          cfg.candidate_threshold, cfg.pair_threshold, cfg.min_component_size, cfg.seed)
        calibration = run_tasks(calibration_task, [dict(common, fp=kfp)])[0]

    summary = {
        "model_id": cfg.model_id,
        "config_fingerprint": fingerprint(cfg.model_dump(mode="json")),
        "shards": len(nodes.shards),
        "index": {"plan": info["plan"], "vectors": info["n_vectors"], "dim": info["dim"],
                  "gpu_build": info["gpu_build"], "gpu_search": any(m["gpu_search"] for m in queried),
                  "search": cfg.index.search, "k": cfg.index.k},
        "graph": {"threshold": cfg.graph_threshold, "found_pairs": sum(m["pairs"] for m in queried),
                  "edges": sum(sum(c.values()) for c in merged), "merge_tasks": len(groups)},
        "recall": recall,
        "decisions": decisions,
        "collision": _collision_brief(collision),
        "calibration": calibration,
    }
    store.write_json(SUMMARY_PATH, summary)
    return summary


def _collision_brief(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return {"full_size": result["full_size"], "target_size": result["target_size"],
            "fraction_scale": result["fraction_scale"],
            "fits": {t: {k: f.get(k) for k in ("fitted", "A", "beta", "r2", "predicted_full", "predicted_target")}
                     for t, f in result["fits"].items()}}
