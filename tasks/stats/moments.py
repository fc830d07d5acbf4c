"""Streaming, mergeable first and second moments of feature vectors.

A partial is ``(n, mean, M2)`` with ``M2 = Σ (x − mean)(x − mean)ᵀ``, accumulated in
float64. Partials merge with Chan, Golub & LeVeque's pairwise update, so shards are
summarised independently and reduced in a tree. Keeping the scatter matrix about the
partial's own mean (rather than raw ``Σxxᵀ``) avoids the catastrophic cancellation of
``Σxxᵀ/n − µµᵀ`` when features have a large mean relative to their spread, which
un-normalised DINOv2 features do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

# Most rows per float64 block when summarising an array: bounds the temporary copy
# (16384 × 1024 × 8 B = 128 MB) however large the input is.
BLOCK_ROWS = 16384


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS and LAPACK on one thread for the block. A product's or a decomposition's last
    bits follow the threads its BLAS splits the work across, which differ between a Dask
    worker (one) and a flow's own process (every core); statistics and metrics near zero
    (an FD of 1e-5) then differed in their last digits between two runs of the same input."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@dataclass(frozen=True)
class Moments:
    """Count, mean and scatter matrix of a set of ``dim``-dimensional vectors."""

    n: int
    mean: np.ndarray  # float64 [dim]
    m2: np.ndarray  # float64 [dim, dim], Σ (x − mean)(x − mean)ᵀ

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @classmethod
    def empty(cls, dim: int) -> Moments:
        return cls(0, np.zeros(dim, np.float64), np.zeros((dim, dim), np.float64))

    @classmethod
    def of(cls, x: np.ndarray, block_rows: int = BLOCK_ROWS) -> Moments:
        """Summarise the rows of ``x`` (any float dtype), one float64 block at a time."""
        if x.ndim != 2:
            raise ValueError(f"expected a 2-d array of row vectors, got shape {x.shape}")
        total = cls.empty(x.shape[1])
        n_blocks = max(1, -(-x.shape[0] // block_rows))
        bounds = np.linspace(0, x.shape[0], n_blocks + 1).astype(int)  # even blocks: no tiny GEMM at the end
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            if stop == start:
                continue
            block = np.array(x[start:stop], dtype=np.float64)  # always a copy: centred in place below
            mean = block.mean(axis=0)
            block -= mean
            with one_blas_thread():
                scatter = block.T @ block
            total = total.merge(cls(int(stop - start), mean, scatter))
        return total

    def merge(self, other: Moments) -> Moments:
        """The moments of the union of both sets (Chan et al. 1979)."""
        if self.dim != other.dim:
            raise ValueError(f"cannot merge moments of dimension {self.dim} and {other.dim}")
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / n)
        m2 = self.m2 + other.m2 + np.outer(delta, delta) * (self.n * other.n / n)
        return Moments(n, mean, m2)

    def covariance(self) -> np.ndarray:
        """Unbiased covariance (``np.cov`` with ``rowvar=False``)."""
        if self.n < 2:
            raise ValueError(f"a covariance needs at least 2 vectors, got {self.n}")
        return self.m2 / (self.n - 1)
