"""The similarity graph on disk: per-shard queries, symmetric edge files, recall.

Files (paths and schemas: tasks/graph/files.py): ``work/graph/found/{shard}``, the pairs a shard's
queries found, addressed as (src_row, dst_shard, dst_row) with the digest of the dst shard's
features they were found in; ``graph/recall/{shard}``, exhaustive pairs of the recall sample vs the
shard; ``graph/edges/{shard}``, the graph: each unordered pair once (global node ids), owned by the
shard of its smaller id, from ``cfg.search_min_similarity`` up.

Incremental queries (the stage contract). A shard's ``found`` file is addressed by shard
and row, not by global id, so it stays valid while the shards it points at keep their
feature digests; at merge time a pair is used only if its ``dst_digest`` is the dst
shard's current one. With the exact (flat) index a query's result depends only on the
query and on the vectors it finds, so a rerun queries only shards whose features changed
— new and changed shards find their pairs with unchanged ones from their own side — and
the union is exactly a fresh build's graph, because every similarity is the canonical
score (float64 dot product of the two unit vectors, rounded to float32: the same from
either side; for wfd the pair rule of tasks/shared/pair_score.py) and queries search a hair
below the threshold. A k-NN query's cap and an IVF quantiser make results depend on the whole
index: those cases query every shard again (docs/contract.md).

Merge: one routing task (:func:`route_pairs`) reads every ``found`` file once and sends each valid
pair to the merge group owning it (``work/graph/routed/{first}.parquet``); one ``merge_edges`` task
per group keeps each pair once with the max similarity and writes its shards' edge files, so the
files a build opens grow with N, not N² (files and memory, measured: docs/scaling.md). The routing
task's group streams are on local disk (~16 B a pair: ~3 GB at 2·10⁸ pairs); a changed found file
reroutes every group, and a merge whose routed file is byte-identical is skipped.

PQ codes give approximate scores: the shard's queries then search at ``threshold -
pq_rescore_margin`` and every candidate is rescored as the exact dot product of the
two unit vectors, read from the feature files of the shards the candidates live in.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any, NotRequired, TypedDict

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.contract import (COMPUTED, SKIPPED, UnitResult, current_marker, finish_unit, joint_result,
                                  must_compute, read_pinned, run_unit, side_by_side, unit_fingerprint)
from corpusforge.faults import fault_point
from corpusforge.feature_files import read_feature_rows, require_all_features
from corpusforge.hashing import sha256_file
from tasks.graph.files import (EDGE_SCHEMA, FOUND_SCHEMA, GRAPH_INDEX, GRAPH_INDEX_LISTS, GRAPH_RECALL_IDS,
                               GRAPH_RECALL_VECTORS, GRAPH_ROUTED, edges_path, found_path, recall_path, routed_path)
from corpusforge.storage import Store, row_group_writer
from corpusforge.version import code_version
from tasks.graph import index as fx
from tasks.graph import ondisk
from tasks.graph.config import NearDedupConfig
from tasks.graph.nodes import NodeTable, load_shard_vectors, read_shard_table
from tasks.shared.pair_score import PairScore, pair_score_of, unit_rows


def edge_table(src: np.ndarray, dst: np.ndarray, sim: np.ndarray) -> pa.Table:
    return pa.table({"src": src, "dst": dst, "similarity": sim}, schema=EDGE_SCHEMA)


def feature_digests(source: Store, cfg: NearDedupConfig, nodes: NodeTable) -> dict[str, str]:
    """The current feature digest of every shard; a clear error naming a shard without features."""
    markers = require_all_features(source, cfg.model_id, nodes.shards)
    return {shard: m.digest for shard, m in zip(nodes.shards, markers, strict=True)}


def index_choice(cfg: NearDedupConfig, markers: list[dict[str, Any]], limit: int = fx.INDEX_WORKER_BYTES
                 ) -> tuple[fx.IndexChoice, PairScore, int, int]:
    """(plan, pair rule, vector count, feature dim) from the feature shards' marker infos;
    a ValueError when the index would exceed ``limit`` bytes in a query worker."""
    n_vectors = sum(int(m["count"]) for m in markers)
    dims = {int(m["dim"]) for m in markers if int(m["count"])}
    if len(dims) > 1:
        raise ValueError(f"features/{cfg.model_id}: shards disagree on the dimension: {sorted(dims)}")
    dim = dims.pop() if dims else 1
    rule = pair_score_of(markers)
    return fx.choose_index(cfg.index, n_vectors, rule.form_dim(dim), limit), rule, n_vectors, dim


class IndexInfo(TypedDict):
    """The index's marker info (and the trained index's, which has no ``blocks``; tasks/graph/build.py)."""

    plan: dict[str, Any]  # :class:`tasks.graph.index.IndexChoice` as JSON
    n_vectors: int
    dim: int
    pair_score: dict[str, Any]
    recall_queries: int
    gpu_build: bool
    blocks: NotRequired[int]  # IVF: the add units merged


class FoundInfo(TypedDict):
    """A query unit's marker info (``capped``: k-NN queries whose k-1 neighbours all reached the threshold)."""

    shard: str
    queries: int
    candidates: int
    pairs: int
    capped: int
    gpu_search: bool


class RecallInfo(TypedDict):
    recall_pairs: int


class GraphRecall(TypedDict):
    """The recall step's result (:func:`graph_recall`), the receipt's ``near_duplicates.recall``."""

    queries: int
    reference_pairs: int
    found: int
    recall: float | None
    tolerance: float


class RoutedInfo(TypedDict):
    """The routing unit's marker info: merge groups and the valid found pairs routed to them."""

    groups: int
    pairs: int


class EdgesInfo(TypedDict):
    """A merge unit's result: edges per owner shard of its group (each shard's marker has its own count)."""

    edges: dict[str, int]


_INDEX_CACHE: dict[tuple[str, str], Any] = {}


def load_index(out: Store, index: UnitResult[IndexInfo], use_gpu: bool) -> tuple[Any, Any, bool]:
    """The saved index (CPU copy, search copy, on GPU?), opened once per process and kept: a
    flat index read whole, an IVF index with its lists memory-mapped (tasks/graph/ondisk.py)."""
    key = (out.root, index.fingerprint)
    if key not in _INDEX_CACHE:
        _INDEX_CACHE.clear()
        nprobe = index.info["plan"]["nprobe"]
        with out.open(GRAPH_INDEX) as f:
            if index.info["plan"]["kind"] == "flat":
                cpu = fx.read_index(f, nprobe=nprobe)
            else:
                lists = ondisk.local_file(out, GRAPH_INDEX_LISTS, index.outputs[GRAPH_INDEX_LISTS],
                                          os.path.join(ondisk.cache_dir(), index.fingerprint))
                cpu = ondisk.open_mapped(f, lists, nprobe)
        search, on_gpu = fx.maybe_gpu(cpu, use_gpu)
        _INDEX_CACHE[key] = (cpu, search, on_gpu)
    return _INDEX_CACHE[key]


def query_fingerprint(cfg: NearDedupConfig, index: UnitResult[IndexInfo], digest: str) -> str:
    """A shard's query unit: its features' digest; with an approximate index, the index too."""
    exact = index.info["plan"]["kind"] == "flat"  # results depend only on its own and the found vectors
    choice = {k: v for k, v in index.info["plan"].items() if not (exact and k == "n_vectors")}
    return unit_fingerprint("graph-query", code_version(__name__),
                            [cfg.search_min_similarity, cfg.index.search, cfg.index.k,
                             cfg.index.advanced.pq_rescore_margin, choice, index.info.get("pair_score")],
                            [digest, None if exact else index.fingerprint])


class VectorLookup:
    """Exact unit vectors by node id for PQ rescoring: the query shard's own vectors, held,
    and for every other shard only the candidates' rows, read by ranges of its feature file
    (:func:`corpusforge.feature_files.read_feature_rows`). A query shard's candidates reach
    shards all over the corpus; reading each whole would move a shard's vectors per few
    candidates (41 GB for wfd at 10⁷ images when kept), rows move only what is rescored.
    ``own``: the query shard's index in ``nodes``, its ids and vectors, already in memory."""

    def __init__(self, source: Store, model_id: str, nodes: NodeTable, own: tuple[int, np.ndarray, np.ndarray]):
        self.source, self.model_id, self.nodes, self.own = source, model_id, nodes, own

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        owner = self.nodes.shard_of(ids)
        out = None
        for s in np.unique(owner):
            rows = np.flatnonzero(owner == s)
            if self.own[0] == s:
                x = self.own[2][np.searchsorted(self.own[1], ids[rows])]
            else:
                wanted, back = np.unique(ids[rows] - self.nodes.offsets[s], return_inverse=True)
                x = unit_rows(read_feature_rows(self.source, self.model_id, self.nodes.shards[s], wanted))[back]
            if out is None:
                out = np.empty((len(ids), x.shape[1]), dtype=np.float32)
            out[rows] = x
        return out if out is not None else np.zeros((0, 1), np.float32)


def flat_vectors(cpu_index: Any, ids: np.ndarray) -> np.ndarray:
    """Rows of an ``IDMap2,Flat`` index by id, straight from its storage (no copy of the index)."""
    flat = faiss.downcast_index(cpu_index.index)
    stored = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)
    id_map = faiss.vector_to_array(cpu_index.id_map)
    return stored[np.searchsorted(id_map, ids)]


def query_shard(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str, shard: str, digest: str,
                index: UnitResult[IndexInfo], force: bool = False) -> UnitResult[FoundInfo]:
    """Search one shard's vectors against the index; write the pairs it found.

    ``digest``: the shard's feature digest, so a skipped unit reads nothing shared.
    Skipped while the shard's features (and, for approximate indexes, the index) are
    unchanged, unless ``force``."""
    fp = query_fingerprint(cfg, index, digest)
    if not force and (marker := current_marker(out, found_path(shard), fp)) is not None:
        return UnitResult.of(marker, SKIPPED)
    must_compute()
    fault_point("graph.query", shard)  # tests only: off unless CORPUSFORGE_FAULT
    nodes, digests = read_shard_table(out, shard_table)
    fx.set_threads(cfg.index.faiss_threads)
    cpu, search, on_gpu = load_index(out, index, cfg.index.use_gpu)
    lo, _ = nodes.span(shard)
    ids, _, x = load_shard_vectors(source, cfg.model_id, shard, lo)
    choice = fx.IndexChoice.from_json(index.info["plan"])
    margin = fx.EXACT_SEARCH_MARGIN if choice.kind == "flat" else (0.0 if choice.exact_scores
                                                               else cfg.index.advanced.pq_rescore_margin)
    rule = PairScore.from_json(index.info.get("pair_score"))
    floor = cfg.search_min_similarity - margin - rule.search_slack
    src, dst, sim = fx.search_pairs(search, ids, rule.query_forms(x), floor,
                                    cfg.index.search, cfg.index.k, range_ok=not on_gpu, rule=rule)
    candidates = len(src)
    capped = 0
    if cfg.index.search == "knn" or on_gpu:
        per_query = np.bincount(np.searchsorted(ids, src), minlength=len(ids)) if len(ids) else np.zeros(0)
        capped = int((per_query >= cfg.index.k - 1).sum())
    if len(src) and (choice.kind == "flat" or not choice.exact_scores or rule.active):
        mine = x[np.searchsorted(ids, src)]
        if choice.kind == "flat":
            sim = rule.scores_vs_forms(mine, flat_vectors(cpu, dst))
        else:
            lookup = VectorLookup(source, cfg.model_id, nodes, (nodes.index_of(shard), ids, x))
            sim = rule.scores(mine, lookup.vectors(dst))
        keep = sim >= np.float32(cfg.search_min_similarity)
        src, dst, sim = src[keep], dst[keep], sim[keep]
    owner = nodes.shard_of(dst)
    dst_shard = np.array(nodes.shards, dtype=object)[owner] if len(dst) else np.zeros(0, dtype=object)
    table = pa.table({
        "src_row": (src - lo).astype(np.int32),
        "dst_shard": pa.array(dst_shard.tolist(), pa.string()),
        "dst_row": (dst - nodes.offsets[owner]).astype(np.int32),
        "dst_digest": pa.array([digests[t] for t in dst_shard.tolist()], pa.string()),
        "similarity": sim.astype(np.float32),
    }, schema=FOUND_SCHEMA)
    table = table.sort_by([("dst_shard", "ascending"), ("dst_row", "ascending"), ("src_row", "ascending")])
    sha = out.write_parquet(found_path(shard), table)
    info = FoundInfo(shard=shard, queries=int(len(ids)), candidates=int(candidates), pairs=int(len(src)),
                     capped=capped, gpu_search=bool(on_gpu))
    return UnitResult.of(finish_unit(out, found_path(shard), fp, {found_path(shard): sha}, info), COMPUTED)


def recall_shard(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str, shard: str, digest: str,
                 index: UnitResult[IndexInfo]) -> UnitResult[RecallInfo]:
    """Exhaustive pairs of the recall sample against one shard (the recall reference)."""
    fp = unit_fingerprint("graph-recall", code_version(__name__), cfg.edge_min_similarity, [index.fingerprint, digest])

    def compute() -> tuple[dict[str, str], RecallInfo]:
        lo, _ = read_shard_table(out, shard_table)[0].span(shard)
        ids, _, x = load_shard_vectors(source, cfg.model_id, shard, lo)
        q_ids = out.read_npy(GRAPH_RECALL_IDS)
        q = out.read_npy(GRAPH_RECALL_VECTORS)
        rule = PairScore.from_json(index.info.get("pair_score"))
        rq, rd, rs = fx.exhaustive_pairs(q_ids, q, ids, x, cfg.edge_min_similarity, rule)
        return {recall_path(shard): out.write_parquet(recall_path(shard), edge_table(rq, rd, rs))}, \
            RecallInfo(recall_pairs=int(len(rq)))

    return run_unit(out, recall_path(shard), fp, compute)


ROUTE_READERS = 8  # found files read side by side (their round trips overlap on S3) and held at once
ROUTE_ROWS = 1 << 20  # pairs per row group of a routed file (~16 MB)


def merge_groups(nodes: NodeTable, found_pairs: list[int], max_edges: int) -> list[tuple[str, str]]:
    """Contiguous groups of owner shards, about ``max_edges`` found pairs per group, as
    (first, last) shard names: a task's parameters stay small however many shards it owns."""
    total = sum(found_pairs)
    return owner_groups(nodes, max(1, min(len(nodes.shards), -(-total // max_edges))))


def owner_groups(nodes: NodeTable, n_groups: int) -> list[tuple[str, str]]:
    """The shards cut into ``n_groups`` contiguous groups of equal shard counts, as (first, last)."""
    return [(g[0], g[-1]) for g in np.array_split(np.array(nodes.shards, dtype=object), n_groups) if len(g)]


def group_shards(nodes: NodeTable, group: tuple[str, str]) -> list[str]:
    """The owner shards of a merge group, first to last."""
    first, last = group
    return list(nodes.shards[nodes.index_of(first):nodes.index_of(last) + 1])


def found_fingerprint(found_digests: list[str]) -> str:
    """One digest for every shard's found file, in node order (what the routing task reads)."""
    return unit_fingerprint("graph-found", "", [], found_digests)


def _valid_pairs(table: pa.Table, shard: str, nodes: NodeTable, digests: dict[str, str]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global (src, dst, similarity) of a found table's rows still pointing at current vectors."""
    dst_shard = table["dst_shard"].to_pylist()
    valid = np.array([digests.get(t) == d for t, d in zip(dst_shard, table["dst_digest"].to_pylist(), strict=True)],
                     dtype=bool)
    owner = np.array([nodes.positions.get(t, 0) for t in dst_shard], dtype=np.int64)
    src = nodes.offsets[nodes.index_of(shard)] + table["src_row"].to_numpy().astype(np.int64)
    dst = nodes.offsets[owner] + table["dst_row"].to_numpy().astype(np.int64)
    return src[valid], dst[valid], table["similarity"].to_numpy()[valid]


def route_pairs(out: Store, shard_table: str, found: str, n_groups: int) -> UnitResult[RoutedInfo]:
    """Write ``work/graph/routed/{first}.parquet`` for each of the ``n_groups`` merge groups
    (:func:`owner_groups`): the valid pairs of every found file whose smaller id the group owns,
    in node order of the found files. ``found``: :func:`found_fingerprint` of the found files."""
    fp = unit_fingerprint("graph-route", code_version(__name__), n_groups, [shard_table, found])

    def compute() -> tuple[dict[str, str], RoutedInfo]:
        nodes, digests = read_shard_table(out, shard_table)
        groups = owner_groups(nodes, n_groups)
        starts = nodes.offsets[[nodes.index_of(first) for first, _ in groups]]

        def read(shard: str) -> tuple[str, pa.Table]:
            with out.open(found_path(shard)) as f:
                return shard, pq.read_table(f)

        routed = 0
        with tempfile.TemporaryDirectory(prefix="corpusforge-route-") as tmp:
            with _GroupStreams(tmp) as streams:
                for shard, table in side_by_side(read, nodes.shards, ROUTE_READERS, ROUTE_READERS):
                    src, dst, sim = _valid_pairs(table, shard, nodes, digests)
                    streams.add(np.searchsorted(starts, np.minimum(src, dst), side="right") - 1, src, dst, sim)
                    routed += len(src)
            outputs = {routed_path(first): _write_routed(out, routed_path(first), streams.path(g))
                       for g, (first, _) in enumerate(groups)}
        return outputs, RoutedInfo(groups=len(groups), pairs=routed)

    return run_unit(out, GRAPH_ROUTED, fp, compute)


class _GroupStreams:
    """Pairs appended with their merge group: held until :data:`ROUTE_ROWS` in all, then each
    group's written as one batch to its local Arrow stream, in the order they came (a found file
    holds a few pairs of each of many groups: a batch, or a table held, each would cost more in
    headers than in pairs)."""

    def __init__(self, folder: str):
        self.folder, self.rows = folder, 0
        self.held: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self.files = contextlib.ExitStack()

    def path(self, group: int) -> str:
        return os.path.join(self.folder, f"{group}.arrows")

    def add(self, group: np.ndarray, src: np.ndarray, dst: np.ndarray, sim: np.ndarray) -> None:
        if len(group):
            self.held.append((group, src, dst, sim))
            self.rows += len(group)
        if self.rows >= ROUTE_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.held:
            return
        group, src, dst, sim = (np.concatenate(a) for a in zip(*self.held, strict=True))
        order = np.argsort(group, kind="stable")
        cuts = np.searchsorted(group[order], np.arange(group.max() + 2))
        for g in np.flatnonzero(np.diff(cuts)).tolist():
            if g not in self.writers:
                sink = self.files.enter_context(pa.OSFile(self.path(g), "wb"))
                self.writers[g] = self.files.enter_context(pa.ipc.new_stream(sink, EDGE_SCHEMA))
            rows = order[cuts[g]:cuts[g + 1]]
            self.writers[g].write_table(edge_table(src[rows], dst[rows], sim[rows]))
        self.held, self.rows = [], 0

    def __enter__(self) -> _GroupStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.flush()
        finally:
            self.files.close()


def _write_routed(out: Store, rel: str, stream: str) -> str:
    """A group's local stream (none when no pair routed to it) as the parquet file ``rel``, in
    row groups of :data:`ROUTE_ROWS` pairs; its SHA-256."""
    with out.atomic_local_file(rel) as tmp:
        with open(tmp, "wb") as f, row_group_writer(f, EDGE_SCHEMA) as write:
            if os.path.exists(stream):
                with pa.OSFile(stream, "rb") as source:
                    held: list[pa.RecordBatch] = []
                    rows = 0
                    for batch in pa.ipc.open_stream(source):
                        held.append(batch)
                        rows += batch.num_rows
                        if rows >= ROUTE_ROWS:
                            write(pa.Table.from_batches(held, EDGE_SCHEMA))
                            held, rows = [], 0
                    if held:
                        write(pa.Table.from_batches(held, EDGE_SCHEMA))
        return sha256_file(tmp)


def merge_edges(out: Store, shard_table: str, group: tuple[str, str], routed: str) -> UnitResult[EdgesInfo]:
    """Write ``graph/edges/{shard}.parquet`` for a group of owner shards (its first and
    last), one marker each; the result has every shard's edge file and count. ``routed``:
    the SHA-256 of the group's routed file (:func:`route_pairs`)."""
    nodes, _ = read_shard_table(out, shard_table)
    group = group_shards(nodes, group)
    fp = unit_fingerprint("graph-edges", code_version(__name__), group, [shard_table, routed])
    markers = [current_marker(out, edges_path(s), fp) for s in group]
    if all(m is not None for m in markers):
        return joint_result(fp, markers, EdgesInfo(edges={s: m.info["edges"] for s, m in zip(group, markers,
                                                                                               strict=True)}), SKIPPED)
    must_compute()
    table = pq.read_table(pa.BufferReader(read_pinned(out, routed_path(group[0]), routed, "the graph merge")))
    a, b, s = fx.canonical_pairs(table["src"].to_numpy(), table["dst"].to_numpy(), table["similarity"].to_numpy())
    owner = nodes.shard_of(a)
    written = []
    for shard in group:
        sel = owner == nodes.index_of(shard)
        sha = out.write_parquet(edges_path(shard), edge_table(a[sel], b[sel], s[sel]))
        written.append(finish_unit(out, edges_path(shard), fp, {edges_path(shard): sha}, {"edges": int(sel.sum())}))
    return joint_result(fp, written, EdgesInfo(edges={s: m.info["edges"] for s, m in zip(group, written,
                                                                                         strict=True)}), COMPUTED)


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


def node_degrees(out: Store, nodes: NodeTable) -> np.ndarray:
    """Edges per node in the merged graph (the k-NN cap check): O(edges) per edge file, never
    O(nodes) per file (a full-length count per file was O(S·N)); int32, 0.4 GB at 10⁸ nodes."""
    degree = np.zeros(nodes.n_nodes, dtype=np.int32)
    for src, dst, _ in iter_edges(out, nodes):
        ids, counts = np.unique(np.concatenate([src, dst]), return_counts=True)
        degree[ids] += counts.astype(np.int32)
    return degree


def graph_recall(out: Store, shard_table: str, cfg: NearDedupConfig) -> GraphRecall:
    """Share of exhaustive-search pairs of the recall sample that the graph holds
    (``shard_table``: SHA-256 of the stage's shard table).

    Reference: every pair (sample query, any vector) with similarity >= threshold +
    ``recall_tolerance`` by a numpy product (the margin absorbs float16 index scores
    and float32 summation-order differences at the boundary). With k-NN search a
    node's pairs beyond its k-1 nearest count as misses too: this is the recall of the
    graph, not of the index.
    """
    nodes = read_shard_table(out, shard_table)[0]
    q_ids = out.read_npy(GRAPH_RECALL_IDS)
    ref = pa.concat_tables([out.read_parquet(recall_path(s)) for s in nodes.shards])
    rs = ref["similarity"].to_numpy()
    must = rs >= np.float32(cfg.edge_min_similarity + cfg.advanced.recall_tolerance)
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
            "recall": (hits / len(want)) if len(want) else None, "tolerance": cfg.advanced.recall_tolerance}
