"""Fréchet distance between two Gaussians, split into its mean and covariance terms.

    FD = ‖µ1 − µ2‖² + tr Σ1 + tr Σ2 − 2 tr √(Σ1 Σ2) = FDµ + FDΣ      (GPIC Table B.2)

The only hard part is ``tr √(Σ1 Σ2)``. Two methods:

* ``"sqrtm"`` (default): ``scipy.linalg.sqrtm(Σ1 @ Σ2)`` exactly as GPIC's evaluation
  port (via dgm-eval / pytorch-fid) does: if the result is not finite, retry with 1e-6
  added to both diagonals; a complex result is accepted only if the imaginary part of
  its diagonal is below 1e-3, and its real part is used. Default so that numbers stay
  comparable with published GPIC values.
* ``"eigh"``: the symmetric form ``tr √(√Σ1 Σ2 √Σ1)``. ``√Σ1 Σ2 √Σ1`` is similar to
  ``Σ1 Σ2`` (same eigenvalues) but symmetric positive semi-definite, so two ``eigh``
  calls give a real answer with no fallback, about four times faster at d = 1024.
  Tiny negative eigenvalues from rounding are clipped to 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.linalg

Method = Literal["sqrtm", "eigh"]

# Diagonal offset of the port's fallback, and its tolerance on the imaginary part.
SQRTM_EPS = 1e-6
SQRTM_IMAG_ATOL = 1e-3


@dataclass(frozen=True)
class FrechetDistance:
    fd: float
    fd_mu: float  # ‖µ1 − µ2‖²
    fd_sigma: float  # tr Σ1 + tr Σ2 − 2 tr √(Σ1 Σ2)
    method: str
    diagonal_offset: float  # 0, or the fallback's offset when sqrtm was not finite


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray,
                       method: Method = "sqrtm") -> tuple[float, float]:
    """``tr √(Σ1 Σ2)`` and the diagonal offset that had to be added (0 if none)."""
    s1 = np.asarray(sigma1, dtype=np.float64)
    s2 = np.asarray(sigma2, dtype=np.float64)
    if method == "eigh":
        w, v = np.linalg.eigh(s1)
        half = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
        inner = half @ s2 @ half
        ev = np.linalg.eigvalsh((inner + inner.T) / 2)
        return float(np.sqrt(np.clip(ev, 0.0, None)).sum()), 0.0
    if method != "sqrtm":
        raise ValueError(f"unknown method {method!r}: use 'sqrtm' or 'eigh'")
    offset = 0.0
    covmean = scipy.linalg.sqrtm(s1 @ s2)
    if not np.isfinite(covmean).all():
        offset = SQRTM_EPS
        eye = np.eye(s1.shape[0]) * offset
        covmean = scipy.linalg.sqrtm((s1 + eye) @ (s2 + eye))
    if np.iscomplexobj(covmean):
        imag = np.abs(np.diagonal(covmean).imag).max()
        if imag > SQRTM_IMAG_ATOL:
            raise ValueError(f"sqrtm(Σ1 Σ2) has an imaginary component of {imag:.3g}")
        covmean = covmean.real
    return float(np.trace(covmean)), offset


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray,
                     method: Method = "sqrtm") -> FrechetDistance:
    """FD between N(µ1, Σ1) and N(µ2, Σ2), with its FDµ and FDΣ terms."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    sigma1, sigma2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (mu1.size, mu1.size):
        raise ValueError(f"shapes do not match: µ {mu1.shape} vs {mu2.shape}, Σ {sigma1.shape} vs {sigma2.shape}")
    diff = mu1 - mu2
    fd_mu = float(diff @ diff)
    tr_covmean, offset = trace_sqrt_product(sigma1, sigma2, method)
    fd_sigma = float(np.trace(sigma1) + np.trace(sigma2) - 2.0 * tr_covmean)
    return FrechetDistance(fd_mu + fd_sigma, fd_mu, fd_sigma, method, offset)
