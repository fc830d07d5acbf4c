"""All metrics of one feature set against a reference: FD, PRDC and MMD.

Used for generated images against a reference split and for the oracle (real-vs-real)
references. The FD side needs only (µ, Σ) of both sets; PRDC and MMD need feature rows,
which for a reference are its stored deterministic subsample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.stats.config import MetricsConfig
from tasks.stats.fd import frechet_distance
from tasks.stats.mmd import KernelSpec, mmd
from tasks.stats.moments import one_blas_thread
from tasks.stats.prdc import prdc, random_subsample


@one_blas_thread()
def compare(mu: np.ndarray, sigma: np.ndarray, features: np.ndarray | None,
            ref_mu: np.ndarray, ref_sigma: np.ndarray, ref_features: np.ndarray | None,
            cfg: MetricsConfig) -> dict[str, Any]:
    """Metrics of a set (``mu``, ``sigma``, rows ``features``) against a reference.

    PRDC subsamples both row sets to ``cfg.prdc_max_samples`` with a seeded generator
    (reference first); MMD draws its subsets from all rows given. Without rows on either
    side, only FD is computed and ``notes`` says so. BLAS runs on one thread
    (:func:`~tasks.stats.moments.one_blas_thread`, for every call): the same bytes in any process.
    """
    fd = frechet_distance(mu, sigma, ref_mu, ref_sigma, method=cfg.fd_method)
    out: dict[str, Any] = {"fd": fd.fd, "fd_mu": fd.fd_mu, "fd_sigma": fd.fd_sigma,
                           "fd_method": fd.method, "fd_diagonal_offset": fd.diagonal_offset, "notes": []}
    if features is None or ref_features is None or min(len(features), len(ref_features)) <= cfg.k:
        out["notes"].append("PRDC and MMD skipped: feature rows missing or too few on one side")
        return out
    rng = np.random.default_rng(cfg.seed)
    real = random_subsample(ref_features, cfg.prdc_max_samples, rng)
    fake = random_subsample(features, cfg.prdc_max_samples, rng)
    p = prdc(real, fake, k=cfg.k)
    out.update(precision=p.precision, recall=p.recall, density=p.density, coverage=p.coverage,
               prdc_k=p.k, prdc_n_real=p.n_real, prdc_n_fake=p.n_fake)
    kernel = KernelSpec(cfg.mmd_kernel, sigma=cfg.mmd_rbf_sigma)
    m = mmd(ref_features, features, kernel, n_subsets=cfg.mmd_subsets, subset_size=cfg.mmd_subset_size,
            seed=cfg.seed)
    out.update(mmd2=m.mmd2, mmd2_std=m.mmd2_std, mmd_subsets=m.n_subsets, mmd_subset_size=m.subset_size,
               mmd_kernel=m.kernel)
    return out
