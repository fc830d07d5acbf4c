"""Top-k cosine search without a full matrix: a chunked exact scan and a FAISS inverted file.

Similarity is the one the near-duplicate graph uses: rows made unit length in float32,
then the float64 dot product of the two unit vectors, rounded to float32 — the same
value from either side, so a pair scores identically here and in ``graph/edges``.

* :func:`exact_topk` — exhaustive: queries × targets in blocks of at most
  :data:`BLOCK_ENTRIES` float32 scores (64 MB), the best ``k + 4`` of each block row
  rescored in float64, merged into a running top-k. Memory O(block + queries × k),
  whatever the number of targets; a caller streams target shards through it.
* :func:`new_ivf` / :func:`ivf_search` — ``IVF{nlist},{Flat|SQfp16}`` over inner product,
  k-means trained on a given (deterministic) sample; scores are float32 dot products
  of the stored vectors (exact for Flat, ~2e-4 for SQfp16). Approximate in *which*
  neighbours it finds: callers measure recall against :func:`exact_topk` on a sample.
"""

from __future__ import annotations

import math

import faiss
import numpy as np

BLOCK_ENTRIES = 1 << 24
RESCORE_EXTRA = 4
RESCORE_ENTRIES = 1 << 23   # float64 values gathered for rescoring per block (64 MB)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """float32 rows of unit L2 norm (float16 storage leaves norms off by ~1e-3)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-d feature array, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12))


def canonical(q: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Row-wise float64 dot products of unit float32 vectors, rounded to float32."""
    return np.einsum("ij,ij->i", q.astype(np.float64), t.astype(np.float64)).astype(np.float32)


def empty_topk(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, k), -np.inf, dtype=np.float32), np.full((n, k), -1, dtype=np.int64)


def merge_topk(sims: np.ndarray, ids: np.ndarray, new_sims: np.ndarray, new_ids: np.ndarray, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of two candidate lists per row: higher similarity first, then smaller id."""
    s = np.concatenate([sims, new_sims], axis=1)
    i = np.concatenate([ids, new_ids], axis=1)
    big = np.iinfo(np.int64).max
    order = np.lexsort((np.where(i < 0, big, i), -s.astype(np.float64)), axis=1)[:, :k]
    return np.take_along_axis(s, order, axis=1), np.take_along_axis(i, order, axis=1)


def exact_topk(q: np.ndarray, t: np.ndarray, k: int, id_offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` targets of every query: canonical similarities and target ids
    (``id_offset`` + row), padded with -inf / -1 when there are fewer than ``k`` targets."""
    n, m = len(q), len(t)
    sims, ids = empty_topk(n, k)
    if not n or not m:
        return sims, ids
    kk = min(k + RESCORE_EXTRA, m)
    rows = max(1, min(1024, BLOCK_ENTRIES // m, RESCORE_ENTRIES // (kk * q.shape[1])))
    for lo in range(0, n, rows):
        qb = q[lo:lo + rows]
        scores = qb @ t.T
        cand = (np.argpartition(-scores, kk - 1, axis=1)[:, :kk] if kk < m
                else np.broadcast_to(np.arange(m), scores.shape))
        exact = np.einsum("id,ijd->ij", qb.astype(np.float64), t[cand].astype(np.float64)).astype(np.float32)
        sims[lo:lo + rows], ids[lo:lo + rows] = merge_topk(sims[lo:lo + rows], ids[lo:lo + rows], exact,
                                                           cand.astype(np.int64) + id_offset, k)
    return sims, ids


def auto_nlist(n_vectors: int) -> int:
    """Next power of two >= 4·√N within [16, 65536], and <= N/39 (k-means needs 39 per list)."""
    nlist = min(1 << max(4, math.ceil(math.log2(max(4 * math.sqrt(max(n_vectors, 1)), 1)))), 65536)
    while nlist > 1 and nlist * 39 > n_vectors:
        nlist //= 2
    return max(nlist, 1)


def new_ivf(dim: int, nlist: int, storage: str, nprobe: int, seed: int) -> faiss.Index:
    codes = {"flat": "Flat", "sqfp16": "SQfp16"}[storage]
    index = faiss.index_factory(dim, f"IVF{nlist},{codes}", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.seed = seed
    ivf.nprobe = min(nprobe, nlist)
    return index


def ivf_search(index: faiss.Index, q: np.ndarray, k: int, batch: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (float32 scores, ids; -inf / -1 padded) from an index, in query batches."""
    sims, ids = empty_topk(len(q), k)
    for lo in range(0, len(q), batch):
        d, i = index.search(np.ascontiguousarray(q[lo:lo + batch], dtype=np.float32), k)
        sims[lo:lo + batch] = np.where(i < 0, -np.inf, d)
        ids[lo:lo + batch] = i
    return sims, ids
