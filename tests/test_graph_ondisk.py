"""IVF indexes built in blocks and merged into on-disk lists (issue 22): the same pairs as one
index built in memory, lists memory-mapped by the queries, reruns and crashes that end
where a fresh build does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import faiss
import numpy as np
import pytest

from corpusforge.contract import UnitResult, read_marker
from corpusforge.faults import ENV
from corpusforge.hashing import stable_uniform
from tasks.graph.files import GRAPH_INDEX, GRAPH_INDEX_LISTS, GRAPH_INDEX_TRAINED, found_path, index_block_path
from corpusforge.storage import Store
from corpusforge.feature_files import write_shard_features
from tasks.graph import build, edges, ondisk
from tasks.graph import index as fx
from tasks.graph.build import build_index, index_blocks
from tasks.graph.config import (CalibrationConfig, CollisionConfig, IndexAdvanced, IndexConfig, NearDedupConfig,
                                VerificationConfig)
from tasks.graph.edges import feature_digests, load_index, query_shard
from tasks.graph.nodes import load_shard_vectors, number_nodes, write_shard_table
from tasks.graph.stage import near_duplicate_stage
from tests.graph_corpus import write_corpus
from tests.test_graph_stage import tree_bytes

pytestmark = pytest.mark.timeout(300)

QUICK = dict(collision=CollisionConfig(enabled=False), calibration=CalibrationConfig(enabled=False),
             verification=VerificationConfig(mode="gpic_exact"), recall_queries=200)


@pytest.fixture
def small_blocks(monkeypatch):
    """About 300 vectors of IVF-PQ8 lists (16 B each) per add task: several blocks per index,
    merged about 200 vectors' lists at a time: several ranges."""
    monkeypatch.setattr(build, "ADD_BLOCK_BYTES", 300 * 16)
    monkeypatch.setattr(ondisk, "MERGE_RANGE_BYTES", 200 * 16)


def ivf_cfg(storage: str = "pq", search: str = "range") -> NearDedupConfig:
    return NearDedupConfig(index=IndexConfig(kind="ivf", nlist=32, nprobe=8, storage=storage, pq_m=8,
                                             search=search, k=16,
                                             advanced=IndexAdvanced(pq_rescore_margin=0.15)), **QUICK)


def shard_table(store: Store, shards: list[str], cfg: NearDedupConfig) -> tuple[str, dict[str, str]]:
    nodes = number_nodes(store, shards)
    digests = feature_digests(store, cfg, nodes)
    return write_shard_table(store, nodes, digests), digests


def reference_index(store: Store, shards: list[str], cfg: NearDedupConfig, info: UnitResult) -> faiss.Index:
    """The old build with plain FAISS: k-means and PQ trained on the seeded sample (keys by
    hash, in hash order), then every shard added to one index in memory, in shard order."""
    choice = fx.IndexChoice.from_json(info.info["plan"])
    nodes = number_nodes(store, shards)
    loaded = [load_shard_vectors(store, cfg.model_id, s, int(nodes.offsets[i])) for i, s in enumerate(nodes.shards)]
    rate = choice.n_train / info.info["n_vectors"]
    drawn = sorted((u, i, r) for i, (_, keys, _) in enumerate(loaded)
                   for r, k in enumerate(keys) if (u := stable_uniform(cfg.seed, f"train:{k}")) < rate)
    sample = np.stack([loaded[i][2][r] for _, i, r in drawn]).astype(np.float32)
    index = faiss.index_factory(choice.dim, choice.factory, faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.seed = cfg.seed
    if choice.storage == "pq":
        index.pq.cp.seed = cfg.seed
        index.do_polysemous_training = False
    index.train(sample)
    for ids, _, x in loaded:
        index.add_with_ids(x, ids)
    ivf.nprobe = choice.nprobe
    return index


@pytest.mark.parametrize("storage,search", [("pq", "range"), ("pq", "knn"), ("sqfp16", "range")])
def test_on_disk_index_finds_the_pairs_of_one_index_built_in_memory(tmp_path, small_blocks, monkeypatch,
                                                                    storage, search):
    store, shards, _ = write_corpus(str(tmp_path), n_shards=5, per_shard=300, dim=32, seed=5)
    cfg = ivf_cfg(storage, search)
    table, digests = shard_table(store, shards, cfg)
    info, added = build_index(store, store, cfg, table)
    nodes = number_nodes(store, shards)
    assert len(index_blocks(nodes, fx.IndexChoice.from_json(info.info["plan"]))) >= 3
    assert added.computed >= 3
    ref = reference_index(store, shards, cfg, info)
    with open(store.path(GRAPH_INDEX_TRAINED), "rb") as f:  # training as before: the same bytes
        trained = fx.read_index(f)
    assert np.array_equal(faiss.serialize_index(trained), faiss.serialize_index(_empty(ref)))

    _, mapped, _ = load_index(store, info, use_gpu=False)
    q = np.concatenate([load_shard_vectors(store, cfg.model_id, s, 0)[2] for s in nodes.shards])
    assert all(np.array_equal(a, b) for a, b in zip(ref.search(q, 16), mapped.search(q, 16), strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(ref.range_search(q, 0.8), mapped.range_search(q, 0.8),
                                                    strict=True))

    def found() -> dict[str, bytes]:
        for s in nodes.shards:
            query_shard(store, store, cfg, table, s, digests[s], info, force=True)
        return {s: store.read_bytes(found_path(s)) for s in nodes.shards}

    on_disk = found()
    monkeypatch.setattr(edges, "load_index", lambda out, info, use_gpu: (ref, ref, False))
    in_memory = found()
    assert on_disk == in_memory
    assert sum(read_marker(store, found_path(s)).info["pairs"] for s in nodes.shards) > 100


def _empty(index: faiss.Index) -> faiss.Index:
    """A copy of a trained IVF index without its vectors."""
    empty = faiss.clone_index(index)
    empty.reset()
    return empty


def test_queries_map_the_lists_and_load_none_of_them(tmp_path, small_blocks):
    store, shards, _ = write_corpus(str(tmp_path), n_shards=3, per_shard=300, dim=32, seed=2)
    cfg = ivf_cfg()
    table, _ = shard_table(store, shards, cfg)
    info, _ = build_index(store, store, cfg, table)
    cpu, _, _ = load_index(store, info, use_gpu=False)
    lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(cpu).invlists)
    assert isinstance(lists, faiss.OnDiskInvertedLists) and lists.read_only
    assert lists.filename == store.path(GRAPH_INDEX_LISTS)  # a local store's file, mapped in place
    with open("/proc/self/maps") as f:
        assert store.path(GRAPH_INDEX_LISTS) in f.read()
    assert lists.totsize == store.size(GRAPH_INDEX_LISTS) == 900 * (8 + 8)  # codes and ids of every vector
    with open(store.path(GRAPH_INDEX), "rb") as f:  # the index file holds no list: only their offsets
        header = faiss.read_index(faiss.PyCallbackIOReader(f.read), faiss.IO_FLAG_SKIP_IVF_DATA)
    assert header.ntotal == 900
    marker = read_marker(store, GRAPH_INDEX)
    assert set(marker.outputs) == {GRAPH_INDEX, GRAPH_INDEX_LISTS}
    assert marker.outputs[GRAPH_INDEX_LISTS] == info.outputs[GRAPH_INDEX_LISTS] == store.sha256(GRAPH_INDEX_LISTS)
    blocks = index_blocks(number_nodes(store, shards), fx.IndexChoice.from_json(info.info["plan"]))
    for first, _ in blocks:
        assert read_marker(store, index_block_path(first)).outputs[index_block_path(first)]


def test_merging_by_ranges_of_lists_writes_the_file_one_merge_writes(tmp_path, monkeypatch):
    store, shards, _ = write_corpus(str(tmp_path / "corpus"), n_shards=3, per_shard=300, dim=32, seed=2)
    monkeypatch.setattr(build, "ADD_BLOCK_BYTES", 300 * 16)
    cfg = ivf_cfg()
    files = []
    for budget in (1 << 30, 200 * 16, 1):  # one range, a few, one list each
        monkeypatch.setattr(ondisk, "MERGE_RANGE_BYTES", budget)
        out = Store(str(tmp_path / f"out-{budget}"))
        nodes = number_nodes(store, shards)
        build_index(store, out, cfg, write_shard_table(out, nodes, feature_digests(store, cfg, nodes)))
        files.append((out.read_bytes(GRAPH_INDEX), out.read_bytes(GRAPH_INDEX_LISTS)))
    assert files[0] == files[1] == files[2]


def test_a_remote_index_is_copied_once_to_the_local_cache_and_gives_the_same_pairs(tmp_path, small_blocks,
                                                                                   monkeypatch):
    store, shards, _ = write_corpus(str(tmp_path / "corpus"), n_shards=3, per_shard=300, dim=32, seed=2)
    cfg = ivf_cfg()
    monkeypatch.setenv("CORPUSFORGE_INDEX_CACHE", str(tmp_path / "cache"))
    remote = Store(f"memory://{tmp_path.name}/out")
    nodes = number_nodes(store, shards)
    digests = feature_digests(store, cfg, nodes)
    found = {}
    for out in (store, remote):
        table = write_shard_table(out, nodes, digests)
        info, _ = build_index(store, out, cfg, table)
        for s in nodes.shards:
            query_shard(store, out, cfg, table, s, digests[s], info)
        found[out.root] = [out.read_bytes(found_path(s)) for s in nodes.shards]
    assert found[store.root] == found[remote.root]
    copies = list((tmp_path / "cache").rglob("index.ivfdata"))
    assert len(copies) == 1 and copies[0].read_bytes() == remote.read_bytes(GRAPH_INDEX_LISTS)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith(".part")]


def test_unchanged_rerun_skips_every_block_and_a_changed_shard_ends_as_a_fresh_build(tmp_path, small_blocks):
    a, shards, _ = write_corpus(str(tmp_path / "a"), n_shards=4, per_shard=300, dim=32, seed=3)
    b, _, _ = write_corpus(str(tmp_path / "b"), n_shards=4, per_shard=300, dim=32, seed=3)
    cfg = ivf_cfg()
    _, work = near_duplicate_stage(a, cfg, shards)
    assert work["index_blocks"]["computed"] >= 3
    _, work = near_duplicate_stage(a, cfg, shards)
    assert work["index"] == "skipped" and work["index_blocks"]["computed"] == 0
    for store in (a, b):  # one shard's features change
        shard = sorted(shards)[2]
        ids, keys, x = load_shard_vectors(store, cfg.model_id, shard, 0)
        x = np.roll(x, 1, axis=0)
        write_shard_features(store, cfg.model_id, shard, keys, [f"sha-{k}" for k in keys], [True] * len(keys),
                             [None] * len(keys), x.astype(np.float16), "changed", {"model": {"id": cfg.model_id}})
    near_duplicate_stage(a, cfg, shards)
    near_duplicate_stage(b, cfg, shards)
    for folder in ("graph", "work/graph"):
        assert tree_bytes(tmp_path / "a" / folder) == tree_bytes(tmp_path / "b" / folder)


CRASH = """
import json, sys
from corpusforge.storage import Store
from tasks.graph import build
from tasks.graph.stage import near_duplicate_stage
from tests.test_graph_ondisk import ivf_cfg
build.ADD_BLOCK_BYTES = 300 * 16
near_duplicate_stage(Store(sys.argv[1]), ivf_cfg(), json.loads(sys.argv[2]))
"""


def test_index_build_killed_mid_blocks_resumes_to_the_uninterrupted_index(tmp_path, small_blocks):
    crashed, shards, _ = write_corpus(str(tmp_path / "crashed"), n_shards=4, per_shard=300, dim=32, seed=3)
    clean, _, _ = write_corpus(str(tmp_path / "clean"), n_shards=4, per_shard=300, dim=32, seed=3)
    blocks = [f for f, _ in index_blocks(number_nodes(clean, shards), fx.choose_index(ivf_cfg().index, 1200, 32))]
    env = {**os.environ, ENV: f"graph.index.add@{blocks[1]}", "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", CRASH, crashed.root, json.dumps(shards)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == -9, done.stderr[-2000:]
    assert read_marker(crashed, index_block_path(blocks[0])) is not None
    assert read_marker(crashed, index_block_path(blocks[1])) is None and read_marker(crashed, GRAPH_INDEX) is None

    _, work = near_duplicate_stage(crashed, ivf_cfg(), shards)
    assert work["index_blocks"] == {"computed": len(blocks) - 1, "skipped": 1}
    near_duplicate_stage(clean, ivf_cfg(), shards)
    for folder in ("graph", "work/graph"):
        assert tree_bytes(tmp_path / "crashed" / folder) == tree_bytes(tmp_path / "clean" / folder)
