"""Similarity graph: exact edges equal brute force; IVF recall on planted near-duplicates."""

from __future__ import annotations

import os

import numpy as np
import pytest

from corpusforge.contract import read_marker
from tasks.graph.files import GRAPH_INDEX, GRAPH_SHARD_TABLE, found_path, routed_path
from tasks.graph import index as fx
from tasks.graph.build import build_index
from tasks.graph.config import IndexAdvanced, IndexConfig, NearDedupAdvanced, NearDedupConfig, VerificationConfig
from tasks.graph.edges import (feature_digests, found_fingerprint, graph_recall, iter_edges, merge_edges, merge_groups,
                               query_shard, recall_shard, route_pairs)
from tasks.graph.nodes import number_nodes, write_shard_table
from tasks.shared.ivf import auto_nlist
from tests.graph_corpus import at_similarity, brute_force_edges, unit, write_corpus

pytestmark = pytest.mark.timeout(120)


def run_graph(store, shards, cfg):
    nodes = number_nodes(store, shards)
    digests = feature_digests(store, cfg, nodes)
    table = write_shard_table(store, nodes, digests)
    info, _ = build_index(store, store, cfg, table)
    for s in nodes.shards:
        query_shard(store, store, cfg, table, s, digests[s], info)
        recall_shard(store, store, cfg, table, s, digests[s], info)
    merge_all(store, nodes, table, cfg.advanced.merge_max_edges)
    got = {}
    for a, b, s in iter_edges(store, nodes):
        assert np.all(a < b)
        for x, y, z in zip(a.tolist(), b.tolist(), s.tolist(), strict=True):
            assert (x, y) not in got, "an unordered pair is stored twice"
            got[(x, y)] = z
    return nodes, info, got


def merge_all(store, nodes, table, max_edges):
    """The stage's merge: the routing task, then one merge task per group."""
    found = [read_marker(store, found_path(s)) for s in nodes.shards]
    groups = merge_groups(nodes, [m.info["pairs"] for m in found], max_edges)
    routed = route_pairs(store, table, found_fingerprint([m.digest for m in found]), len(groups))
    for g in groups:
        merge_edges(store, table, g, routed.outputs[routed_path(g[0])])
    return groups


def compare(got, want, threshold, tol=1e-5, sim_tol=1e-5):
    """Equal edge sets away from the threshold (within ``tol``), with equal similarities."""
    must = {p for p, s in want.items() if s >= threshold + tol}
    allowed = set(want)
    assert must <= set(got), f"missing {sorted(must - set(got))[:5]}"
    assert set(got) <= allowed | {p for p, s in got.items() if s < threshold + tol}
    for p in got:
        if p in want:
            assert got[p] == pytest.approx(want[p], abs=sim_tol)


@pytest.mark.parametrize("search", ["range", "knn"])
def test_exact_edges_equal_brute_force(tmp_path, search):
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=50, dim=24, seed=3)
    cfg = NearDedupConfig(index=IndexConfig(kind="flat", search=search, k=160))
    _, info, got = run_graph(store, shards, cfg)
    want = brute_force_edges(store, shards, by_key, 0.90)
    assert info.info["plan"]["kind"] == "flat" and len(want) > 50
    compare(got, want, 0.90)


def test_knn_cap_limits_edges_and_recall_reports_it(tmp_path):
    # one tight cluster of 12: with k=4 every node finds only 3 neighbours
    rng = np.random.default_rng(0)
    base = unit(rng.standard_normal(16))
    x = np.stack([base] + [at_similarity(base, 0.99, rng) for _ in range(11)]
                 + [unit(rng.standard_normal(16)) for _ in range(12)]).astype(np.float32)
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=2, per_shard=12, dim=16, vectors=x)
    cfg = NearDedupConfig(index=IndexConfig(kind="flat", search="knn", k=4), recall_queries=1000,
                          verification=VerificationConfig(mode="gpic_exact"))  # the graph alone, no review band
    _, _, got = run_graph(store, shards, cfg)
    want = brute_force_edges(store, shards, by_key, 0.90)
    assert set(got) < set(want)
    rec = graph_recall(store, store.sha256(GRAPH_SHARD_TABLE), cfg)
    assert rec["queries"] == 24 and rec["reference_pairs"] == len(want)
    assert rec["recall"] == pytest.approx(len(got) / len(want))


@pytest.mark.parametrize("storage", ["flat", "sqfp16", "pq"])
def test_ivf_recall_on_planted_near_duplicates(tmp_path, storage):
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=4, per_shard=500, dim=32, seed=5)
    cfg = NearDedupConfig(index=IndexConfig(kind="ivf", nlist=32, nprobe=8, storage=storage, pq_m=8,
                                            k=16, advanced=IndexAdvanced(pq_rescore_margin=0.15)),
                          recall_queries=400, advanced=NearDedupAdvanced(recall_tolerance=1e-3))
    _, info, got = run_graph(store, shards, cfg)
    assert info.info["plan"]["factory"].startswith("IVF32,")
    want = brute_force_edges(store, shards, by_key, 0.90)
    must = {p for p, s in want.items() if s >= 0.901}
    recall = len(must & set(got)) / len(must)
    assert recall >= 0.95, recall  # stated target on clustered data with nprobe = nlist/4
    measured = graph_recall(store, store.sha256(GRAPH_SHARD_TABLE), cfg)
    assert measured["queries"] > 200 and measured["recall"] >= 0.9
    tol = 1e-5 if storage in ("flat", "pq") else 1e-3  # pq is rescored exactly; fp16 codes are not
    for p, s in got.items():
        assert p in want or s < 0.90 + tol
        if p in want:
            assert s == pytest.approx(want[p], abs=tol)


def test_canonical_pairs_keep_max_of_both_directions():
    src = np.array([5, 2, 2, 7, 3], dtype=np.int64)
    dst = np.array([2, 5, 5, 7, 9], dtype=np.int64)
    sim = np.array([0.91, 0.93, 0.92, 1.0, 0.95], dtype=np.float32)
    a, b, s = fx.canonical_pairs(src, dst, sim)
    assert a.tolist() == [2, 3] and b.tolist() == [5, 9]
    assert s.tolist() == pytest.approx([0.93, 0.95])
    a2, b2, s2 = fx.canonical_pairs(src[::-1], dst[::-1], sim[::-1])
    assert (a2.tolist(), b2.tolist(), s2.tolist()) == (a.tolist(), b.tolist(), s.tolist())


def test_index_choice_auto_and_override():
    cfg = IndexConfig(flat_max_vectors=1000)
    assert fx.choose_index(cfg, 1000, 64).kind == "flat"
    p = fx.choose_index(cfg, 100_000, 64)
    assert p.kind == "ivf" and p.nlist == 2048 and p.factory == "IVF2048,SQfp16"
    assert p.n_train == 100_000  # capped by N
    assert fx.choose_index(cfg, 1_000_000, 64).n_train == 4096 * 64
    assert fx.choose_index(IndexConfig(kind="ivf"), 500, 64).nlist == 16
    assert fx.choose_index(IndexConfig(kind="flat"), 10**7, 64).kind == "flat"
    with pytest.raises(ValueError, match="in every query worker"):  # 10⁹ x 64 floats: 264 GB
        fx.choose_index(IndexConfig(kind="flat"), 10**9, 64)
    assert auto_nlist(100_000_000, per_root=4) == 65536
    with pytest.raises(ValueError):
        fx.choose_index(IndexConfig(kind="ivf", storage="pq", pq_m=7), 10_000, 64)


def test_one_nlist_rule_sized_by_the_workload():
    """The graph (4·√N) and a contamination scan (√N, its benched IVF1024 at 10⁶) share one rule:
    a power of two at or above, within [16, 65536], >= 39 vectors per list, never more lists than vectors."""
    assert [auto_nlist(n, per_root=1) for n in (1_000_000, 200_000, 97_000, 10_000)] == [1024, 512, 512, 128]
    assert [auto_nlist(n, per_root=4) for n in (1_000_000, 97_000, 10_000)] == [4096, 2048, 256]
    assert auto_nlist(500, per_root=1) == auto_nlist(500, per_root=4) == 16 and auto_nlist(10, per_root=4) == 10


def test_ivf_training_sample_does_not_depend_on_shard_listing(tmp_path):
    store, shards, _ = write_corpus(str(tmp_path / "a"), n_shards=3, per_shard=300, dim=16, seed=2)
    cfg = NearDedupConfig(index=IndexConfig(kind="ivf", nlist=16, nprobe=4))
    nodes = number_nodes(store, shards[::-1])
    assert nodes.shards == tuple(sorted(shards))
    build_index(store, store, cfg, write_shard_table(store, nodes, feature_digests(store, cfg, nodes)))
    first = store.read_bytes(GRAPH_INDEX)
    store.remove("graph/index")
    store.remove("_markers/graph/index")
    again = number_nodes(store, list(reversed(shards)))
    table = write_shard_table(store, again, feature_digests(store, cfg, again))
    assert build_index(store, store, cfg, table)[0].action == "computed"
    assert store.read_bytes(GRAPH_INDEX) == first


@pytest.mark.gpu
def test_gpu_search_gives_the_cpu_graph(tmp_path):
    import faiss

    if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        pytest.skip("faiss without GPU support")
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=2, per_shard=200, dim=32, seed=6)
    cfg = NearDedupConfig(index=IndexConfig(kind="ivf", nlist=16, nprobe=16, storage="flat", use_gpu=True))
    nodes, info, got = run_graph(store, shards, cfg)
    assert all(read_marker(store, found_path(s)).info["gpu_search"] for s in shards)
    compare(got, brute_force_edges(store, shards, by_key, 0.90), 0.90, tol=1e-4, sim_tol=1e-4)


def test_rescoring_lookup_reads_only_the_candidates_rows(tmp_path):
    """PQ rescoring returns every target vector equal to its shard's own, reading only the
    candidates' rows of other shards' feature files, never a whole file (issue 31)."""
    from bench.scale import install_counting_fs
    from corpusforge.layout import feature_vectors
    from corpusforge.storage import Store
    from tasks.graph.edges import VectorLookup
    from tasks.graph.nodes import load_shard_vectors

    store, shards, _ = write_corpus(str(tmp_path), n_shards=5, per_shard=100, dim=256, seed=4, failed={"img_00003"})
    nodes = number_nodes(store, shards)
    full = {s: load_shard_vectors(store, "wfd", s, nodes.span(s)[0]) for s in nodes.shards}
    all_ids = np.concatenate([ids for ids, _, _ in full.values()])
    by_id = dict(zip(all_ids.tolist(), np.concatenate([x for _, _, x in full.values()]), strict=True))
    counting = install_counting_fs()
    try:
        counting.reset()
        own = nodes.shards[0]
        lookup = VectorLookup(Store(store.root), "wfd", nodes, (0, *(full[own][i] for i in (0, 2))))
        ids = np.random.default_rng(0).choice(all_ids, size=12, replace=False)
        got = lookup.vectors(ids)
        read = counting.bytes_read
    finally:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        for protocol in ("file", "local"):
            fsspec.register_implementation(protocol, LocalFileSystem, clobber=True)
    assert np.array_equal(got, np.stack([by_id[i] for i in ids.tolist()]))
    whole = sum(os.path.getsize(store.path(feature_vectors("wfd", s))) for s in nodes.shards[1:])
    assert read < whole / 4, (read, whole)  # the keys files' ok column and 12 rows, not 4 shards of vectors


def test_an_index_too_large_for_a_query_worker_is_refused_with_the_alternative(tmp_path):
    """Every query worker loads the whole index: above 16 GiB the plan is refused, naming
    IVF-PQ over a learned model (wfd's 2,096-float forms have no compact form)."""
    from tasks.graph.derived import check_index_size

    with pytest.raises(ValueError, match=r"needs 39\.\d GiB .*learned copy detector.*storage: pq"):
        fx.choose_index(IndexConfig(), 10_000_000, 2096)  # wfd forms, SQfp16: 41.9 GB
    with pytest.raises(ValueError, match="IVF65536,SQfp16"):
        fx.choose_index(IndexConfig(), 100_000_000, 512)  # SSCD, SQfp16: 103 GB
    assert fx.choose_index(IndexConfig(storage="pq"), 100_000_000, 512).bytes_per_vector == 72  # 7.2 GB
    store, _, _ = write_corpus(str(tmp_path / "corpus"), n_shards=2, per_shard=30, dim=16, seed=1)
    cfg = NearDedupConfig()
    check_index_size(store, cfg)  # 60 vectors: fine
    with pytest.raises(ValueError, match=r"60 vectors x 16 dims \(IDMap2,Flat\) needs"):
        check_index_size(store, cfg, limit=60 * (4 * 16 + 8) - 1)


def test_the_scale_benchmark_reports_wfd_refused_where_the_stage_refuses_it():
    """bench/scale.py projects the wfd index steps only up to the size choose_index accepts."""
    from bench.scale import MODEL_512, MODEL_WFD, refused_above

    n = refused_above(MODEL_WFD)
    assert n == (16 << 30) // (2 * 2096 + 8)  # SQfp16 codes and an id per wfd form, 16 GiB per query host
    fx.choose_index(IndexConfig(), n, 2096)
    with pytest.raises(ValueError, match="no compact form"):
        fx.choose_index(IndexConfig(), n + 1, 2096)
    assert refused_above(MODEL_512) == (16 << 30) // (2 * 512 + 8)



def _merge_opens(store, nodes, table, max_edges):
    """Files the merge step (routing and every group's merge) opens for reading, its markers removed."""
    from bench.scale import install_counting_fs
    from corpusforge.contract import marker_path
    from corpusforge.storage import Store
    from tasks.graph.files import GRAPH_ROUTED, edges_path

    for rel in [GRAPH_ROUTED, *(edges_path(s) for s in nodes.shards)]:
        store.remove(marker_path(rel))
    counting, opened = install_counting_fs(), []
    try:
        counting.reset(opened)
        merge_all(Store(store.root), nodes, table, max_edges)
    finally:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        for protocol in ("file", "local"):
            fsspec.register_implementation(protocol, LocalFileSystem, clobber=True)
    return opened


def test_merge_groups_give_the_one_group_graph_and_open_files_linear_in_n(tmp_path):
    """One group per shard gives the graph of one group for every shard (k-NN with a small k
    finds some pairs from the larger id's side only, so later shards' files count), and the
    merge step opens each found file once, whatever the number of groups: at one group per
    shard, twice the shards open at most 2.2× the files (the merge of before, where each group
    read every later found file, opened S(S+1)/2 found files: 3.6× from 4 to 8 shards; issue 31)."""
    opens = {}
    for n in (4, 8):
        store, shards, _ = write_corpus(str(tmp_path / str(n)), n_shards=n, per_shard=40, dim=24, seed=5)
        cfg = NearDedupConfig(index=IndexConfig(kind="flat", search="knn", k=3))
        nodes, _, one_group = run_graph(store, shards, cfg)  # the default merge_max_edges: one group
        found = [store.read_parquet(found_path(s)) for s in nodes.shards]
        from_small_side = {(nodes.offsets[i] + r, nodes.offsets[nodes.index_of(d)] + q)
                           for i, t in enumerate(found)
                           for r, d, q in zip(t["src_row"].to_pylist(), t["dst_shard"].to_pylist(),
                                              t["dst_row"].to_pylist(), strict=True)}
        assert any(p not in from_small_side for p in one_group)  # found by the larger id's query only
        table = write_shard_table(store, nodes, feature_digests(store, cfg, nodes))
        opened = _merge_opens(store, nodes, table, max_edges=1)  # one group per shard
        got = {}
        for a, b, sim in iter_edges(store, nodes):
            got.update({(x, y): z for x, y, z in zip(a.tolist(), b.tolist(), sim.tolist(), strict=True)})
        assert got == one_group
        found_files = [store.path(found_path(s)) for s in nodes.shards]
        assert sorted(p for p in opened if p in found_files) == found_files  # each once
        opens[n] = len(opened)
    assert opens[8] / opens[4] <= 2 * 1.1, opens


def test_routing_a_few_pairs_at_a_time_gives_the_same_graph(tmp_path, monkeypatch):
    """The routing task holds at most ROUTE_ROWS pairs: flushed every 5 pairs (many batches per
    group, routed files of several row groups), the edge files are byte-identical."""
    import pyarrow.parquet as pq

    from tasks.graph import edges

    trees = []
    for rows in (edges.ROUTE_ROWS, 5):
        monkeypatch.setattr(edges, "ROUTE_ROWS", rows)
        root = tmp_path / str(rows)
        store, shards, _ = write_corpus(str(root), n_shards=4, per_shard=40, dim=24, seed=5)
        run_graph(store, shards, NearDedupConfig(index=IndexConfig(kind="flat"),
                                                 advanced=NearDedupAdvanced(merge_max_edges=30)))
        trees.append({p.name: p.read_bytes() for p in sorted((root / "graph" / "edges").iterdir())})
        groups = [pq.ParquetFile(p).num_row_groups for p in (root / "work" / "graph" / "routed").iterdir()]
        assert len(groups) > 1 and (max(groups) > 1) == (rows == 5)
    assert trees[0] == trees[1]
