"""Fréchet distance against an independent scipy computation and closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from tasks.stats.fd import frechet_distance, trace_sqrt_product


def reference_fd(mu1, s1, mu2, s2) -> float:
    """FD the way pytorch-fid writes it, independently of tasks.stats.fd."""
    covmean = scipy.linalg.sqrtm(s1.dot(s2))
    if not np.isfinite(covmean).all():
        off = np.eye(s1.shape[0]) * 1e-6
        covmean = scipy.linalg.sqrtm((s1 + off).dot(s2 + off))
    covmean = np.real(covmean)
    diff = mu1 - mu2
    return float(diff.dot(diff) + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def gaussian_stats(rng, n, d, scale=1.0, shift=0.0, rank=None):
    mix = rng.standard_normal((d, d)) if rank is None else rng.standard_normal((rank, d))
    x = rng.standard_normal((n, mix.shape[0])) @ mix * scale + shift
    return x.mean(axis=0), np.cov(x, rowvar=False)


@pytest.mark.parametrize("method", ["sqrtm", "eigh"])
@pytest.mark.parametrize("d", [8, 64])
def test_fd_matches_scipy_reference(method, d):
    rng = np.random.default_rng(d)
    mu1, s1 = gaussian_stats(rng, 5 * d, d)
    mu2, s2 = gaussian_stats(rng, 5 * d, d, scale=1.3, shift=0.5)
    got = frechet_distance(mu1, s1, mu2, s2, method=method)
    assert got.fd == pytest.approx(reference_fd(mu1, s1, mu2, s2), rel=1e-6)
    assert got.fd_mu + got.fd_sigma == pytest.approx(got.fd, rel=1e-12)
    assert got.fd_mu == pytest.approx(float(np.sum((mu1 - mu2) ** 2)), rel=1e-12)
    assert got.diagonal_offset == 0.0


@pytest.mark.parametrize("method", ["sqrtm", "eigh"])
def test_fd_near_singular_covariances(method):
    """Fewer samples than dimensions: both covariances are rank-deficient."""
    rng = np.random.default_rng(1)
    d = 48
    mu1, s1 = gaussian_stats(rng, 30, d)
    mu2, s2 = gaussian_stats(rng, 30, d, scale=0.7, shift=0.1, rank=12)
    assert np.linalg.matrix_rank(s2) <= 12
    got = frechet_distance(mu1, s1, mu2, s2, method=method)
    assert got.fd == pytest.approx(reference_fd(mu1, s1, mu2, s2), rel=1e-6)


def test_fd_of_commuting_covariances_has_a_closed_form():
    """Diagonal Σ: tr √(Σ1Σ2) = Σ √(a_i b_i), so FD = ‖Δµ‖² + Σ (√a_i − √b_i)²."""
    rng = np.random.default_rng(2)
    a, b = rng.uniform(0.0, 3.0, 40), rng.uniform(0.0, 3.0, 40)
    a[:5] = 0.0  # singular
    mu1, mu2 = rng.standard_normal(40), rng.standard_normal(40)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    for method in ("sqrtm", "eigh"):
        assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b), method).fd == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("method", ["sqrtm", "eigh"])
def test_fd_of_a_set_against_itself_is_zero(method):
    rng = np.random.default_rng(3)
    mu, s = gaussian_stats(rng, 200, 32)
    got = frechet_distance(mu, s, mu, s, method)
    assert got.fd_mu == 0.0
    assert abs(got.fd) < 1e-8 * np.trace(s)


def test_methods_agree_on_realistic_scale():
    """Un-normalised DINOv2-like features: large mean, anisotropic spectrum."""
    rng = np.random.default_rng(4)
    d = 96
    spectrum = np.logspace(-4, 1, d)
    basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
    x = rng.standard_normal((400, d)) * np.sqrt(spectrum) @ basis.T + 20.0
    y = rng.standard_normal((400, d)) * np.sqrt(spectrum[::-1]) @ basis.T + 20.5
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    t_sqrtm, _ = trace_sqrt_product(s1, s2, "sqrtm")
    t_eigh, _ = trace_sqrt_product(s1, s2, "eigh")
    assert t_eigh == pytest.approx(t_sqrtm, rel=1e-8)


def test_fd_rejects_mismatched_shapes_and_unknown_method():
    with pytest.raises(ValueError):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))
    with pytest.raises(ValueError):
        trace_sqrt_product(np.eye(2), np.eye(2), "cholesky")  # type: ignore[arg-type]


def test_sqrtm_fallback_adds_offset_when_not_finite(monkeypatch):
    """The port's fallback: a non-finite sqrtm is retried with 1e-6 on both diagonals."""
    real_sqrtm = scipy.linalg.sqrtm
    calls = []

    def flaky_sqrtm(a):
        calls.append(a.copy())
        return np.full_like(a, np.nan) if len(calls) == 1 else real_sqrtm(a)

    monkeypatch.setattr(scipy.linalg, "sqrtm", flaky_sqrtm)
    s1, s2 = np.diag([1.0, 2.0]), np.diag([3.0, 4.0])
    tr, offset = trace_sqrt_product(s1, s2, "sqrtm")
    assert offset == 1e-6
    np.testing.assert_array_equal(calls[1], (s1 + 1e-6 * np.eye(2)) @ (s2 + 1e-6 * np.eye(2)))
    assert tr == pytest.approx(np.sqrt(1 * 3) + np.sqrt(2 * 4), rel=1e-6)
