"""The near-duplicate stage: one entry point, built from thin Prefect tasks.

    number nodes → build index (flat: 1 task; IVF: train 1 task, add 1 task per block of
    shards, merge 1 task; tasks/graph/build.py) → query (1 task per staging shard whose
    features changed) → recall reference (1 task per shard) → merge edges (1 task per
    owner-shard group) → [k-NN cap check] → recall (1 task) → [mode gpic_verified: review
    pairs chosen (1 task); with crop_candidates > 0 and a flat index: region layouts (1 task
    per shard), off-centre crop candidates (1 task per shard; tasks/graph/crops.py); verified
    (1 task per shard)] → decisions (1 task)
    ∥ collision models (1 task) → calibration sheet (1 task) → graph/summary.json

Inside a flow run the tasks go to the flow's task runner; called outside a flow, the same
functions run in this process, one after the other. Shards are sorted first and every task's
output depends only on its inputs, so results are identical for any shard order or worker count;
a rerun queries only new or changed shards (``tasks/graph/edges.py`` says when that is exact).
Task parameters are names and digests only (docs/near-duplicates.md, "The driver's parameters at
scale"). Inputs are read from ``source`` (default: the output store); everything is written under
``graph/`` of the output store, so a new corpus version can be written beside an old one.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from corpusforge.contract import (COMPUTED, SKIPPED, FanOut, Unit, UnitResult, digest_of, in_process, keyed,
                                  marker_path, prune, remove_tree, require_markers, step_call, summarise,
                                  unit_fingerprint)
from corpusforge.layout import staging_records, staging_tar
from tasks.graph.files import (GRAPH_CROPS, GRAPH_DECISIONS, GRAPH_EDGES, GRAPH_FOUND, GRAPH_INDEX_DIR, GRAPH_NODES,
                               GRAPH_RECALL, GRAPH_REGIONS, GRAPH_REVIEW, GRAPH_ROUTED, GRAPH_SUMMARY, GRAPH_VERIFIED,
                               crops_path, edges_path, found_path, graph_digests_path, regions_path, review_path,
                               routed_path)
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.graph.build import build_index
from tasks.graph.calibration import calibration_sheet
from tasks.graph.collision import collision_models
from tasks.graph.config import NearDedupConfig
from tasks.graph.crops import crop_candidates_shard, describe_shard
from tasks.graph.decisions import decide_near_duplicates, read_decisions
from tasks.graph.edges import (EdgesInfo, FoundInfo, IndexInfo, feature_digests, found_fingerprint, graph_recall,
                               group_shards, merge_edges, merge_groups, node_degrees, query_shard, recall_shard,
                               route_pairs)
from tasks.graph.nodes import number_nodes, write_shard_digests, write_shard_table
from tasks.graph.review import select_review_pairs
from tasks.graph.self_calibration_unit import (calibrated, forget_self_calibration, self_calibrate,
                                             self_calibration_call)
from tasks.graph.verify import records_fingerprint, verify_shard
from tasks.shared.features.config import FeaturesConfig

__all__ = ["near_duplicate_stage", "read_decisions"]


QUERY_SHARD = Unit(query_shard, "graph-query-shard", probe=True)
RECALL_SHARD = Unit(recall_shard, "graph-recall-reference", probe=True)
ROUTE_PAIRS = Unit(route_pairs, "graph-route-pairs", probe=True)
MERGE_EDGES = Unit(merge_edges, "graph-merge-edges", probe=True)
RECALL = Unit(graph_recall, "graph-recall")
DECIDE = Unit(decide_near_duplicates, "graph-decisions", probe=True)
COLLISION = Unit(collision_models, "graph-collision-models", probe=True)
CALIBRATION = Unit(calibration_sheet, "graph-calibration-sheet", probe=True)
REVIEW = Unit(select_review_pairs, "graph-review-pairs", probe=True)
VERIFY = Unit(verify_shard, "graph-verify-pairs", probe=True)
SELF_CALIBRATE = Unit(self_calibrate, "graph-self-calibration", probe=True)
REGIONS = Unit(describe_shard, "graph-crop-regions", probe=True)
CROPS = Unit(crop_candidates_shard, "graph-crop-candidates", probe=True)


def near_duplicate_stage(store: Store, cfg: NearDedupConfig, shards: list[str], *, source: Store | None = None,
                         fan_out: FanOut = in_process, features: FeaturesConfig | None = None
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build the graph, decide every image, write reports; returns the stage summary (also
    ``graph/summary.json``) and how many units each step computed or skipped in this run.

    ``shards``: staging shard names, any order, each with completed features of ``cfg.model_id``;
    ``features``: the feature config, for ``cfg.calibrate: auto``. Per-key decisions: :func:`read_decisions`."""
    if not shards:
        raise ValueError("near-duplicate stage needs at least one staging shard")
    source = source or store
    nodes = number_nodes(source, shards)
    digests = feature_digests(source, cfg, nodes)
    store.write_json(GRAPH_NODES, nodes.to_json())
    for folder in (GRAPH_FOUND, GRAPH_RECALL, GRAPH_EDGES, GRAPH_DECISIONS, GRAPH_REVIEW, GRAPH_VERIFIED, GRAPH_REGIONS,
                   GRAPH_CROPS):
        prune(store, folder, nodes.shards)
    prune(store, GRAPH_INDEX_DIR, {"index", "recall_ids", "recall_vectors"})  # a killed writer's temp files
    table = write_shard_table(store, nodes, digests)
    self_calibration = None
    if cfg.calibrate == "auto":  # every threshold below is the calibrated one (tasks/graph/self_calibration_unit.py)
        call = self_calibration_call(source, store, cfg, features, nodes, table)
        self_calibration = fan_out(SELF_CALIBRATE, [call])[0]
        cfg = calibrated(cfg, self_calibration.info)
    else:  # switched off: no record or report left behind (equal to a fresh build)
        forget_self_calibration(store)
    index, blocks = build_index(source, store, cfg, table, fan_out)
    calls = shard_calls(source, store, cfg, table, digests, index)
    started = time.perf_counter()
    queried = fan_out(QUERY_SHARD, calls)
    work: dict[str, Any] = {"index": index.action,
                            **({"self_calibration": self_calibration.action} if self_calibration else {}),
                            "queries": summarise("graph.queries", queried).counts()}
    if blocks is not None:
        work["index_blocks"] = blocks.counts()
    work["query_seconds"] = round(time.perf_counter() - started, 3)
    references = fan_out(RECALL_SHARD, calls)
    merged, edges_digests, routing = _merge(store, nodes, table, cfg, fan_out)
    if _knn_cap_reached(store, cfg, nodes, queried):
        reused = [c for c, q in zip(calls, queried, strict=True) if q.action == SKIPPED]
        started = time.perf_counter()
        forced = fan_out(QUERY_SHARD, [dict(c, force=True) for c in reused])
        work["query_seconds"] += round(time.perf_counter() - started, 3)
        work["queries"][COMPUTED] += len(forced)
        work["queries"][SKIPPED] -= len(forced)
        work["queries"]["requeried_for_knn_cap"] = len(forced)
        by_shard = {q.info["shard"]: q for q in forced}
        queried = [by_shard.get(q.info["shard"], q) for q in queried]
        merged, edges_digests, routing = _merge(store, nodes, table, cfg, fan_out)
    work["capped_queries"] = sum(q.info["capped"] for q in queried)
    work["recall_references"] = summarise("graph.recall_references", references).counts()
    work["merge_routing"] = routing
    work["merges"] = summarise("graph.merges", merged).counts()

    staged = require_markers(source, [staging_tar(s) for s in nodes.shards], "staging shard")
    records = {s: m.outputs[staging_records(s)] for s, m in zip(nodes.shards, staged, strict=True)}
    records_digests = [records[s] for s in nodes.shards]
    code = code_version("tasks.graph.collision", "tasks.graph.calibration")
    cfp = unit_fingerprint("graph-collision", code, [cfg.model_id, cfg.seed, cfg.collision.model_dump(mode="json"),
                                                     cfg.index.model_dump(mode="json"), index.info["pair_score"]],
                           [nodes.to_json(), [digests[s] for s in nodes.shards]])
    kfp = unit_fingerprint("graph-calibration", code,
                           [cfg.calibration.model_dump(mode="json"), cfg.edge_min_similarity, cfg.component_link_above,
                            cfg.pair_removal_above, cfg.min_component_size, cfg.seed],
                           [edges_digests, records_digests, cfp if cfg.collision.enabled else None])
    lists = {kind: write_shard_digests(store, kind, nodes, d)
             for kind, d in (("edges", edges_digests), ("records", records_digests))}
    calls = single_calls(source, store, cfg, table, lists, index.info["n_vectors"],
                         {"collision": cfp, "calibration": kfp})
    recall = fan_out(keyed(RECALL), [step_call(  # keyed by what it reads: probed, no task run when current
        store, RECALL, cfg.model_dump(mode="json"),
        [table, index.fingerprint, index.digest, [r.digest for r in references], edges_digests],
        calls["recall"])])[0].info
    review = None
    if cfg.verifying:
        review = fan_out(REVIEW, [calls["review"]])[0]
        work["review"] = review.action
        records_fp = records_fingerprint(records)
        crops, cropped = _crop_candidates(source, store, cfg, nodes, table, digests, records, index, fan_out, work)
        verified = fan_out(VERIFY, [dict(source=source, out=store, cfg=cfg, shard_table=table, shard=s,
                                         review_digest=review.outputs[review_path(s)], records=records_fp,
                                         crops_digest=crops[s] if crops else None)
                                    for s in nodes.shards])
        work["verification"] = summarise("graph.verification", verified).counts()
        calls["decisions"]["verified"] = write_shard_digests(store, "verified", nodes,
                                                             [m.digest for m in verified])
    else:  # a rerun in gpic_exact leaves no review or verification files behind (equal to a fresh build)
        remove_tree(store, GRAPH_REVIEW, GRAPH_VERIFIED)
        store.remove(marker_path(GRAPH_REVIEW))
        store.remove(graph_digests_path("verified"))
        _forget_crops(store)
    later = [(DECIDE, calls["decisions"])]
    if cfg.collision.enabled:
        later.append((COLLISION, calls["collision"]))
    results = fan_out.each(later)
    decided = results[0]
    decisions = decided.info
    collision = results[1] if cfg.collision.enabled else None
    work["decisions"] = decided.action
    calibration = None
    if cfg.calibration.enabled:
        calibrated_sheet = fan_out(CALIBRATION, [calls["calibration"]])[0]
        work["calibration"], calibration = calibrated_sheet.action, calibrated_sheet.info
    if collision is not None:
        work["collision"] = collision.action

    summary = {
        "model_id": cfg.model_id,
        "shards": len(nodes.shards),
        "index": {"plan": index.info["plan"], "vectors": index.info["n_vectors"], "dim": index.info["dim"],
                  "gpu_build": index.info["gpu_build"], "gpu_search": any(q.info["gpu_search"] for q in queried),
                  "search": cfg.index.search, "k": cfg.index.k},
        "graph": {"threshold": cfg.edge_min_similarity, "search_threshold": cfg.search_min_similarity,
                  "pair_score": index.info["pair_score"],
                  "edges": sum(sum(m.info["edges"].values()) for m in merged),
                  "merge_tasks": len(merged)},
        "rule": "gpic_verified" if cfg.verifying else "gpic_exact",
        "verification": ({**cfg.verification.recorded(),
                          "band_pairs": review.info["band_pairs"],
                          "pairs": sum(m.info["pairs"] for m in verified),
                          "verified": sum(m.info["verified"] for m in verified),
                          "mirror_try": cfg.mirroring,  # review pairs tried again mirrored (tasks/graph/verify.py)
                          "verified_mirrored": sum(m.info["mirrored"] for m in verified),
                          "crop_candidates": cropped} if cfg.verifying else None),
        "recall": recall,
        "decisions": decisions,
        "collision": _collision_brief(collision.info) if collision else None,
        "calibration": calibration,
        **({"self_calibration": self_calibration.info} if self_calibration else {}),
    }
    store.write_json(GRAPH_SUMMARY, summary)
    return summary, work


def shard_calls(source: Store, out: Store, cfg: NearDedupConfig, table: str, digests: dict[str, str],
                index: UnitResult[IndexInfo]) -> list[dict[str, Any]]:
    """Parameters of the per-shard query and recall tasks: names and digests only (the
    shared tables are read from the file ``table`` names), so each stays a few KB at any S."""
    return [dict(source=source, out=out, cfg=cfg, shard_table=table, shard=s, digest=d, index=index)
            for s, d in sorted(digests.items())]


def single_calls(source: Store, out: Store, cfg: NearDedupConfig, table: str, lists: dict[str, str],
                 n_vectors: int, fps: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Parameters of the one-off tasks (recall, review, decisions, collision, calibration):
    the shard table's and the digest lists' SHA-256 (``lists``: edges, records; the stage
    adds decisions' ``verified`` once verification ran) and the fingerprints ``fps`` of
    collision and calibration, so each stays a few KB at any S."""
    common = dict(source=source, out=out, cfg=cfg, shard_table=table)
    return {"recall": dict(out=out, shard_table=table, cfg=cfg),
            "review": dict(out=out, cfg=cfg, shard_table=table, edges=lists["edges"]),
            "decisions": dict(common, edges=lists["edges"], records=lists["records"], verified=None),
            "collision": dict(common, n_vectors=n_vectors, fp=fps["collision"]),
            "calibration": dict(common, fp=fps["calibration"])}


def _crop_candidates(source: Store, store: Store, cfg: NearDedupConfig, nodes, table: str, digests: dict[str, str],
                     records: dict[str, str], index: UnitResult[IndexInfo], fan_out: FanOut, work: dict[str, Any]
                     ) -> tuple[dict[str, str] | None, dict[str, Any] | str]:
    """Each shard's crop candidates file digest, and what graph/summary.json says of them: how
    many candidates and pairs to verify, or why there are none. Off (no region or candidate
    file left behind, as in a fresh build) with crop_candidates 0, and with an IVF index: the
    search is exhaustive (tasks/graph/crops.py). ``work`` gets the units computed and skipped."""
    if not cfg.cropping or index.info["plan"]["kind"] != "flat":
        _forget_crops(store)
        return None, ("off: crop_candidates 0" if not cfg.cropping else
                      "off: the search is exhaustive, only with the flat index (index.flat_max_vectors)")
    described = fan_out(REGIONS, [dict(source=source, out=store, cfg=cfg, shard=s, records=records[s],
                                       features=digests[s]) for s in nodes.shards])
    regions = write_shard_digests(store, "regions", nodes, [m.outputs[regions_path(s)]
                                                            for s, m in zip(nodes.shards, described, strict=True)])
    found = fan_out(CROPS, [dict(source=source, out=store, cfg=cfg, shard_table=table, shard=s, regions=regions,
                                 index=index) for s in nodes.shards])
    work["crop_regions"] = summarise("graph.crop_regions", described).counts()
    work["crop_candidates"] = summarise("graph.crop_candidates", found).counts()
    return ({s: m.outputs[crops_path(s)] for s, m in zip(nodes.shards, found, strict=True)},
            {"k": cfg.crop_candidates, "floor": cfg.crop_floor, "candidates": sum(m.info["candidates"] for m in found),
             "pairs": sum(m.info["pairs"] for m in found)})


def _forget_crops(store: Store) -> None:
    remove_tree(store, GRAPH_REGIONS, GRAPH_CROPS)
    store.remove(graph_digests_path("regions"))


def _merge(store: Store, nodes, table: str, cfg: NearDedupConfig, fan_out: FanOut
           ) -> tuple[list[UnitResult[EdgesInfo]], list[str], str]:
    """Symmetric edge files from the current found files (routed to their merge groups by one
    task, then one merge task per group): each group's result, every edge file's marker
    digest in node order (what the one-off units are keyed by) and the routing's action."""
    digests, pairs = [], []
    for m in require_markers(store, [found_path(s) for s in nodes.shards], "graph query"):  # side by side
        digests.append(m.digest)
        pairs.append(m.info["pairs"])
    groups = merge_groups(nodes, pairs, cfg.advanced.merge_max_edges)
    routed = fan_out(ROUTE_PAIRS, [dict(out=store, shard_table=table, found=found_fingerprint(digests),
                                        n_groups=len(groups))])[0]
    prune(store, GRAPH_ROUTED, {first for first, _ in groups})  # another grouping's files
    merged = fan_out(MERGE_EDGES, [dict(out=store, shard_table=table, group=g, routed=routed.outputs[routed_path(g[0])])
                                   for g in groups])
    digests = [digest_of({edges_path(s): m.outputs[edges_path(s)]})  # each shard's edge marker's (one file)
               for g, m in zip(groups, merged, strict=True) for s in group_shards(nodes, g)]
    return merged, digests, routed.action


def _knn_cap_reached(store: Store, cfg: NearDedupConfig, nodes, queried: list[UnitResult[FoundInfo]]) -> bool:
    """True when reused k-NN results may differ from a fresh build's (see tasks/graph/edges.py)."""
    actions = {q.action for q in queried}
    if actions != {COMPUTED, SKIPPED}:
        return False
    if any(q.info["capped"] for q in queried):
        return True
    if cfg.index.search != "knn":
        return False
    degree = node_degrees(store, nodes)
    reused = np.zeros(nodes.n_nodes, dtype=bool)
    for q in queried:
        if q.action == SKIPPED:
            lo, hi = nodes.span(q.info["shard"])
            reused[lo:hi] = True
    return bool((degree[reused] >= cfg.index.k - 1).any())


def _collision_brief(result: dict[str, Any]) -> dict[str, Any]:
    return {"full_size": result["full_size"], "target_size": result["target_size"],
            "fraction_scale": result["fraction_scale"],
            "counted_whole": result.get("counted_whole", False),
            "fits": {t: {k: f.get(k) for k in ("fitted", "reason", "points", "fit_sizes", "A", "beta", "r2",
                                               "actual_full", "predicted_full", "predicted_full_note",
                                               "predicted_target", "predicted_target_note")}
                     for t, f in result["fits"].items()}}
