"""MMD against a direct pairwise computation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tasks.stats.mmd import KernelSpec, mmd, mmd2_unbiased


def direct_mmd2(x, y, k) -> float:
    m = len(x)
    xx = sum(k(x[i], x[j]) for i, j in itertools.permutations(range(m), 2)) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i, j in itertools.permutations(range(m), 2)) / (m * (m - 1))
    xy = sum(k(a, b) for a in x for b in y) / (m * m)
    return xx + yy - 2 * xy


def poly(a, b):
    return (a @ b / a.size + 1.0) ** 3


def rbf(a, b, sigma=1.5):
    return np.exp(-np.sum((a - b) ** 2) / (2 * sigma**2))


def test_unbiased_mmd_matches_direct_sums():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((25, 7)), rng.standard_normal((25, 7)) + 0.3
    assert mmd2_unbiased(x, y) == pytest.approx(direct_mmd2(x, y, poly), rel=1e-10)
    assert mmd2_unbiased(x, y, KernelSpec("rbf", sigma=1.5)) == pytest.approx(direct_mmd2(x, y, rbf), rel=1e-10)


def test_subset_average_matches_direct_computation_with_the_same_draws():
    rng = np.random.default_rng(1)
    real, fake = rng.standard_normal((60, 5)), rng.standard_normal((45, 5)) * 1.2
    got = mmd(real, fake, n_subsets=4, subset_size=30, seed=7)
    draws = np.random.default_rng(7)
    values = []
    for _ in range(4):
        xr = real[draws.choice(60, 30, replace=False)]
        xf = fake[draws.choice(45, 30, replace=False)]
        values.append(direct_mmd2(xr, xf, poly))
    assert got.mmd2 == pytest.approx(np.mean(values), rel=1e-10)
    assert got.mmd2_std == pytest.approx(np.std(values), rel=1e-8)
    assert (got.n_subsets, got.subset_size) == (4, 30)
    assert got.kernel == {"kind": "polynomial", "degree": 3, "gamma": None, "coef0": 1.0, "sigma": 10.0}


def test_subset_size_is_capped_by_the_smaller_set_and_mmd_separates_distributions():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((300, 8)), rng.standard_normal((200, 8))
    same = mmd(a, b, n_subsets=10, subset_size=1000, seed=0)
    shifted = mmd(a, b + 1.0, n_subsets=10, subset_size=1000, seed=0)
    assert same.subset_size == 200
    assert abs(same.mmd2) < 0.2 * shifted.mmd2


def test_mmd_rejects_bad_input():
    with pytest.raises(ValueError):
        mmd2_unbiased(np.zeros((3, 2)), np.zeros((4, 2)))
    with pytest.raises(ValueError):
        KernelSpec("laplace").gram(np.zeros((2, 2)), np.zeros((2, 2)))  # type: ignore[arg-type]
