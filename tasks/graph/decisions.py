"""Per-shard near-duplicate decisions from the edge files: one global pass, bounded memory.

Reads ``graph/edges/*`` (twice, streamed), ``staging/records/{shard}.parquet`` (twice:
sizes and hashes, then keys), writes ``graph/decisions/{shard}.parquet`` — one row per
image of the shard, in shard order — and ``graph/components_report.json``.

Memory at 10^8 nodes, one process: parent, rank, partner, duplicate_of, component
sizes, resolution and SHA-256 prefixes as int64 per node (~5.6 GB), max similarity as
float32 (0.4 GB), plus the keys of nodes that have candidate edges (<= 96 B each) and
the edges of big components for the chaining report. Edges are never all in memory.

Pass 1 (edges > candidate threshold; in mode gpic_verified > pair threshold, plus the
verified pairs): union-find, max similarity, which nodes have
edges. Then records: resolution for all nodes, keys for nodes with edges → the priority
rank (resolution desc, key asc). Pass 2: tier-1 partners and the big components' edges.
Then :func:`tasks.graph.two_tier.decide`, the chaining report, the SHA-256 guard, and
the decision files.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.contract import UnitResult, read_marker, run_unit, unit_fingerprint
from tasks.graph.files import GRAPH_COMPONENTS_REPORT, GRAPH_DECISIONS, NEAR_DECISION_SCHEMA, decisions_path
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.graph.chaining import component_metrics, components_report
from tasks.graph.components import UnionFind, component_sizes
from tasks.graph.config import NearDedupConfig
from tasks.graph.edges import iter_edges
from tasks.graph.nodes import NodeTable, read_shard_digests, read_shard_table, records_path
from tasks.graph.two_tier import (COMPONENT, TIER1, VERIFIED, VERIFIED_CROP, VERIFIED_MIRROR, TierOnePartners,
                                  decide, keys_as_bytes, priority_rank, reason_texts)
from tasks.graph.verify import iter_verified


class DuplicateContentError(RuntimeError):
    """Two kept images have the same SHA-256: exact dedup upstream did not hold."""


def _sha_prefix(hexes: list[str | None]) -> np.ndarray:
    """First 64 bits of each SHA-256 (0 when missing); equal hashes give equal prefixes."""
    return np.fromiter((int(h[:16], 16) if h else 0 for h in hexes), dtype=np.uint64, count=len(hexes))


def check_unique_sha(source: Store, nodes: NodeTable, kept: np.ndarray, prefix: np.ndarray) -> None:
    """Raise :class:`DuplicateContentError` if two kept images share a SHA-256 (candidates from equal
    64-bit prefixes, confirmed on the full hashes)."""
    ids = np.flatnonzero(kept & (prefix != 0))
    p = prefix[ids]
    order = np.argsort(p, kind="stable")
    p, ids = p[order], ids[order]
    dup = np.zeros(len(p), dtype=bool)
    dup[1:] = p[1:] == p[:-1]
    dup[:-1] |= dup[1:]
    suspects = np.sort(ids[dup])
    if not len(suspects):
        return
    full: dict[str, list[str]] = {}
    for s in np.unique(nodes.shard_of(suspects)):
        shard = nodes.shards[s]
        t = source.read_parquet(records_path(shard), columns=["key", "sha256"])
        rows = suspects[nodes.shard_of(suspects) == s] - nodes.offsets[s]
        keys, shas = t["key"].to_pylist(), t["sha256"].to_pylist()
        for r in rows:
            full.setdefault(shas[r], []).append(keys[r])
    clashes = {h: ks for h, ks in full.items() if len(ks) > 1}
    if clashes:
        sample = dict(sorted(clashes.items())[:5])
        raise DuplicateContentError(
            f"{len(clashes)} SHA-256 values are shared by kept images after near-duplicate removal "
            f"(exact dedup must run first): {sample}")


def decide_near_duplicates(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str, edges: str,
                           records: str, verified: str | None = None) -> UnitResult:
    """Two-tier decisions for every image (one unit: the rule is global); returns the marker.

    ``shard_table``: SHA-256 of the stage's shard table; ``edges``, ``records``,
    ``verified``: of its per-shard digest lists of the edge, staging records and
    verification files (tasks/graph/nodes.py; ``verified`` None when nothing is verified).

    With ``cfg.verifying`` (mode gpic_verified) the candidate graph is the pairs above the
    pair threshold plus the verified review pairs (``graph/verified/``), which act as
    tier-1 pairs: below the pair threshold a similarity alone links nothing."""
    nodes = read_shard_table(out, shard_table)[0]
    lists = [read_shard_digests(out, kind, digest, nodes) if digest is not None else None
             for kind, digest in (("edges", edges), ("records", records), ("verified", verified))]
    adv = cfg.advanced
    fp = unit_fingerprint("graph-decisions", code_version(__name__, "tasks.graph.two_tier"),
                          [cfg.component_link_above, cfg.pair_removal_above, cfg.min_component_size,
                           adv.chain_min_hop1_fraction, adv.chain_max_hops, adv.report_top, cfg.verifying,
                           cfg.verification.min_inliers if cfg.verifying else None, cfg.cropping, cfg.mirroring],
                          [nodes.to_json(), *lists])
    return run_unit(out, GRAPH_DECISIONS, fp, lambda: _decide(source, out, cfg, nodes))


def _decide(source: Store, out: Store, cfg: NearDedupConfig, nodes: NodeTable
            ) -> tuple[dict[str, str], dict[str, Any]]:
    n = nodes.n_nodes
    ct = cfg.link_above
    uf = UnionFind(n)
    max_sim = np.zeros(n, dtype=np.float32)
    involved = np.zeros(n, dtype=bool)
    n_edges = n_candidate = 0
    for src, dst, sim in iter_edges(out, nodes):
        # the graph proper: edges >= edge_min_similarity (the files also hold review-band pairs
        # below it when verifying; those count only through graph/verified/)
        graph = sim >= np.float32(cfg.edge_min_similarity)
        src, dst, sim = src[graph], dst[graph], sim[graph]
        n_edges += len(src)
        np.maximum.at(max_sim, src, sim)
        np.maximum.at(max_sim, dst, sim)
        cand = sim > np.float32(ct)
        n_candidate += int(cand.sum())
        involved[src[cand]] = involved[dst[cand]] = True
        uf.union(src[cand], dst[cand])
    if cfg.verifying:
        for src, dst, _, _ in iter_verified(out, nodes):
            involved[src] = involved[dst] = True
            uf.union(src, dst)
    roots = uf.roots()
    del uf
    sizes = component_sizes(roots)

    resolution = np.zeros(n, dtype=np.int64)
    sha_prefix = np.zeros(n, dtype=np.uint64)
    inv_keys = []
    for i, shard in enumerate(nodes.shards):
        lo, hi = int(nodes.offsets[i]), int(nodes.offsets[i + 1])
        t = source.read_parquet(records_path(shard), columns=["key", "width", "height", "sha256"])
        resolution[lo:hi] = (t["width"].to_numpy(zero_copy_only=False).astype(np.int64)
                             * t["height"].to_numpy(zero_copy_only=False).astype(np.int64))
        sha_prefix[lo:hi] = _sha_prefix(t["sha256"].to_pylist())
        rows = np.flatnonzero(involved[lo:hi])
        keys = t["key"].to_pylist()
        inv_keys.append(keys_as_bytes([keys[r] for r in rows]))
    inv_ids = np.flatnonzero(involved)
    inv_key_bytes = np.concatenate(inv_keys) if inv_keys else np.zeros(0, "S1")
    rank = n + np.arange(n, dtype=np.int64)  # nodes without edges: unique, never compared
    rank[inv_ids] = priority_rank(resolution[inv_ids], inv_key_bytes)

    tier1 = TierOnePartners(n, cfg.pair_removal_above)
    big_edges: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for src, dst, sim in iter_edges(out, nodes, min_similarity=ct):
        tier1.add(src, dst, sim, rank)
        big = sizes[src] >= cfg.min_component_size
        big_edges.append((src[big], dst[big], sim[big]))
    verified = None
    if cfg.verifying:  # verified pairs: tier-1 partners of their own (any score passes; a review pair
        verified = TierOnePartners(n, -np.inf)  # before a mirrored one, before a crop)
        for src, dst, crop, flip in iter_verified(out, nodes):
            verified.add(src, dst, np.where(crop, 0, np.where(flip, 0.5, 1)).astype(np.float32), rank)
    d = decide(roots, sizes, rank, tier1.partner, cfg.min_component_size,
               None if verified is None else verified.partner)
    if verified is not None:  # removed through a crop candidate (tasks/graph/crops.py) or a mirrored pair
        d.code[(d.code == VERIFIED) & (verified.partner_sim == 0)] = VERIFIED_CROP
        d.code[(d.code == VERIFIED) & (verified.partner_sim == 0.5)] = VERIFIED_MIRROR
    del tier1, verified

    def key_of(ids: np.ndarray) -> list[str]:
        return [k.decode("ascii") for k in inv_key_bytes[np.searchsorted(inv_ids, ids)]]

    adv = cfg.advanced
    bs, bd, bw = (np.concatenate([e[i] for e in big_edges]) if big_edges else np.zeros(0) for i in range(3))
    metrics = component_metrics(roots, sizes, d.kept_of_root, bs.astype(np.int64), bd.astype(np.int64),
                                bw.astype(np.float32), cfg.min_component_size,
                                adv.chain_min_hop1_fraction, adv.chain_max_hops)
    listed = np.unique(metrics.kept)
    report = components_report(metrics, dict(zip(listed.tolist(), key_of(listed), strict=True)),
                               adv.report_top, {"min_component_size": cfg.min_component_size,
                                                "chain_min_hop1_fraction": adv.chain_min_hop1_fraction,
                                                "chain_max_hops": adv.chain_max_hops})
    check_unique_sha(source, nodes, d.code == 0, sha_prefix)

    reasons = reason_texts(cfg.pair_removal_above, cfg.min_component_size,
                           cfg.verification.min_inliers if cfg.verifying else None, cfg.cropping, cfg.mirroring)
    outputs = {}
    for i, shard in enumerate(nodes.shards):
        lo, hi = int(nodes.offsets[i]), int(nodes.offsets[i + 1])
        keys = source.read_parquet(records_path(shard), columns=["key"])["key"].to_pylist()
        code = d.code[lo:hi]
        dup = d.duplicate_of[lo:hi]
        removed = np.flatnonzero(code != 0)
        dup_keys: list[str | None] = [None] * (hi - lo)
        for r, k in zip(removed.tolist(), key_of(dup[removed]), strict=True):
            dup_keys[r] = k
        table = pa.table({
            "key": keys,
            "status": [Status.NEAR_DUPLICATE.value if c else Status.KEPT.value for c in code.tolist()],
            "reason": [reasons[c] for c in code.tolist()],
            "duplicate_of": dup_keys,
            "component_id": roots[lo:hi],
            "component_size": sizes[lo:hi],
            "max_similarity": max_sim[lo:hi],
        }, schema=NEAR_DECISION_SCHEMA)
        outputs[decisions_path(shard)] = out.write_parquet(decisions_path(shard), table)
    outputs[GRAPH_COMPONENTS_REPORT] = out.write_json(GRAPH_COMPONENTS_REPORT, report)
    summary = {
        "images": n, "edges": n_edges, "candidate_edges": n_candidate,
        "images_with_candidate_edges": int(involved.sum()),
        "kept": int((d.code == 0).sum()), "removed": int((d.code != 0).sum()),
        "removed_by_rule": {reasons[c]: int((d.code == c).sum())
                            for c in (TIER1, COMPONENT, VERIFIED, VERIFIED_CROP, VERIFIED_MIRROR)
                            if c in reasons},
        "components_with_edges": int(((roots == np.arange(n)) & (sizes > 1)).sum()),
        "big_components": report["big_components"], "flagged_components": report["flagged_components"],
        "images_in_flagged_components": report["images_in_flagged_components"],
        "largest_components": report["largest"][:5], "flagged": report["flagged"][:5],
    }
    return outputs, summary


def read_decisions(store: Store, shards: list[str]) -> pa.Table:
    """All decisions of ``shards`` (sorted), with a ``staging_shard`` column: per-key lookups.

    A shard without a decisions file of the current decision run is an error, never
    "no decisions"."""
    marker = read_marker(store, GRAPH_DECISIONS)
    if marker is None:
        raise FileNotFoundError(f"{store.path(GRAPH_DECISIONS)}: near-duplicate decisions were never completed")
    missing = [s for s in shards if decisions_path(s) not in marker.outputs]
    if missing:
        raise FileNotFoundError(f"near-duplicate decisions are missing for staging shards {missing[:5]} "
                                f"({len(missing)} in all): run the near-duplicate stage over them")
    parts = []
    for shard in sorted(shards):
        t = store.read_parquet(decisions_path(shard))
        parts.append(t.append_column("staging_shard", pa.array([shard] * len(t), pa.string())))
    return pa.concat_tables(parts)
