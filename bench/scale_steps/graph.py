"""Near-duplicate graph steps of ``bench/scale.py``: the features they read, the FAISS index
build and query, the graph driver's planning, and every one-off task of
``tasks/graph/stage.py`` run with its real code on a planted graph.

Features (``features512``, ``featureswfd``): float16 vectors in blocks of
:data:`FEATURE_BLOCK`, ~5 % near-duplicates planted within a block (bench/graph.py's
``make_vectors``) and :data:`SPREAD_RATE` more planted as near copies of vectors of any
earlier block (a bounded reservoir of them), so a query shard's candidates land in shards
all over the corpus, as real data's do. The spread pairs are kept beside the inputs.

The planted graph (``graph512``, written outside the corpus root, like the index steps'
output: the receipt step would hash it): the shard table, every shard's ``found`` file in
the query's format holding the spread pairs from both sides (what the queries write), the
recall sample and its reference files, the edge files by the real ``route_pairs`` and
``merge_edges``, and the per-shard digest lists. ``merge_max_edges`` is set so the pairs make
:data:`MERGE_GROUPS` merge groups at every size, as a 10⁸ corpus with about one found pair
per image gives them with the default 5·10⁷; a merge task's memory is projected on the pairs
of one group, 5·10⁷ at 10⁸, the routing task's on the shard count (its shard table; the found
files and rows it holds at once are fixed in number).

Each step then calls its task as the stage does, forcing it to compute (its marker
removed): ``graph_merge`` (the routing task, then every group's merge task, each in a
process of its own; ``graph_merge_growing`` the same with ``merge_max_edges`` fixed, so
the groups grow with N and so would the files of a merge that read every found file per
group), ``graph_knn_cap``
(the k-NN cap check's node degrees), ``graph_recall``, ``graph_review``, ``graph_verify``
(the shard owning the most review pairs; the bench's images are a few bytes, so this is
the task's reads and bookkeeping, not its decoding), ``graph_decisions``,
``graph_collision``, ``graph_calibration`` and ``graph_crop_candidates`` (one shard's
off-centre crop search on planted region files; the build runs it only up to the flat
index's size, so neither does the bench); ``graph_collision_guard`` is the
collision models task with its sample capped small (:data:`COLLISION_GUARD_CAP`), so the
scale guard's sizes lie in the regime of 10⁸.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.scale import (FIXED, GUARDED, INPUTS, MODEL_512, MODEL_WFD, PROJECT, STEPS, Scale, Step, _model,
                         _reset_peak, install_counting_fs, shard_name, step)

FEATURE_BLOCK = 100_000  # vectors generated at a time (make_vectors plants near-duplicates within a block)
SPREAD_RATE = 0.025  # near copies of vectors of earlier blocks, per vector
SPREAD_POOL = 20_000  # vectors kept to copy from: a uniform sample of every block so far
MERGE_GROUPS = 4
GRAPH_TAG = "512g"


def _planted_path(data: str, model_id: str) -> str:
    return os.path.join(data, f"planted-{model_id}.npz")


def write_features(store, sc: Scale, model_id: str, data: str) -> None:
    """Float16 features of every staged record (planted near-duplicates within and across
    blocks) and their markers; the spread pairs (global node ids) go to ``planted-*.npz``."""
    from bench.graph import make_vectors
    from corpusforge.feature_files import write_shard_features
    from corpusforge.layout import staging_records

    dim, model = _model(model_id)
    rng = np.random.default_rng(7)
    per_block = SPREAD_POOL // max(1, math.ceil(sc.kept / FEATURE_BLOCK))
    pool_ids, pool_x = [], []  # a uniform sample of every earlier block's vectors, per_block each
    src, dst, sims = [], [], []
    x, start, blocks, first = np.zeros((0, dim), np.float16), 0, 0, 0  # first: the node id of x[0]
    for s in range(sc.shards):
        keys = store.read_parquet(staging_records(shard_name(s)), columns=["key", "sha256"])
        n = keys.num_rows
        if start + n > len(x):  # vectors in blocks: bounded memory at any N
            m = min(FEATURE_BLOCK, sc.kept)
            fresh = make_vectors(m, dim, seed=blocks)
            base = first + len(x)  # node id of fresh[0]
            rows = rng.choice(m, size=int(m * SPREAD_RATE), replace=False)
            others = np.setdiff1d(np.arange(m), rows)
            own = np.sort(rng.choice(others, size=min(len(others), per_block), replace=False))
            ids = np.concatenate([*pool_ids, base + own])  # parents: earlier blocks' sample and this block's
            px = np.concatenate([*pool_x, fresh[own]])
            parents = rng.integers(0, len(ids), size=len(rows))
            sim = rng.uniform(0.91, 0.99, size=len(rows)).astype(np.float32)[:, None]
            p = px[parents]
            r = rng.standard_normal((len(rows), dim), dtype=np.float32)
            r -= np.sum(r * p, axis=1, keepdims=True) * p
            r /= np.linalg.norm(r, axis=1, keepdims=True)
            fresh[rows] = sim * p + np.sqrt(1 - sim**2) * r
            f16, p16 = (v.astype(np.float16).astype(np.float32) for v in (fresh[rows], p))
            src.append(ids[parents])
            dst.append(base + rows)
            sims.append(np.sum(f16 * p16, axis=1) / np.linalg.norm(f16, axis=1) / np.linalg.norm(p16, axis=1))
            pool_ids.append(base + own)
            pool_x.append(fresh[own])
            first += start
            x, start, blocks = np.concatenate([x[start:], fresh.astype(np.float16)]), 0, blocks + 1
        write_shard_features(store, model_id, shard_name(s), keys["key"].to_pylist(), keys["sha256"].to_pylist(),
                             [True] * n, [None] * n, x[start:start + n], f"bench-{s}", {"model": model})
        start += n
    a, b, w = (np.concatenate(p).astype(t) if p else np.zeros(0, t)
               for p, t in ((src, np.int64), (dst, np.int64), (sims, np.float32)))
    real = (a < sc.kept) & (b < sc.kept)  # the last block's unused tail holds no node
    np.savez(_planted_path(data, model_id), src=a[real], dst=b[real], sim=w[real])


# The index the 10⁸ deployment of a 512-d model uses (near_dedup.index.storage: pq; the
# default sqfp16 is refused above 16 GiB per query worker): IVF at every size here, where
# ``auto`` would pick a flat index below 200k vectors.
IVF_PQ = {"kind": "ivf", "storage": "pq"}


def _near_config(model_id: str, index: dict[str, Any] | None = None):
    from tasks.graph.config import NearDedupConfig

    return NearDedupConfig(model_id=model_id, **({"index": index} if index else {}))


@step("graph_driver", ("staging", "features512"), "flow", ("tasks.graph.stage",))
def run_graph_driver(store, sc: Scale, data: str) -> dict[str, Any]:
    """The graph driver's planning, shard table and fan-out parameters (query/recall, merge,
    verify) as near_duplicate_stage builds them, without running the tasks."""
    from corpusforge.contract import UnitResult, require_marker
    from corpusforge.layout import staging_records, staging_tar
    from tasks.graph.edges import feature_digests, found_fingerprint, merge_groups
    from tasks.graph.nodes import number_nodes, write_shard_table
    from tasks.graph.stage import shard_calls
    from tasks.graph.verify import records_fingerprint

    cfg = _near_config(MODEL_512)
    nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
    digests = feature_digests(store, cfg, nodes)
    table = write_shard_table(store, nodes, digests)
    index = UnitResult("0" * 64, {}, "0" * 64, {"plan": {"kind": "ivf"}, "n_vectors": nodes.n_nodes, "dim": 512},
                       action="computed")
    query = shard_calls(store, store, cfg, table, digests, index)
    groups = merge_groups(nodes, [1] * len(nodes.shards), cfg.advanced.merge_max_edges)
    merge = [dict(out=store, shard_table=table, group=g, found=found_fingerprint(list(digests.values())))
             for g in groups]
    records = {s: require_marker(store, staging_tar(s), "staging shard").outputs[staging_records(s)]
               for s in nodes.shards}
    records_fp = records_fingerprint(records)
    verify = [dict(source=store, out=store, cfg=cfg, shard_table=table, shard=s, review_digest="0" * 64,
                   records=records_fp) for s in nodes.shards]
    return {"tasks": 2 * len(query) + len(merge) + len(verify), "params": [query[-1], merge[-1], verify[-1]]}


def _graph_out(data: str, tag: str):
    """The FAISS steps' output root, beside the corpus root (not inside it: its index files
    would be outputs of the corpus that no root marker records, and the receipt step would hash them)."""
    from corpusforge.storage import Store

    return Store(os.path.join(data, f"graph-{tag}"), fsync=False)


def _unit_in_child(fn: Callable[..., Any], call: bytes) -> tuple[Any, int, int, int, float]:
    """Run one unit in this fresh (spawned) process, as a task runs on a worker: its result,
    peak RSS above the start, the files and bytes it read through fsspec and its CPU
    seconds. ``call`` is pickled, so its stores are made after the counting filesystem is
    installed."""
    import resource

    from bench.scale import _status_bytes  # defined after the area modules load

    counting = install_counting_fs()
    kwargs = pickle.loads(call)
    base = _reset_peak()
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = fn(**kwargs)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return result, _status_bytes("VmHWM:") - base, counting.opened, counting.bytes_read, cpu


def _measured(runs: dict[str, Any]):
    """A fan-out (tasks/graph/build.py) that runs each unit in a process of its own, one at a
    time, and keeps per task kind the largest peak RSS and parameters, the CPU seconds of
    all its tasks (``task_cpu``; the step's own CPU time holds their processes' start too),
    and the files and bytes all of them read."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    def fan_out(unit: Any, calls: list[dict[str, Any]]) -> list[Any]:
        results = []
        for call in calls:
            with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
                result, peak, opened, read, cpu = pool.submit(_unit_in_child, unit.fn, pickle.dumps(call)).result()
            results.append(result)
            runs.setdefault("task_cpu", {})[unit.fn.__name__] = runs.get("task_cpu", {}).get(unit.fn.__name__, 0) + cpu
            runs["task_peaks"][unit.fn.__name__] = max(runs["task_peaks"].get(unit.fn.__name__, 0), peak)
            runs["files_elsewhere"] += opened
            runs["bytes_elsewhere"] += read
        runs["params"].append(max(calls, key=lambda c: len(pickle.dumps(c))))
        return results
    return fan_out


def _index_task_sizes(index: dict[str, Any]) -> Callable[[int], dict[str, int]]:
    """What each index build task's memory follows at N records (a 512-d model): the training
    sample (capped by index.advanced.max_train), the vectors of one block (capped by its bytes of
    lists) and, for the merge, whose mapped file pages count in its RSS, the vectors of one
    range of lists (capped by the range's bytes)."""
    def sizes(n: int) -> dict[str, int]:
        from tasks.graph import build, ondisk
        from tasks.graph.config import IndexConfig
        from tasks.graph.index import choose_index

        kept = Scale.of(n).kept
        choice = choose_index(IndexConfig(**index), kept, 512)
        return {"prepare_index": choice.n_train,
                "add_block": min(kept, max(1, build.ADD_BLOCK_BYTES // choice.bytes_per_vector)),
                "merge_blocks": min(kept, max(1, ondisk.MERGE_RANGE_BYTES // choice.bytes_per_vector))}
    return sizes


def _train_work(index, kept: int) -> dict[str, Any]:
    """The IVF training sample and lists (k-means work ∝ their product) at ``kept`` vectors
    and at a 10⁸ build, as choose_index chooses them: the training task's CPU time grows with
    that product, not with N (issue 31: ×122 from 1M to 10⁸ for IVF-PQ)."""
    from tasks.graph.index import choose_index

    def work(n: int) -> dict[str, int]:
        choice = choose_index(index, n, 512)
        return {"n_train": choice.n_train, "nlist": choice.nlist, "work": choice.n_train * choice.nlist}

    return {"here": work(kept), "1e8": work(Scale.of(10**8).kept)} if index.kind == "ivf" else {}


def _faiss_build(model_id: str, index: dict[str, Any] | None = None, tag: str = ""):
    tag = tag or model_id

    def run(store, sc: Scale, data: str) -> dict[str, Any]:
        """Every unit of the index build in turn, each in a process of its own (prepare; for
        IVF the block adds and the merge): the step's peak is its largest task's."""
        from corpusforge.contract import remove_tree
        from tasks.graph.files import GRAPH_INDEX_DIR, GRAPH_INDEX_WORK
        from tasks.graph.build import build_index
        from tasks.graph.edges import feature_digests
        from tasks.graph.nodes import number_nodes, write_shard_table

        out = _graph_out(data, tag)
        for folder in (GRAPH_INDEX_DIR, GRAPH_INDEX_WORK):
            remove_tree(out, folder)
        cfg = _near_config(model_id, index)
        nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
        table = write_shard_table(out, nodes, feature_digests(store, cfg, nodes))
        runs: dict[str, Any] = {"task_peaks": {}, "params": [], "files_elsewhere": 0, "bytes_elsewhere": 0}
        built, added = build_index(store, out, cfg, table, _measured(runs))
        with open(os.path.join(data, f"index-{tag}.json"), "w") as f:
            json.dump(built.to_json(), f)
        blocks = added.computed + added.skipped if added else 0
        runs["files_elsewhere"] += blocks + 1 if blocks else 0  # FAISS maps the blocks' lists and writes the merged
        return {"tasks": 1 + blocks + (1 if blocks else 0), "plan": built.info["plan"]["factory"], "blocks": blocks,
                "peak_rss": max(runs["task_peaks"].values()), "train": _train_work(cfg.index, sc.kept), **runs}
    return run


def _faiss_query(model_id: str, index: dict[str, Any] | None = None, tag: str = ""):
    tag = tag or model_id

    def run(store, sc: Scale, data: str) -> dict[str, Any]:
        """One shard's queries: an IVF index's lists are mapped (their pages touched count in
        the peak RSS as file pages), a flat index read whole."""
        from bench.scale import _status_bytes  # defined after the area modules load
        from corpusforge.contract import Marker, UnitResult
        from tasks.graph.edges import feature_digests, query_shard
        from tasks.graph.nodes import number_nodes, write_shard_table
        from tasks.graph.stage import shard_calls

        with open(os.path.join(data, f"index-{tag}.json")) as f:
            built = UnitResult.of(Marker.from_json(json.load(f)), "computed")
        cfg = _near_config(model_id, index)
        out = _graph_out(data, tag)
        nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
        digests = feature_digests(store, cfg, nodes)
        table = write_shard_table(out, nodes, digests)
        kwargs = dict(shard_calls(store, out, cfg, table, digests, built)[0], force=True)
        found = query_shard(**kwargs)
        return {"tasks": sc.shards, "params": [kwargs], "pairs": found.info["pairs"],
                "files_elsewhere": int(built.info["plan"]["kind"] == "ivf"),  # the lists FAISS maps
                "rss_file": _status_bytes("RssFile:")}
    return run


_GRAPH_MODULES = ("tasks.graph.edges", "tasks.graph.nodes", "faiss")


def _index_kind(model_id: str) -> Callable[[int], dict[str, Any]]:
    def regime(n: int) -> dict[str, Any]:
        """The default index's kind at N (choose_index, its size refusal aside): flat up to
        flat_max_vectors, IVF above, whose build trains and adds in blocks: a regime of its own."""
        from tasks.graph.index import choose_index

        dim = _model(model_id)[0]
        return {"index": choose_index(_near_config(model_id).index, Scale.of(n).kept, dim, limit=2**62).kind}
    return regime


# The default index (flat to 200k, IVF-SQfp16 above) of a 512-d model and of wfd (2,096 dims)
# runs at 1M too, and at the size where IVF starts (sizes_for adds it).
STEPS["faiss_build_512"] = Step("faiss_build_512", _faiss_build(MODEL_512), ("staging", "features512"), "task",
                                _GRAPH_MODULES, refused=MODEL_512, regime=_index_kind(MODEL_512))
STEPS["faiss_query_512"] = Step("faiss_query_512", _faiss_query(MODEL_512), ("staging", "features512"), "task",
                                _GRAPH_MODULES, refused=MODEL_512, regime=_index_kind(MODEL_512))
# IVF-PQ (the index a 10⁸ build uses) runs at 1M too: ~4.5 min to train and add here.
STEPS["faiss_build_512pq"] = Step("faiss_build_512pq", _faiss_build(MODEL_512, IVF_PQ, "512pq"),
                                  ("staging", "features512"), "task", _GRAPH_MODULES,
                                  task_sizes=_index_task_sizes(IVF_PQ))
STEPS["faiss_query_512pq"] = Step("faiss_query_512pq", _faiss_query(MODEL_512, IVF_PQ, "512pq"),
                                  ("staging", "features512"), "task", _GRAPH_MODULES)
# The scale guard's IVF-PQ (tests/test_scale_guard.py, quick sizes): the same train, add,
# merge and PQ-rescored query code with 64 lists (4,096 training vectors), so 100k trains in
# seconds, not minutes; the 10⁸ plan's training cost is the full step's (faiss_build_512pq).
IVF_PQ_GUARD = {**IVF_PQ, "nlist": 64}
STEPS["faiss_build_512pq_guard"] = Step("faiss_build_512pq_guard", _faiss_build(MODEL_512, IVF_PQ_GUARD, "512pqg"),
                                        ("staging", "features512"), "task", _GRAPH_MODULES,
                                        task_sizes=_index_task_sizes(IVF_PQ_GUARD))
STEPS["faiss_query_512pq_guard"] = Step("faiss_query_512pq_guard", _faiss_query(MODEL_512, IVF_PQ_GUARD, "512pqg"),
                                        ("staging", "features512"), "task", _GRAPH_MODULES)
STEPS["faiss_build_wfd"] = Step("faiss_build_wfd", _faiss_build(MODEL_WFD), ("staging", "featureswfd"), "task",
                                _GRAPH_MODULES, refused=MODEL_WFD, regime=_index_kind(MODEL_WFD))
STEPS["faiss_query_wfd"] = Step("faiss_query_wfd", _faiss_query(MODEL_WFD), ("staging", "featureswfd"), "task",
                                _GRAPH_MODULES, refused=MODEL_WFD, regime=_index_kind(MODEL_WFD))



# ---- the planted graph and the one-off tasks ---------------------------------------------

def _graph_state(data: str) -> dict[str, Any]:
    with open(os.path.join(data, f"graph-{GRAPH_TAG}.json")) as f:
        return json.load(f)


def _merge_max_edges(pairs: int) -> int:
    return max(1, -(-pairs // MERGE_GROUPS))


def write_graph(store, sc: Scale, data: str) -> None:
    """The planted graph's files as the stage writes them (see the module docstring)."""
    import pyarrow as pa

    from corpusforge.contract import finish_unit, require_marker
    from corpusforge.layout import staging_records, staging_tar
    from tasks.graph.files import (FOUND_SCHEMA, GRAPH_RECALL_IDS, GRAPH_RECALL_VECTORS, edges_path, found_path,
                                   recall_path, routed_path)
    from tasks.graph.edges import (edge_table, feature_digests, found_fingerprint, merge_edges, merge_groups,
                                   route_pairs)
    from tasks.graph.nodes import load_shard_vectors, number_nodes, write_shard_digests, write_shard_table

    out = _graph_out(data, GRAPH_TAG)
    cfg = _near_config(MODEL_512)
    nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
    digests = feature_digests(store, cfg, nodes)
    table = write_shard_table(out, nodes, digests)
    planted = np.load(_planted_path(data, MODEL_512))
    src = np.concatenate([planted["src"], planted["dst"]])  # each query side finds the pair
    dst = np.concatenate([planted["dst"], planted["src"]])
    sim = np.concatenate([planted["sim"]] * 2)
    owner_src, owner_dst = nodes.shard_of(src), nodes.shard_of(dst)
    order = np.lexsort((src, dst, owner_src))
    src, dst, sim, owner_src, owner_dst = (a[order] for a in (src, dst, sim, owner_src, owner_dst))
    bounds = np.searchsorted(owner_src, np.arange(len(nodes.shards) + 1))
    found = []
    for i, shard in enumerate(nodes.shards):
        lo, hi = bounds[i], bounds[i + 1]
        names = [nodes.shards[o] for o in owner_dst[lo:hi]]
        t = pa.table({"src_row": (src[lo:hi] - nodes.offsets[i]).astype(np.int32),
                      "dst_shard": pa.array(names, pa.string()),
                      "dst_row": (dst[lo:hi] - nodes.offsets[owner_dst[lo:hi]]).astype(np.int32),
                      "dst_digest": pa.array([digests[n] for n in names], pa.string()),
                      "similarity": sim[lo:hi]}, schema=FOUND_SCHEMA)
        sha = out.write_parquet(found_path(shard), t)
        found.append(finish_unit(out, found_path(shard), f"bench-{shard}", {found_path(shard): sha},
                                 {"shard": shard, "queries": int(nodes.offsets[i + 1] - nodes.offsets[i]),
                                  "candidates": int(hi - lo), "pairs": int(hi - lo), "capped": 0,
                                  "gpu_search": False}))
    q_ids = np.sort(np.random.default_rng(cfg.seed).choice(nodes.n_nodes, min(cfg.recall_queries, nodes.n_nodes),
                                                           replace=False))
    q_x = []
    for s in np.unique(nodes.shard_of(q_ids)):
        ids, _, x = load_shard_vectors(store, MODEL_512, nodes.shards[s], int(nodes.offsets[s]))
        q_x.append(x[np.searchsorted(ids, q_ids[nodes.shard_of(q_ids) == s])])
    for rel, arr in ((GRAPH_RECALL_IDS, q_ids), (GRAPH_RECALL_VECTORS, np.concatenate(q_x))):
        with out.atomic_write(rel) as f:
            np.save(f, arr, allow_pickle=False)
    sampled = np.isin(src, q_ids)  # the recall reference: the sample's pairs, per shard of the other end
    for i, shard in enumerate(nodes.shards):
        sel = sampled & (owner_dst == i)
        out.write_parquet(recall_path(shard), edge_table(src[sel], dst[sel], sim[sel]))
    max_edges = _merge_max_edges(len(src))
    groups = merge_groups(nodes, [m.info["pairs"] for m in found], max_edges)
    found_fp = found_fingerprint([m.digest for m in found])
    routed = route_pairs(out=out, shard_table=table, found=found_fp, n_groups=len(groups))
    for g in groups:
        merge_edges(out=out, shard_table=table, group=g, routed=routed.outputs[routed_path(g[0])])
    edges = [require_marker(out, edges_path(s), "graph edges").digest for s in nodes.shards]
    records = [require_marker(store, staging_tar(s), "staging shard").outputs[staging_records(s)]
               for s in nodes.shards]
    state = {"table": table, "found": found_fp, "groups": [list(g) for g in groups], "pairs": int(len(src)),
             "merge_max_edges": max_edges, "n_vectors": nodes.n_nodes,
             "edges": write_shard_digests(out, "edges", nodes, edges),
             "records": write_shard_digests(out, "records", nodes, records)}
    with open(os.path.join(data, f"graph-{GRAPH_TAG}.json"), "w") as f:
        json.dump(state, f)


INPUTS["features512"] = lambda store, sc, src: write_features(store, sc, MODEL_512, os.path.dirname(src))
INPUTS["featureswfd"] = lambda store, sc, src: write_features(store, sc, MODEL_WFD, os.path.dirname(src))
INPUTS["graph512"] = lambda store, sc, src: write_graph(store, sc, os.path.dirname(src))
_GRAPH_NEEDS = ("staging", "features512", "graph512")


def write_review(store, sc: Scale, data: str) -> None:
    """The review pairs, graph_verify's input, as graph_review chooses them (the same files)."""
    from tasks.graph.review import select_review_pairs

    state = _graph_state(data)
    select_review_pairs(_graph_out(data, GRAPH_TAG), _near_config(MODEL_512), state["table"], state["edges"])


INPUTS["review512"] = lambda store, sc, src: write_review(store, sc, os.path.dirname(src))


def _merge_sizes(n: int) -> dict[str, int]:
    """What the merge step's tasks' memory follows: a merge task's, the found pairs of its
    group, here the planted pairs over :data:`MERGE_GROUPS`, projected (10⁷, 10⁸) at a full
    group, merge_max_edges; the routing task's, the shard count (its shard table)."""
    from tasks.graph.config import NearDedupConfig

    merge = (NearDedupConfig().advanced.merge_max_edges if n in PROJECT
             else int(Scale.of(n).kept * 2 * SPREAD_RATE / MERGE_GROUPS))
    return {"merge_edges": merge, "route_pairs": Scale.of(n).shards}


def run_merge(store, sc: Scale, data: str) -> dict[str, Any]:
    """The merge step as the stage runs it: the routing task, then every merge group's task,
    each in a process of its own (markers removed: they compute)."""
    state = _graph_state(data)
    return _merge_step(sc, data, [tuple(g) for g in state["groups"]])


def run_merge_growing(store, sc: Scale, data: str) -> dict[str, Any]:
    """:func:`run_merge` with ``merge_max_edges`` fixed at :data:`GROWING_GROUP_PAIRS`, so the
    groups grow with N, as they do with the default past one group (10⁸ → 10⁹): what the
    files opened grow with (each group reading every later found file was G·S/2, O(N²))."""
    from tasks.graph.edges import merge_groups
    from tasks.graph.nodes import number_nodes

    nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
    return _merge_step(sc, data, merge_groups(nodes, [_graph_state(data)["pairs"]], GROWING_GROUP_PAIRS))


def _merge_step(sc: Scale, data: str, groups: list[tuple[str, str]]) -> dict[str, Any]:
    from corpusforge.contract import marker_path
    from tasks.graph.files import GRAPH_ROUTED, edges_path, routed_path
    from tasks.graph.stage import MERGE_EDGES, ROUTE_PAIRS

    out, state = _graph_out(data, GRAPH_TAG), _graph_state(data)
    for rel in [GRAPH_ROUTED, *(edges_path(shard_name(s)) for s in range(sc.shards))]:
        out.remove(marker_path(rel))
    runs: dict[str, Any] = {"task_peaks": {}, "params": [], "files_elsewhere": 0, "bytes_elsewhere": 0}
    fan_out = _measured(runs)
    routed = fan_out(ROUTE_PAIRS, [dict(out=out, shard_table=state["table"], found=state["found"],
                                        n_groups=len(groups))])[0]
    fan_out(MERGE_EDGES, [dict(out=out, shard_table=state["table"], group=g, routed=routed.outputs[routed_path(g[0])])
                          for g in groups])
    return {"tasks": 1 + len(groups), "groups": len(groups), "pairs": state["pairs"],
            "peak_rss": max(runs["task_peaks"].values()), **runs}


STEPS["graph_merge"] = Step("graph_merge", run_merge, _GRAPH_NEEDS, "task", ("tasks.graph.stage",),
                            task_sizes=_merge_sizes)
GROWING_GROUP_PAIRS = 125  # about a quarter of the planted found pairs at 10k: 4 groups there, ~40 at 100k
STEPS["graph_merge_growing"] = Step("graph_merge_growing", run_merge_growing, _GRAPH_NEEDS, "task",
                                    ("tasks.graph.stage",))


@step("graph_knn_cap", _GRAPH_NEEDS, "flow", ("tasks.graph.stage",))
def run_knn_cap(store, sc: Scale, data: str) -> dict[str, Any]:
    """The k-NN cap check after a partial rerun: every node's degree from the edge files."""
    from tasks.graph.edges import node_degrees
    from tasks.graph.nodes import number_nodes

    nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
    degree = node_degrees(_graph_out(data, GRAPH_TAG), nodes)
    return {"tasks": 0, "params": [], "max_degree": int(degree.max())}


@step("graph_recall", _GRAPH_NEEDS, "task", ("tasks.graph.stage",))
def run_recall(store, sc: Scale, data: str) -> dict[str, Any]:
    """The recall task (one): the sample's reference files against the edge files."""
    from tasks.graph.edges import graph_recall

    kwargs = dict(out=_graph_out(data, GRAPH_TAG), shard_table=_graph_state(data)["table"],
                  cfg=_near_config(MODEL_512))
    return {"tasks": 1, "params": [kwargs], "recall": graph_recall(**kwargs)["recall"]}


@step("graph_review", _GRAPH_NEEDS, "task", ("tasks.graph.stage",))
def run_review(store, sc: Scale, data: str) -> dict[str, Any]:
    """The review-pair choice (one task) over the edge files."""
    from corpusforge.contract import marker_path
    from tasks.graph.files import GRAPH_REVIEW
    from tasks.graph.review import select_review_pairs

    out, state = _graph_out(data, GRAPH_TAG), _graph_state(data)
    out.remove(marker_path(GRAPH_REVIEW))
    kwargs = dict(out=out, cfg=_near_config(MODEL_512), shard_table=state["table"], edges=state["edges"])
    marker = select_review_pairs(**kwargs)
    return {"tasks": 1, "params": [kwargs], "review_pairs": marker.info["pairs"]}


@step("graph_verify", (*_GRAPH_NEEDS, "review512"), "task", ("tasks.graph.stage",))
def run_verify(store, sc: Scale, data: str) -> dict[str, Any]:
    """One verification task (the shard owning the most review pairs), as the stage calls it."""
    from corpusforge.contract import marker_path, require_marker
    from corpusforge.layout import staging_records, staging_tar
    from tasks.graph.files import review_path, verified_path
    from tasks.graph.nodes import number_nodes
    from tasks.graph.review import select_review_pairs
    from tasks.graph.verify import records_fingerprint, verify_shard

    out, state, cfg = _graph_out(data, GRAPH_TAG), _graph_state(data), _near_config(MODEL_512)
    review = select_review_pairs(out, cfg, state["table"], state["edges"])  # current: written as an input
    nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
    shard = max(nodes.shards, key=lambda s: out.read_parquet(review_path(s)).num_rows)
    records = {s: require_marker(store, staging_tar(s), "staging shard").outputs[staging_records(s)]
               for s in nodes.shards}
    out.remove(marker_path(verified_path(shard)))
    kwargs = dict(source=store, out=out, cfg=cfg, shard_table=state["table"], shard=shard,
                  review_digest=review.outputs[review_path(shard)], records=records_fingerprint(records))
    marker = verify_shard(**kwargs)
    return {"tasks": len(nodes.shards), "params": [kwargs], "pairs": marker.info["pairs"]}


@step("graph_decisions", _GRAPH_NEEDS, "task", ("tasks.graph.stage",))
def run_decisions(store, sc: Scale, data: str) -> dict[str, Any]:
    """The decisions task (one), as the stage calls it in mode gpic_exact."""
    from corpusforge.contract import marker_path
    from tasks.graph.files import GRAPH_DECISIONS
    from tasks.graph.decisions import decide_near_duplicates

    out, state = _graph_out(data, GRAPH_TAG), _graph_state(data)
    out.remove(marker_path(GRAPH_DECISIONS))
    kwargs = dict(source=store, out=out, cfg=_near_config(MODEL_512), shard_table=state["table"],
                  edges=state["edges"], records=state["records"], verified=None)
    marker = decide_near_duplicates(**kwargs)
    return {"tasks": 1, "params": [kwargs], "removed": marker.info["removed"]}


# The scale guard's collision models (quick sizes): the same code with the sample capped at
# this many vectors, so 10k and 100k lie past the cap as 10⁸ lies past the default 2M (past
# it from 6.9M records on, beyond what runs here): it measures what grows with N there, the
# pass over the corpus; the search at the default cap is a constant in N, unmeasured here.
COLLISION_GUARD_CAP = 2_000


def _collision_config(cap: int | None):
    from tasks.graph.config import CollisionConfig, NearDedupConfig

    return NearDedupConfig(model_id=MODEL_512, **({"collision": CollisionConfig(max_subset_vectors=cap)} if cap else {}))


def _collision_regime(cap: int | None) -> Callable[[int], dict[str, Any]]:
    def regime(n: int) -> dict[str, Any]:
        """Whether the corpus is counted whole and whether the sample is capped (the task's
        choose_subsets): the search grows with N below the cap and stays fixed past it."""
        from tasks.graph.collision import choose_subsets

        scale, _, whole = choose_subsets(_collision_config(cap).collision, Scale.of(n).kept)
        return {"counted whole": whole, "sample capped": scale < 1}
    return regime


def _collision(cap: int | None) -> Callable[[Any, Scale, str], dict[str, Any]]:
    def run(store, sc: Scale, data: str) -> dict[str, Any]:
        """The collision models task (one): a fresh fingerprint, so it computes."""
        from tasks.graph.collision import collision_models

        state = _graph_state(data)
        kwargs = dict(source=store, out=_graph_out(data, GRAPH_TAG), cfg=_collision_config(cap),
                      shard_table=state["table"], n_vectors=state["n_vectors"], fp=os.urandom(32).hex())
        result = collision_models(**kwargs).info
        return {"tasks": 1, "params": [kwargs], "full_size": result["full_size"], "pairs": result["pairs"],
                "searched": result["full_size"] if result["counted_whole"]
                else max(r["subset_size"] for r in result["rows"])}
    return run


STEPS["graph_collision"] = Step("graph_collision", _collision(None), _GRAPH_NEEDS, "task", ("tasks.graph.stage",),
                                regime=_collision_regime(None))


STEPS["graph_collision_guard"] = Step("graph_collision_guard", _collision(COLLISION_GUARD_CAP), _GRAPH_NEEDS, "task",
                                      ("tasks.graph.stage",), regime=_collision_regime(COLLISION_GUARD_CAP))


@step("graph_calibration", _GRAPH_NEEDS, "task", ("tasks.graph.stage",))
def run_calibration(store, sc: Scale, data: str) -> dict[str, Any]:
    """The calibration sheet task (one), after the collision models, whose pairs it samples:
    registered after graph_collision_guard, so it samples a capped sample's pairs, as at 10⁸
    (and runs at 1M, where graph_collision, counted whole, is not run)."""
    from tasks.graph.calibration import calibration_sheet

    kwargs = dict(source=store, out=_graph_out(data, GRAPH_TAG), cfg=_near_config(MODEL_512),
                  shard_table=_graph_state(data)["table"], fp=os.urandom(32).hex())
    calibration_sheet(**kwargs)
    return {"tasks": 1, "params": [kwargs]}

CROP_LINK_RATE = 0.04  # windows that are a noisy copy of another picture's whole frame: ~1 partner a picture


def write_regions(store, sc: Scale, data: str) -> None:
    """Every shard's region file in the crops' format (float16 [n, 1 + WINDOWS, 63], each
    region scaled as region_parts scales it) and their digest list: random layouts, and
    :data:`CROP_LINK_RATE` of the windows a noisy copy of the whole frame of a picture anywhere
    in the corpus, so each picture has about one candidate and a shard's partners lie in
    every shard, as a corpus's crops and their originals do. The list's digest goes to
    ``regions-512g.json``."""
    from tasks.graph.crops import WINDOWS, region_dims
    from tasks.graph.files import regions_path
    from tasks.graph.nodes import number_nodes, write_shard_digests

    split, dims = region_dims()
    out = _graph_out(data, GRAPH_TAG)
    nodes = number_nodes(store, [shard_name(s) for s in range(sc.shards)])
    frames = np.random.default_rng(11).standard_normal((nodes.n_nodes, dims)).astype(np.float32)

    def scaled(x: np.ndarray) -> np.ndarray:
        norm = ((x[..., :split] ** 2).sum(-1) ** 2 + (x[..., split:] ** 2).sum(-1) ** 2) ** 0.25
        return (x / norm[..., None]).astype(np.float16)

    digests = []
    for i, shard in enumerate(nodes.shards):
        rng = np.random.default_rng(1000 + i)
        lo, hi = int(nodes.offsets[i]), int(nodes.offsets[i + 1])
        windows = rng.standard_normal((hi - lo, WINDOWS, dims)).astype(np.float32)
        linked = rng.random((hi - lo, WINDOWS)) < CROP_LINK_RATE
        of = rng.integers(0, nodes.n_nodes, int(linked.sum()))
        windows[linked] = frames[of] + 0.3 * rng.standard_normal((len(of), dims)).astype(np.float32)
        parts = scaled(np.concatenate([frames[lo:hi, None], windows], axis=1))
        with out.atomic_write(regions_path(shard)) as f:
            np.save(f, parts, allow_pickle=False)
        digests.append(out.sha256(regions_path(shard)))
    with open(os.path.join(data, f"regions-{GRAPH_TAG}.json"), "w") as f:
        json.dump({"regions": write_shard_digests(out, "regions", nodes, digests)}, f)


INPUTS["regions512"] = lambda store, sc, src: write_regions(store, sc, os.path.dirname(src))


@step("graph_crop_candidates", (*_GRAPH_NEEDS, "regions512"), "task", ("tasks.graph.stage",))
def run_crop_candidates(store, sc: Scale, data: str) -> dict[str, Any]:
    """One crop-candidates task (the middle shard), as the stage calls it: its frames against
    every shard's windows, its partners' features read to score them. The build runs these
    units only with the flat index (``index.flat_max_vectors``, 200k vectors by default): the
    search is exhaustive, so a task's work grows with N and the S tasks' with N² (it is off
    above, where an index over the windows would be needed; tasks/graph/crops.py)."""
    from corpusforge.contract import UnitResult, marker_path
    from tasks.graph.crops import crop_candidates_shard
    from tasks.graph.files import crops_path
    from tasks.graph.nodes import number_nodes
    from tasks.shared.pair_score import PairScore

    out, state = _graph_out(data, GRAPH_TAG), _graph_state(data)
    with open(os.path.join(data, f"regions-{GRAPH_TAG}.json")) as f:
        regions = json.load(f)["regions"]
    shard = number_nodes(store, [shard_name(s) for s in range(sc.shards)]).shards[sc.shards // 2]
    rule = PairScore.from_model(_model(MODEL_512)[1]).to_json()
    index = UnitResult("0" * 64, {}, "0" * 64, {"pair_score": rule, "plan": {"kind": "flat"}}, action="skipped")
    out.remove(marker_path(crops_path(shard)))
    kwargs = dict(source=store, out=out, cfg=_near_config(MODEL_512), shard_table=state["table"], shard=shard,
                  regions=regions, index=index)
    found = crop_candidates_shard(**kwargs).info
    return {"tasks": sc.shards, "params": [kwargs], "candidates": found["candidates"], "pairs": found["pairs"]}


STEPS["graph_crop_candidates"] = dataclasses.replace(STEPS["graph_crop_candidates"],
                                                     off_above=_near_config(MODEL_WFD).index.flat_max_vectors)

_ONE_OFF = ["graph_merge", "graph_merge_growing", "graph_knn_cap", "graph_recall", "graph_review", "graph_verify",
            "graph_decisions", "graph_crop_candidates"]
FIXED.extend(["graph_driver", "faiss_build_512pq", "faiss_query_512pq", "faiss_build_512pq_guard",
              "faiss_query_512pq_guard", *_ONE_OFF, "graph_collision", "graph_calibration", "graph_collision_guard"])
# graph_collision's 10⁸ regime (the default cap) is out of reach at quick sizes: the guard runs its capped form
GUARDED.extend(["graph_driver", "faiss_build_512pq_guard", "faiss_query_512pq_guard", *_ONE_OFF,
                "graph_collision_guard", "graph_calibration"])
