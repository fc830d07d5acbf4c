"""Top-k search without a full matrix: a chunked exact scan and a FAISS inverted file.

Similarity is the near-duplicate graph's: the feature model's pair rule
(:mod:`tasks.shared.pair_score`) of unit float32 rows, computed in float64 and rounded to
float32, so a pair scores identically here and in ``graph/edges``. :func:`exact_topk` scores
blocks of at most :data:`BLOCK_ENTRIES` (64 MB) and rescores each row's best ``k + 4``
exactly: memory O(block + queries × k), whatever the number of targets.
:func:`ivf_search_by_list` scores each probed list against all queries probing it in one
matrix product (compute-bound; FAISS's per-query scan, :func:`ivf_search`, re-reads a list per
query and is memory-bound). Its float32 scores only choose candidates: callers rescore them
(:func:`rescore_topk`) and measure recall against :func:`exact_topk` on a sample.
"""

from __future__ import annotations

import faiss
import numpy as np

from tasks.shared.pair_score import PairScore, united_lists

BLOCK_ENTRIES = 1 << 24
RESCORE_EXTRA = 4
RESCORE_ENTRIES = 1 << 22   # values gathered for rescoring per block (32 MB as float64; rescoring them by
                            # the wfd rule peaks at ~140 MB with its float64 copies, measured)


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


def target_parts(rule: PairScore, t: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """What :func:`rule_matrix` needs of the targets (colourless mask, unit layout blocks),
    computed once for a scan over many query blocks; None for plain cosine."""
    return (rule.colourless(t), rule.unit_layout(t)) if rule.active else None


def rule_matrix(rule: PairScore, q: np.ndarray, t: np.ndarray,
                targets: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """float32 scores of every query against every target by the pair rule: the cosine, with
    colourless images' rows or columns replaced by the layout blocks' cosine (one extra product
    each). The rule itself, not the index forms' inner product, which over-estimates a colourless
    query against a nearly grey target and could push the true best out of a fixed-depth list;
    within float32 rounding of :meth:`PairScore.scores`, so the best ``k + RESCORE_EXTRA`` hold
    the exact top-k. ``targets``: :func:`target_parts` of ``t``, when the caller has them."""
    scores = q @ t.T
    if not rule.active:
        return scores
    grey_t, ut = targets or target_parts(rule, t)
    grey_q = rule.colourless(q)
    if grey_q.any() or grey_t.any():
        uq = rule.unit_layout(q)
        scores[grey_q] = uq[grey_q] @ ut.T
        scores[:, grey_t] = uq @ ut[grey_t].T
    return scores


def exact_topk(q: np.ndarray, t: np.ndarray, k: int, id_offset: int = 0, rule: PairScore | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` targets of every query by the pair ``rule`` (plain cosine when None):
    exact scores (:meth:`PairScore.scores`) and target ids (``id_offset`` + row), padded
    with -inf / -1 when there are fewer than ``k`` targets."""
    rule = rule or PairScore()
    n, m = len(q), len(t)
    sims, ids = empty_topk(n, k)
    if not n or not m:
        return sims, ids
    kk = min(k + RESCORE_EXTRA, m)
    rows = max(1, min(1024, BLOCK_ENTRIES // m, RESCORE_ENTRIES // (kk * q.shape[1])))
    targets = target_parts(rule, t)
    for lo in range(0, n, rows):
        qb = q[lo:lo + rows]
        scores = rule_matrix(rule, qb, t, targets)
        cand = (np.argpartition(-scores, kk - 1, axis=1)[:, :kk] if kk < m
                else np.broadcast_to(np.arange(m), scores.shape))
        exact = rule.scores(np.repeat(qb, kk, axis=0), t[cand.ravel()]).reshape(len(qb), kk)
        sims[lo:lo + rows], ids[lo:lo + rows] = merge_topk(sims[lo:lo + rows], ids[lo:lo + rows], exact,
                                                           cand.astype(np.int64) + id_offset, k)
    return sims, ids


def rescore_topk(q: np.ndarray, found: np.ndarray, vectors: dict[int, np.ndarray], k: int, rule: PairScore
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of each query's found target ids (-1: none) by their exact score under
    ``rule``, ``vectors`` mapping each found id to its stored row: index scores only choose
    the candidates, so an index search asks for more than ``k`` (see ``image_scan``)."""
    sims, ids = empty_topk(len(q), k)
    qi, col = np.nonzero(found >= 0)
    exact = np.full(found.shape, -np.inf, dtype=np.float32)
    if len(qi):
        rows = np.stack([vectors[int(i)] for i in found[qi, col]])
        exact[qi, col] = rule.scores(q[qi], rows)
    return merge_topk(sims, ids, exact, found, k)


def new_ivf(dim: int, nlist: int, storage: str, nprobe: int, seed: int) -> faiss.Index:
    codes = {"flat": "Flat", "sqfp16": "SQfp16"}[storage]
    index = faiss.index_factory(dim, f"IVF{nlist},{codes}", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.seed = seed
    ivf.nprobe = min(nprobe, nlist)
    return index


def list_vectors(index: faiss.Index, list_no: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids and float32 vectors stored in one inverted list (Flat or SQfp16 storage)."""
    ivf = faiss.extract_index_ivf(index)
    n = ivf.invlists.list_size(list_no)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros((0, ivf.d), np.float32)
    ids = faiss.rev_swig_ptr(ivf.invlists.get_ids(list_no), n).copy()
    raw = faiss.rev_swig_ptr(ivf.invlists.get_codes(list_no), n * ivf.code_size).copy()
    dtype = np.float32 if ivf.code_size == 4 * ivf.d else np.float16
    return ids.astype(np.int64, copy=False), raw.view(dtype).reshape(n, ivf.d).astype(np.float32, copy=False)


def ivf_search_by_list(index: faiss.Index, q: np.ndarray, k: int, nprobe: int | None = None,
                       probes: tuple[np.ndarray, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` with the candidates and float32 scores of FAISS's own search with this ``nprobe``,
    list by list (see the module docstring). ``probes``: vectors per query each choosing its own
    ``nprobe`` lists, all probed (each once) and scored with ``q`` (default: ``q`` itself)."""
    ivf = faiss.extract_index_ivf(index)
    nprobe = min(nprobe or ivf.nprobe, ivf.nlist)
    n = len(q)
    sims, out = empty_topk(n, k)
    if not n:
        return sims, out
    q = np.ascontiguousarray(q, dtype=np.float32)
    lists = united_lists(ivf.quantizer, probes or (q,), nprobe)
    qi = np.repeat(np.arange(n), lists.shape[1])
    li = lists.ravel()
    keep = li >= 0
    order = np.argsort(li[keep], kind="stable")
    qi, li = qi[keep][order], li[keep][order]
    bounds = np.flatnonzero(np.diff(li)) + 1
    found_q, found_s, found_i = [], [], []
    for group_q, group_l in zip(np.split(qi, bounds), np.split(li, bounds), strict=True):
        ids, vectors = list_vectors(index, int(group_l[0]))
        if not len(ids):
            continue
        scores = q[group_q] @ vectors.T
        kk = min(k, len(ids))
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk] if kk < len(ids) else \
            np.broadcast_to(np.arange(len(ids)), scores.shape)
        found_q.append(np.repeat(group_q, kk))
        found_s.append(np.take_along_axis(scores, top, axis=1).ravel())
        found_i.append(ids[top].ravel())
    if not found_q:
        return sims, out
    fq, fs, fi = np.concatenate(found_q), np.concatenate(found_s), np.concatenate(found_i)
    order = np.lexsort((fi, -fs.astype(np.float64), fq))
    fq, fs, fi = fq[order], fs[order], fi[order]
    rank = np.arange(len(fq)) - np.searchsorted(fq, fq)
    take = rank < k
    sims[fq[take], rank[take]] = fs[take]
    out[fq[take], rank[take]] = fi[take]
    return sims, out


def ivf_search(index: faiss.Index, q: np.ndarray, k: int, batch: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (float32 scores, ids; -inf / -1 padded) from an index, in query batches."""
    sims, ids = empty_topk(len(q), k)
    for lo in range(0, len(q), batch):
        d, i = index.search(np.ascontiguousarray(q[lo:lo + batch], dtype=np.float32), k)
        sims[lo:lo + batch] = np.where(i < 0, -np.inf, d)
        ids[lo:lo + batch] = i
    return sims, ids
