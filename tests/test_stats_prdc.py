"""PRDC against a brute-force numpy implementation; chunked equals unchunked."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from tasks.stats.prdc import knn_radii, prdc, random_subsample


def brute_radii(x: np.ndarray, k: int) -> np.ndarray:
    d = cdist(x, x)
    return np.partition(d, k, axis=1)[:, k]  # k-th smallest counting the point itself at 0


def brute_prdc(real: np.ndarray, fake: np.ndarray, k: int) -> dict[str, float]:
    """Naeem et al.'s definitions with full distance matrices."""
    rr, rf = brute_radii(real, k), brute_radii(fake, k)
    d = cdist(real, fake)
    return {
        "precision": float((d < rr[:, None]).any(axis=0).mean()),
        "recall": float((d < rf[None, :]).any(axis=1).mean()),
        "density": float((d < rr[:, None]).sum(axis=0).mean() / k),
        "coverage": float((d.min(axis=1) < rr).mean()),
    }


@pytest.fixture(scope="module")
def sets() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    real = rng.standard_normal((2500, 24)).astype(np.float32) * 3.0 + 10.0
    fake = (rng.standard_normal((1800, 24)) * 3.3 + 10.4).astype(np.float32)
    return real, fake


def test_radii_match_brute_force(sets):
    real, _ = sets
    for k in (1, 5):
        np.testing.assert_allclose(knn_radii(real, k), brute_radii(real.astype(np.float64), k), rtol=1e-12)


def test_prdc_matches_brute_force(sets):
    real, fake = sets
    got = prdc(real, fake, k=5)
    expected = brute_prdc(real.astype(np.float64), fake.astype(np.float64), 5)
    assert {m: getattr(got, m) for m in expected} == expected
    assert 0.3 < got.precision < 1.0 and 0.3 < got.recall < 1.0  # a non-trivial case
    assert (got.n_real, got.n_fake, got.k) == (2500, 1800, 5)


def test_chunked_path_equals_unchunked(sets):
    real, fake = sets
    whole = prdc(real, fake, k=3, block=10**6, threads=1)
    chunked = prdc(real, fake, k=3, block=97, threads=3)
    assert whole == chunked
    np.testing.assert_array_equal(knn_radii(real, 3, query_chunk=10**6), knn_radii(real, 3, query_chunk=61))


def test_prdc_with_precomputed_radii_and_against_itself(sets):
    real, _ = sets
    radii = knn_radii(real, 5)
    got = prdc(real, real, k=5, real_radii=radii)
    assert (got.precision, got.recall, got.coverage) == (1.0, 1.0, 1.0)
    assert got == prdc(real, real, k=5)


def test_duplicates_give_zero_radii_and_no_self_match():
    x = np.repeat(np.arange(4, dtype=np.float32)[:, None], 3, axis=0) * np.ones((1, 2), np.float32)
    # each point has 2 exact copies: the 2nd neighbour other than itself is at distance 0
    np.testing.assert_array_equal(knn_radii(x, 2), np.zeros(12))
    assert knn_radii(x, 3).min() > 0


def test_random_subsample_is_seeded_and_bounded():
    x = np.arange(100).reshape(50, 2)
    a = random_subsample(x, 10, np.random.default_rng(1))
    b = random_subsample(x, 10, np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (10, 2) and len({tuple(r) for r in a}) == 10
    assert random_subsample(x, None, np.random.default_rng(1)) is x
    assert random_subsample(x, 50, np.random.default_rng(1)) is x
