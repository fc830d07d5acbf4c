"""Precision, recall (Kynkäänniemi et al. 2019), density and coverage (Naeem et al. 2020).

Conventions of GPIC's evaluation port (after clovaai/generative-evaluation-prdc):
Euclidean distances, k = 5, and the k-NN radius of a point is its k-th nearest
neighbour *other than itself* (the (k+1)-th smallest distance counting itself)::

    precision = mean_j  [∃ i: d(real_i, fake_j) < r_real_i]
    recall    = mean_i  [∃ j: d(real_i, fake_j) < r_fake_j]
    density   = mean_j  #{i: d(real_i, fake_j) < r_real_i} / k
    coverage  = mean_i  [min_j d(real_i, fake_j) < r_real_i]

Nothing here builds an N×M matrix. Radii come from FAISS ``IndexFlatL2`` (exact)
searched in query chunks for k + 1 + ``RERANK_MARGIN`` candidates, re-ranked in float64
so the radius is the float64 distance, not FAISS's float32 one. The cross terms are
computed in float64 blocks of ``block × block`` and reduced along both axes as they go,
so memory is bounded by the block whatever the set sizes (50K × 1M included). The port
compares float32 distances from a full matrix; here a point exactly on a radius can
only differ at float64 rounding level. Subsampling (both sets to at most 10,000 in the
port) is the caller's choice: see :func:`random_subsample`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import faiss
import numpy as np

# Extra FAISS candidates re-ranked in float64, so float32 near-ties cannot push the
# true k-th neighbour out of the candidate set.
RERANK_MARGIN = 3


@dataclass(frozen=True)
class PRDC:
    precision: float
    recall: float
    density: float
    coverage: float
    k: int
    n_real: int
    n_fake: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def random_subsample(x: np.ndarray, max_rows: int | None, rng: np.random.Generator) -> np.ndarray:
    """At most ``max_rows`` rows drawn without replacement (all rows, in order, if fewer)."""
    if max_rows is None or x.shape[0] <= max_rows:
        return x
    return x[np.sort(rng.choice(x.shape[0], max_rows, replace=False))]


def knn_radii(x: np.ndarray, k: int = 5, query_chunk: int = 1024) -> np.ndarray:
    """Float64 distance of every row of ``x`` to its k-th nearest other row."""
    n = x.shape[0]
    if n <= k:
        raise ValueError(f"k-NN radii with k={k} need more than {k} points, got {n}")
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    x64 = np.asarray(x, dtype=np.float64)
    index = faiss.IndexFlatL2(x32.shape[1])
    index.add(x32)
    n_candidates = min(n, k + 1 + RERANK_MARGIN)
    radii = np.empty(n, np.float64)
    for start in range(0, n, query_chunk):
        stop = min(n, start + query_chunk)
        _, ids = index.search(x32[start:stop], n_candidates)
        diff = x64[ids] - x64[start:stop, None, :]
        d2 = np.sort(np.einsum("qcd,qcd->qc", diff, diff), axis=1)
        radii[start:stop] = np.sqrt(d2[:, k])
    return radii


def _squared_norms(x: np.ndarray) -> np.ndarray:
    return np.einsum("nd,nd->n", x, x)


@dataclass
class _CrossCounts:
    """Cross-set reductions for one block of reals (against all fakes)."""

    fake_counts: np.ndarray  # reals of the block whose ball holds fake j
    real_hit: np.ndarray  # real i lies in some fake ball (recall)
    real_covered: np.ndarray  # real i's ball holds some fake (coverage: min_j d < r_i)


def _cross_block(r_blk: np.ndarray, rr2: np.ndarray, fake64: np.ndarray, fake_norms: np.ndarray,
                 rf2: np.ndarray, block: int) -> _CrossCounts:
    nf = fake64.shape[0]
    out = _CrossCounts(np.zeros(nf, np.int64), np.zeros(len(r_blk), bool), np.zeros(len(r_blk), bool))
    r_norms = _squared_norms(r_blk)[:, None]
    rad2 = rr2[:, None]
    for j in range(0, nf, block):
        d2 = r_blk @ fake64[j:j + block].T  # in place: ‖r‖² + ‖f‖² − 2 r·f, clipped at 0
        d2 *= -2.0
        d2 += r_norms
        d2 += fake_norms[None, j:j + block]
        np.maximum(d2, 0.0, out=d2)
        inside = d2 < rad2
        out.fake_counts[j:j + block] += np.count_nonzero(inside, axis=0)
        out.real_covered |= inside.any(axis=1)
        out.real_hit |= (d2 < rf2[None, j:j + block]).any(axis=1)
    return out


def prdc(real: np.ndarray, fake: np.ndarray, k: int = 5, block: int = 2048,
         real_radii: np.ndarray | None = None, threads: int | None = None) -> PRDC:
    """PRDC of ``fake`` against ``real`` (rows are feature vectors).

    ``real_radii`` may be passed when the same reference is reused (it must be
    :func:`knn_radii` of ``real`` with the same ``k``). Blocks of reals run on
    ``threads`` threads (default: one per core): numpy's element-wise passes, which
    dominate at small d, are single-threaded but release the GIL. Results do not depend
    on ``block`` or ``threads`` (integer counts only).
    """
    if real.shape[1] != fake.shape[1]:
        raise ValueError(f"feature dimensions differ: real {real.shape[1]}, fake {fake.shape[1]}")
    r_real = knn_radii(real, k) if real_radii is None else np.asarray(real_radii, np.float64)
    r_fake = knn_radii(fake, k)
    rr2, rf2 = r_real**2, r_fake**2
    real64, fake64 = np.asarray(real, np.float64), np.asarray(fake, np.float64)
    nr, nf = real64.shape[0], fake64.shape[0]
    fake_norms = _squared_norms(fake64)
    starts = range(0, nr, block)
    with ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1) as pool:
        parts = list(pool.map(lambda i: _cross_block(real64[i:i + block], rr2[i:i + block], fake64, fake_norms,
                                                     rf2, block), starts))
    fake_counts = np.sum([p.fake_counts for p in parts], axis=0)
    real_hit = np.concatenate([p.real_hit for p in parts])
    real_covered = np.concatenate([p.real_covered for p in parts])
    return PRDC(
        precision=float((fake_counts > 0).mean()),
        recall=float(real_hit.mean()),
        density=float(fake_counts.mean() / k),
        coverage=float(real_covered.mean()),
        k=k, n_real=nr, n_fake=nf,
    )
