"""Streaming mean/covariance and feature samples: any sharding, any worker count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpusforge.contract import tree_reduce
from tasks.stats.moments import Moments
from tasks.stats.subsample import KeyedSample


def shards_of(x: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    bounds = [0, *sorted(c % (x.shape[0] + 1) for c in cuts), x.shape[0]]
    return [x[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 80), d=st.integers(1, 6), seed=st.integers(0, 2**31),
       offset=st.sampled_from([0.0, 1e3, 1e6]), cuts=st.lists(st.integers(0, 1000), max_size=8),
       block_rows=st.integers(1, 50))
def test_streaming_moments_equal_numpy_for_any_sharding(n, d, seed, offset, cuts, block_rows):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0, d) + offset
    total = tree_reduce([Moments.of(s.reshape(-1, d), block_rows=block_rows) for s in shards_of(x, cuts)],
                        Moments.merge)
    assert total.n == n and type(total.n) is int
    np.testing.assert_allclose(total.mean, np.mean(x, axis=0), rtol=1e-12, atol=1e-12 * max(offset, 1))
    expected = np.cov(x, rowvar=False).reshape(d, d)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(total.covariance(), expected, rtol=1e-7, atol=1e-9 * scale)


def test_moments_resist_cancellation_where_raw_sums_fail():
    """Mean 1e8, spread 1: Σxxᵀ/n − µµᵀ loses every digit, the pairwise merge none."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 4)) + 1e8
    shards = np.array_split(x, 7)
    got = tree_reduce([Moments.of(s) for s in shards], Moments.merge).covariance()
    expected = np.cov(x, rowvar=False)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8)
    raw = (x.T @ x - len(x) * np.outer(x.mean(0), x.mean(0))) / (len(x) - 1)
    assert np.abs(raw - expected).max() > 1.0  # the naive formula really does fail here


def test_merge_with_empty_and_errors():
    x = np.arange(12.0).reshape(6, 2)
    m = Moments.of(x)
    assert Moments.empty(2).merge(m) is m and m.merge(Moments.empty(2)) is m
    with pytest.raises(ValueError):
        m.merge(Moments.empty(3))
    with pytest.raises(ValueError):
        Moments.of(x[:1]).covariance()
    with pytest.raises(ValueError):
        tree_reduce([], Moments.merge)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 60), size=st.integers(1, 20), cuts=st.lists(st.integers(0, 100), max_size=6),
       seed=st.integers(0, 1000), perm_seed=st.integers(0, 1000))
def test_keyed_sample_is_independent_of_sharding_and_order(n, size, cuts, seed, perm_seed):
    keys = [f"k{i:03d}" for i in range(n)]
    feats = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    whole = KeyedSample.of(keys, feats, size, seed)
    order = np.random.default_rng(perm_seed).permutation(n)
    keys_p, feats_p = [keys[i] for i in order], feats[order]
    bounds = [0, *sorted(c % (n + 1) for c in cuts), n]
    parts = [KeyedSample.of(keys_p[a:b], feats_p[a:b], size, seed) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    merged = parts[0]
    for p in parts[1:]:
        merged = p.merge(merged)
    assert merged.keys == whole.keys and len(whole.keys) == min(n, size)
    np.testing.assert_array_equal(merged.features, whole.features)
    # each kept row is the feature row of its key
    for k, row in zip(whole.keys, whole.features, strict=True):
        np.testing.assert_array_equal(row, feats[keys.index(k)])


def _moments_of_shard(seed: int, n: int, d: int) -> Moments:
    rng = np.random.default_rng(seed)
    return Moments.of(rng.standard_normal((n, d)) * 2.0 + 5.0)


def _shard_sizes() -> list[int]:
    return [17, 1, 40, 23, 0, 9, 31]


@pytest.mark.timeout(120)
def test_merge_on_a_two_process_cluster_equals_in_process(local_cluster):
    """Partials computed and tree-merged on 2 worker processes give the in-process result."""
    from distributed import Client

    d = 5
    sizes = _shard_sizes()
    local = tree_reduce([_moments_of_shard(i, n, d) for i, n in enumerate(sizes)], Moments.merge)
    with Client(local_cluster(n_workers=2, threads_per_worker=1)) as client:
        level = [client.submit(_moments_of_shard, i, n, d, pure=False) for i, n in enumerate(sizes)]
        remote = tree_reduce(level, lambda a, b: client.submit(Moments.merge, a, b)).result()
    assert remote.n == local.n == sum(sizes)
    np.testing.assert_array_equal(remote.mean, local.mean)
    np.testing.assert_array_equal(remote.m2, local.m2)
    xs = np.concatenate([np.random.default_rng(i).standard_normal((n, d)) * 2.0 + 5.0 for i, n in enumerate(sizes)])
    np.testing.assert_allclose(remote.covariance(), np.cov(xs, rowvar=False), rtol=1e-10, atol=1e-12)
