"""Contamination at 10⁸: the scan index is refused above what one task may hold, with the
alternatives named, and a scan task's parameters name its sides' shard lists by digest,
never every shard."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from corpusforge.feature_files import write_shard_features
from corpusforge.storage import Store
from tasks.contamination import image_scan as scan
from tasks.contamination.config import IvfConfig
from tasks.contamination.files import found_matches_path
from tasks.contamination.selection import select_splits, write_shard_list
from tasks.shared.features.wfd import WeightFreeDescriptor
from tasks.shared.pair_score import PairScore


def test_a_scan_index_one_task_could_not_hold_is_refused_with_the_alternatives_named():
    # a learned 512-d model at 10⁸ training images: 10⁸ x (2,048 + 8) B = 191 GiB of IVF,Flat lists
    with pytest.raises(ValueError) as refused:
        scan.check_index_size("images", 10**8, 512, "flat")
    message = str(refused.value)
    assert "100,000,000 training vectors x 512 dims" in message and "191.5 GiB" in message
    assert "16.0 GiB one task may hold" in message and "search: exact" in message and "corpus_splits" in message
    with pytest.raises(ValueError, match=r"IVF,SQfp16\) needs 96\.1 GiB"):
        scan.check_index_size("leakage", 10**8, 512, "sqfp16")
    wfd = WeightFreeDescriptor()  # indexes its candidate forms: its features and their layout blocks
    form = PairScore.from_model(wfd.fingerprint()).form_dim(wfd.dim)
    with pytest.raises(ValueError, match=f"10,000,000 training vectors x {form} dims"):
        scan.check_index_size("images", 10**7, form, "flat")
    scan.check_index_size("images", 10**6, 512, "flat")  # 1.9 GiB: built
    scan.check_index_size("images", 8_000_000, 512, "sqfp16")
    assert scan.index_bytes(10**6, 512, "flat") == 10**6 * 2056


def test_a_scan_task_names_its_sides_by_digest_whatever_the_shard_count(tmp_path):
    out, corpus = Store(str(tmp_path / "out")), Store(str(tmp_path / "corpus"))
    shards = [f"{i:06d}" for i in range(100_000)]
    digests = {s: f"{i:064x}" for i, s in enumerate(shards[::7])}
    target = scan.write_side(out, "images-target", corpus, "bench512", shards, "corpus-train", digests)
    query = scan.write_side(out, "images-query", Store(str(tmp_path / "eval")), "bench512", ["000000"])
    params = dict(out=out, scan="images", query=query, shard="000000", target=target, target_digest="d" * 64, k=5)
    assert len(pickle.dumps(params, protocol=pickle.HIGHEST_PROTOCOL)) < 4096  # every name: ~1.8 MB
    scan._SIDE_CACHE.clear()
    assert target.shards == tuple(shards) and target.selection_digests == digests
    assert query.shards == ("000000",) and query.selection_digests == {}

    scan.write_side(out, "images-target", corpus, "bench512", shards[:10])  # another run rewrote the list
    scan._SIDE_CACHE.clear()
    with pytest.raises(ValueError, match="changed while a contamination scan ran"):
        target.shards


def _features(store: Store, shards: int, per_shard: int, seed: int) -> list[str]:
    """``shards`` feature shards of a 16-d model, ``per_shard`` random unit vectors each."""
    rng = np.random.default_rng(seed)
    names = [f"{i:06d}" for i in range(shards)]
    for shard in names:
        keys = [f"{shard}-{j}" for j in range(per_shard)]
        x = rng.standard_normal((per_shard, 16)).astype(np.float16)
        write_shard_features(store, "m16", shard, keys, ["0" * 64] * per_shard, [True] * per_shard,
                             [None] * per_shard, x, "fp", {"model": {"model_id": "m16", "arch": "test"}})
    return names


def test_an_ivf_scan_task_carries_the_index_in_constant_bytes_and_finds_each_shards_keys(tmp_path):
    # each target shard's first id lived in the built index's result, a parameter of every scan
    # task: O(shards), ~0.9 MB at 10⁵ shards; now a file beside the index, pinned by its SHA-256
    size = {}
    for shards in (20, 600):
        out, corpus = Store(str(tmp_path / f"out{shards}")), Store(str(tmp_path / f"corpus{shards}"))
        target = scan.write_side(out, "images-target", corpus, "m16", _features(corpus, shards, 8, shards))
        rule = scan.pair_rule(target, target)
        built = scan.build_scan_index(out, "images", target, target.digest(), IvfConfig(nlist=4, nprobe=4), rule)
        size[shards] = len(pickle.dumps(built, protocol=pickle.HIGHEST_PROTOCOL))
        last = target.shards[-1]
        query = scan.write_side(out, "images-query", corpus, "m16", [last])  # the target's own vectors
        scan.scan_shard_ivf(out, "images", query, last, target, "images", built, 1, rule)
        found = out.read_parquet(found_matches_path("images", last))
        assert found["target_key"].to_pylist() == found["query_key"].to_pylist()  # each finds itself
        assert set(found["target_shard"].to_pylist()) == {last}
    assert size[600] - size[20] < 64, size  # the digits of a count, not a list of shards


def test_a_split_selection_reads_its_shards_from_the_list_it_is_given(tmp_path):
    out, corpus = Store(str(tmp_path / "out")), Store(str(tmp_path / "corpus"))
    corpus.write_bytes("manifest/part-000.parquet", b"")  # a manifest to read; its rows come later
    listed = write_shard_list(out, "corpus-train", ["000000", "000001"])
    write_shard_list(out, "corpus-train", ["000000"])
    with pytest.raises(ValueError, match="changed while a split selection ran"):
        select_splits(corpus, out, "corpus-train", ["train"], listed)
