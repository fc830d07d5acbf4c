"""The similarity graph on disk: index build, per-shard queries, symmetric edge files, recall.

Files under the output root (inputs — features, records — come from the source root):

    graph/index/index.faiss (+ .done.json)   the index with global node ids
    graph/index/recall_ids.npy, recall_vectors.npy   the recall sample (seeded by key hash)
    graph/found/{shard}.parquet              pairs found by that shard's queries (src < dst)
    graph/recall/{shard}.parquet             exhaustive pairs of the recall sample vs the shard
    graph/edges/{shard}.parquet              the graph: each unordered pair once, owned by the
                                             shard of its smaller id, max similarity of both sides

Why two edge layers: a pair can be found from either side (or, approximately, from
one side only) by tasks of different shards. ``found`` files hold what each query task
saw; ``merge_edges`` tasks then gather, for a contiguous group of owner shards, the
pairs whose smaller id falls in the group (a filtered read of every ``found`` file,
pushed down to parquet row groups since files are sorted by ``src``) and keep each pair
once with the max similarity. Groups are sized by ``merge_max_edges``, so memory per
task is bounded however large the corpus.

PQ codes give approximate scores: the shard's queries then search at ``threshold -
pq_rescore_margin`` and every candidate is rescored as the exact dot product of the
two unit vectors, read from the feature files of the shards the candidates live in.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.hashing import fingerprint, stable_uniform
from corpusforge.storage import Store
from tasks.features.layout import feature_path
from tasks.graph import index as fx
from tasks.graph.config import NearDedupConfig
from tasks.graph.nodes import NodeTable, load_shard_vectors

INDEX_PATH = "graph/index/index.faiss"
RECALL_IDS = "graph/index/recall_ids.npy"
RECALL_VECTORS = "graph/index/recall_vectors.npy"

EDGE_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("similarity", pa.float32())])


def found_path(shard: str) -> str:
    return f"graph/found/{shard}.parquet"


def recall_path(shard: str) -> str:
    return f"graph/recall/{shard}.parquet"


def edges_path(shard: str) -> str:
    return f"graph/edges/{shard}.parquet"


def edge_table(src: np.ndarray, dst: np.ndarray, sim: np.ndarray) -> pa.Table:
    return pa.table({"src": src, "dst": dst, "similarity": sim}, schema=EDGE_SCHEMA)


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _load_npy(store: Store, rel: str) -> np.ndarray:
    return np.load(io.BytesIO(store.read_bytes(rel)), allow_pickle=False)


def _feature_markers(source: Store, cfg: NearDedupConfig, nodes: NodeTable) -> list[dict]:
    markers = []
    for shard in nodes.shards:
        info = source.read_done(feature_path(cfg.model_id, shard))
        if info is None:
            raise FileNotFoundError(f"features/{cfg.model_id}/{shard} is not complete")
        markers.append(info)
    return markers


def _sample(seed: int, salt: str, keys: list[str], rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``keys`` chosen at ``rate`` by a seeded key hash, and their hash values."""
    u = np.fromiter((stable_uniform(seed, f"{salt}:{k}") for k in keys), dtype=np.float64, count=len(keys))
    pick = np.flatnonzero(u < rate)
    return pick, u[pick]


def build_index(source: Store, out: Store, cfg: NearDedupConfig, nodes: NodeTable) -> dict[str, Any]:
    """Build and save the index (skipped if already built with the same fingerprint).

    Returns the index info: plan, fingerprint, vector count, recall sample size.
    """
    markers = _feature_markers(source, cfg, nodes)
    n_vectors = sum(int(m["count"]) for m in markers)
    dims = {int(m["dim"]) for m in markers if int(m["count"])}
    if len(dims) > 1:
        raise ValueError(f"features/{cfg.model_id}: shards disagree on the dimension: {sorted(dims)}")
    dim = dims.pop() if dims else 1
    plan = fx.plan_index(cfg.index, n_vectors, dim)
    fp = fingerprint("graph-index", plan.to_json(), cfg.seed, cfg.recall_queries, nodes.to_json(),
                     [m.get("fingerprint") for m in markers], [int(m["count"]) for m in markers])
    done = out.read_done(INDEX_PATH)
    if done is not None and done.get("fingerprint") == fp:
        return done
    fx.set_threads(cfg.index.faiss_threads)
    index = fx.new_index(plan, cfg.seed)
    gpu = False
    if plan.kind == "ivf":
        sample, order = [], []
        rate = plan.n_train / max(n_vectors, 1)
        for shard, offset in zip(nodes.shards, nodes.offsets[:-1], strict=False):
            _, keys, x = load_shard_vectors(source, cfg.model_id, shard, int(offset))
            pick, u = _sample(cfg.seed, "train", keys, rate)
            sample.append(x[pick])
            order.append(u)
        train = np.concatenate(sample)[np.argsort(np.concatenate(order), kind="stable")]
        index, gpu = fx.maybe_gpu(index, cfg.index.use_gpu)
        fx.train_index(index, train)
        del train, sample
    recall_ids, recall_vecs, recall_u = [], [], []
    rate = cfg.recall_queries / max(n_vectors, 1)
    for shard, offset in zip(nodes.shards, nodes.offsets[:-1], strict=False):
        ids, keys, x = load_shard_vectors(source, cfg.model_id, shard, int(offset))
        if len(ids):
            index.add_with_ids(x, ids)
        pick, u = _sample(cfg.seed, "recall", keys, rate)
        recall_ids.append(ids[pick])
        recall_vecs.append(x[pick])
        recall_u.append(u)
    if gpu:
        index = faiss.index_gpu_to_cpu(index)
    q_ids = np.concatenate(recall_ids) if recall_ids else np.zeros(0, np.int64)
    q = np.concatenate(recall_vecs) if recall_vecs else np.zeros((0, dim), np.float32)
    order = np.argsort(q_ids)
    out.write_bytes(RECALL_IDS, _npy_bytes(q_ids[order]))
    out.write_bytes(RECALL_VECTORS, _npy_bytes(q[order]))
    with out.atomic_write(INDEX_PATH) as f:
        fx.write_index(index, f)
    info = {"fingerprint": fp, "plan": plan.to_json(), "n_vectors": n_vectors, "dim": dim,
            "recall_queries": int(len(q_ids)), "gpu_build": gpu}
    out.mark_done(INDEX_PATH, info)
    return info


_INDEX_CACHE: dict[tuple[str, str], Any] = {}


def load_index(out: Store, info: dict[str, Any], use_gpu: bool) -> tuple[Any, bool]:
    """The saved index, loaded once per process (the last one only) and kept for later tasks."""
    key = (out.root, info["fingerprint"])
    if key not in _INDEX_CACHE:
        _INDEX_CACHE.clear()
        with out.open(INDEX_PATH) as f:
            index = fx.read_index(f, nprobe=info["plan"]["nprobe"])
        _INDEX_CACHE[key] = fx.maybe_gpu(index, use_gpu)
    return _INDEX_CACHE[key]


def query_fingerprint(cfg: NearDedupConfig, info: dict[str, Any]) -> str:
    return fingerprint("graph-query", info["fingerprint"], cfg.graph_threshold, cfg.index.search,
                       cfg.index.k, cfg.index.pq_rescore_margin)


class VectorLookup:
    """Exact unit vectors by node id, loading each shard's features once (PQ rescoring)."""

    def __init__(self, source: Store, model_id: str, nodes: NodeTable):
        self.source, self.model_id, self.nodes = source, model_id, nodes
        self.loaded: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, shard_index: int, ids: np.ndarray, x: np.ndarray) -> None:
        self.loaded[shard_index] = (ids, x)

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        owner = self.nodes.shard_of(ids)
        out = None
        for s in np.unique(owner):
            if int(s) not in self.loaded:
                shard = self.nodes.shards[s]
                sids, _, sx = load_shard_vectors(self.source, self.model_id, shard, int(self.nodes.offsets[s]))
                self.loaded[int(s)] = (sids, sx)
            sids, sx = self.loaded[int(s)]
            rows = np.flatnonzero(owner == s)
            pos = np.searchsorted(sids, ids[rows])
            if out is None:
                out = np.empty((len(ids), sx.shape[1]), dtype=np.float32)
            out[rows] = sx[pos]
        return out if out is not None else np.zeros((0, 1), np.float32)


def query_shard(source: Store, out: Store, cfg: NearDedupConfig, nodes: NodeTable, shard: str,
                info: dict[str, Any]) -> dict[str, Any]:
    """Search one shard's vectors against the index; write its found pairs and recall pairs."""
    qfp = query_fingerprint(cfg, info)
    done = out.read_done(found_path(shard))
    if done is not None and done.get("fingerprint") == qfp:
        return done
    fx.set_threads(cfg.index.faiss_threads)
    index, on_gpu = load_index(out, info, cfg.index.use_gpu)
    lo, _ = nodes.span(shard)
    ids, _, x = load_shard_vectors(source, cfg.model_id, shard, lo)
    plan = fx.IndexPlan(**{k: v for k, v in info["plan"].items() if k != "factory"})
    threshold = cfg.graph_threshold - (0.0 if plan.exact_scores else cfg.index.pq_rescore_margin)
    src, dst, sim = fx.search_pairs(index, ids, x, threshold, cfg.index.search, cfg.index.k,
                                    range_ok=not on_gpu)
    candidates = len(src)
    if not plan.exact_scores and len(src):
        lookup = VectorLookup(source, cfg.model_id, nodes)
        lookup.add(nodes.shards.index(shard), ids, x)
        sim = np.einsum("ij,ij->i", x[np.searchsorted(ids, src)], lookup.vectors(dst)).astype(np.float32)
        keep = sim >= np.float32(cfg.graph_threshold)
        src, dst, sim = src[keep], dst[keep], sim[keep]
    a, b, s = fx.canonical_pairs(src, dst, sim)
    out.write_parquet(found_path(shard), edge_table(a, b, s))
    q_ids = _load_npy(out, RECALL_IDS)
    q = _load_npy(out, RECALL_VECTORS)
    rq, rd, rs = fx.exhaustive_pairs(q_ids, q, ids, x, cfg.graph_threshold)
    out.write_parquet(recall_path(shard), edge_table(rq, rd, rs))
    marker = {"fingerprint": qfp, "shard": shard, "queries": int(len(ids)), "candidates": int(candidates),
              "pairs": int(len(a)), "recall_pairs": int(len(rq)), "gpu_search": bool(on_gpu)}
    out.mark_done(found_path(shard), marker)
    return marker


def merge_groups(nodes: NodeTable, found_pairs: list[int], max_edges: int) -> list[list[str]]:
    """Contiguous groups of owner shards, about ``max_edges`` found pairs per group."""
    total = sum(found_pairs)
    n_groups = max(1, min(len(nodes.shards), -(-total // max_edges)))
    return [list(g) for g in np.array_split(np.array(nodes.shards, dtype=object), n_groups) if len(g)]


def merge_fingerprint(query_fps: list[str]) -> str:
    return fingerprint("graph-edges", query_fps)


def merge_edges(out: Store, nodes: NodeTable, group: list[str], mfp: str) -> dict[str, int]:
    """Write ``graph/edges/{shard}.parquet`` for a group of owner shards; return edge counts."""
    if all(out.is_done(edges_path(s), mfp) for s in group):
        return {s: int(out.read_done(edges_path(s))["edges"]) for s in group}
    lo, _ = nodes.span(group[0])
    _, hi = nodes.span(group[-1])
    parts = []
    for shard in nodes.shards:
        with out.open(found_path(shard)) as f:
            parts.append(pq.read_table(f, filters=[("src", ">=", lo), ("src", "<", hi)]))
    table = pa.concat_tables(parts)
    a, b, s = fx.canonical_pairs(table["src"].to_numpy(), table["dst"].to_numpy(),
                                 table["similarity"].to_numpy())
    owner = nodes.shard_of(a)
    counts = {}
    for shard in group:
        i = nodes.shards.index(shard)
        sel = owner == i
        out.write_parquet(edges_path(shard), edge_table(a[sel], b[sel], s[sel]))
        out.mark_done(edges_path(shard), {"fingerprint": mfp, "edges": int(sel.sum())})
        counts[shard] = int(sel.sum())
    return counts


def iter_edges(out: Store, nodes: NodeTable, min_similarity: float | None = None
               ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The graph's edges one shard file at a time (never the whole graph in memory)."""
    for shard in nodes.shards:
        t = out.read_parquet(edges_path(shard))
        src, dst, sim = t["src"].to_numpy(), t["dst"].to_numpy(), t["similarity"].to_numpy()
        if min_similarity is not None:
            keep = sim > np.float32(min_similarity)
            src, dst, sim = src[keep], dst[keep], sim[keep]
        yield src, dst, sim


def graph_recall(out: Store, nodes: NodeTable, cfg: NearDedupConfig) -> dict[str, Any]:
    """Share of exhaustive-search pairs of the recall sample that the graph holds.

    Reference: every pair (sample query, any vector) with similarity >= threshold +
    ``recall_tolerance`` by a numpy product (the margin absorbs float16 index scores
    and float32 summation-order differences at the boundary). With k-NN search a
    node's pairs beyond its k-1 nearest count as misses too: this is the recall of the
    graph, not of the index.
    """
    q_ids = _load_npy(out, RECALL_IDS)
    ref = pa.concat_tables([out.read_parquet(recall_path(s)) for s in nodes.shards])
    rs = ref["similarity"].to_numpy()
    must = rs >= np.float32(cfg.graph_threshold + cfg.recall_tolerance)
    ra, rb, _ = fx.canonical_pairs(ref["src"].to_numpy()[must], ref["dst"].to_numpy()[must], rs[must])
    n = np.int64(max(nodes.n_nodes, 1))
    want = ra * n + rb
    found = []
    for src, dst, _ in iter_edges(out, nodes):
        hit = np.isin(src, q_ids) | np.isin(dst, q_ids)
        found.append(src[hit] * n + dst[hit])
    have = np.concatenate(found) if found else np.zeros(0, np.int64)
    hits = int(np.isin(want, have).sum())
    return {"queries": int(len(q_ids)), "reference_pairs": int(len(want)), "found": hits,
            "recall": (hits / len(want)) if len(want) else None, "tolerance": cfg.recall_tolerance}
