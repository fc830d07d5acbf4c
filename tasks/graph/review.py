"""Which review-band pairs are verified: every image's ``review_k`` most similar band partners.

The review band (mode ``gpic_verified``) is every edge with similarity in
``[review_min_similarity, pair_removal_above]``. Verifying all of it costs as many checks as the band has pairs, which
grows with N² (unrelated pairs at a fixed similarity are a fixed share of all pairs). A
copy, though, is almost always among its original's closest images (on the sample the
original is the copy's nearest neighbour for all 181 planted pairs), so a pair is
verified when it is among the ``review_k`` highest-scoring band pairs of either of its
images: at most N * review_k checks, plus exact ties.

The choice is a function of the merged edge table alone (per node, the k-th largest band
similarity; a pair is chosen when it reaches that of either end), so a rerun writes the same
files as a fresh build and verifies only pairs with a new image (docs/near-duplicates.md).

One unit (the choice is global): pass 1 streams the edge files into a float32 [N, k]
array of each node's best band similarities (0.4 GB per k at 10^8 nodes, 2.8 GB at k = 7); pass 2 writes
``graph/review/{shard}.parquet`` (src, dst, similarity) per owner shard.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from corpusforge.contract import UnitResult, run_unit, unit_fingerprint
from tasks.graph.files import GRAPH_REVIEW, review_path
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.graph.config import NearDedupConfig
from tasks.graph.edges import edge_table, iter_edges
from tasks.graph.nodes import NodeTable, read_shard_digests, read_shard_table


def in_band(sim: np.ndarray, cfg: NearDedupConfig) -> np.ndarray:
    """Similarities in the review band [review_min_similarity, pair_removal_above] (float32 comparisons)."""
    return (sim >= np.float32(cfg.verification.review_min_similarity)) & ~(sim > np.float32(cfg.pair_removal_above))


def update_top_k(top: np.ndarray, nodes: np.ndarray, sims: np.ndarray) -> None:
    """Merge (node, similarity) observations into ``top`` ([N, k], descending per row), in place."""
    if not len(nodes):
        return
    k = top.shape[1]
    touched = np.unique(nodes)
    ids = np.concatenate([np.repeat(touched, k), nodes])
    vals = np.concatenate([top[touched].ravel(), sims.astype(np.float32)])
    order = np.lexsort((-vals, ids))
    ids, vals = ids[order], vals[order]
    start = np.searchsorted(ids, touched)
    rank = np.arange(len(ids)) - np.repeat(start, np.diff(np.append(start, len(ids))))
    keep = rank < k
    top[ids[keep], rank[keep]] = vals[keep]


def chosen(src: np.ndarray, dst: np.ndarray, sim: np.ndarray, kth: np.ndarray) -> np.ndarray:
    """Pairs among the k best of either end: similarity >= that end's k-th best band similarity."""
    return (sim >= kth[src]) | (sim >= kth[dst])


def kth_best(out: Store, nodes: NodeTable, cfg: NearDedupConfig) -> np.ndarray:
    """Each node's k-th largest band similarity (-inf with fewer than k band partners)."""
    top = np.full((nodes.n_nodes, cfg.verification.review_k), -np.inf, dtype=np.float32)
    for src, dst, sim in iter_edges(out, nodes):
        band = in_band(sim, cfg)
        update_top_k(top, np.concatenate([src[band], dst[band]]).astype(np.int64), np.concatenate([sim[band]] * 2))
    return top[:, -1]


def select_review_pairs(out: Store, cfg: NearDedupConfig, shard_table: str, edges: str) -> UnitResult:
    """Write the chosen band pairs of every owner shard (one unit); returns the marker.

    ``shard_table``, ``edges``: SHA-256 of the stage's shard table and of its list of edge
    file digests (tasks/graph/nodes.py); the fingerprint holds the node table and that list."""
    vc = cfg.verification
    nodes = read_shard_table(out, shard_table)[0]
    fp = unit_fingerprint("graph-review", code_version(__name__),
                          [vc.review_min_similarity, vc.review_k, cfg.pair_removal_above],
                          [nodes.to_json(), read_shard_digests(out, "edges", edges, nodes)])

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        kth = kth_best(out, nodes, cfg)
        outputs, band_pairs, pairs = {}, 0, 0
        for shard, (src, dst, sim) in zip(nodes.shards, iter_edges(out, nodes), strict=True):
            band = in_band(sim, cfg)
            src, dst, sim = src[band].astype(np.int64), dst[band].astype(np.int64), sim[band]
            pick = chosen(src, dst, sim, kth)
            band_pairs += len(src)
            pairs += int(pick.sum())
            outputs[review_path(shard)] = out.write_parquet(review_path(shard), edge_table(src[pick], dst[pick],
                                                                                         sim[pick]))
        return outputs, {"band_pairs": band_pairs, "pairs": pairs}

    return run_unit(out, GRAPH_REVIEW, fp, compute)
