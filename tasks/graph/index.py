"""FAISS similarity index for the near-duplicate graph: choose, build, search, save.

Cosine similarity is the inner product of unit float32 rows (``METRIC_INNER_PRODUCT``); a model
with a pair rule is indexed by its candidate forms and queried by its query forms
(:mod:`tasks.shared.pair_score`; per-part IVF probing: docs/near-duplicates.md). Two kinds of index:

* ``flat`` — ``IndexIDMap2(IndexFlatIP)``: exact, 4·d bytes per vector; used up to
  ``flat_max_vectors`` (200k by default).
* ``ivf`` — ``IVF{nlist},{Flat|SQfp16|PQm}``: k-means coarse quantiser trained on a
  deterministic sample (a seeded hash of the key, so it does not depend on shard order), lists
  built in blocks and merged on disk (``tasks/graph/build.py``, ``tasks/graph/ondisk.py``).
  Approximate: the stage measures recall against exhaustive search on a sample every run.

Searches are k-NN (``k`` includes the query itself) or range searches; both keep pairs
with similarity >= the graph threshold, excluding self-pairs by id (not by score: exact
duplicates score 1.0 too).

Scale: 100M × 512-d (8,000 staging shards of 12.5k images)
------------------------------------------------------------
* Exact search is out of reach: 100M² × 512 × 2 ≈ 10^19 flop, and the flat index alone
  takes 100M × 512 × 4 B = 205 GB.
* ``IVF65536,SQfp16`` (nlist auto = next power of two >= 4·√N = 65,536): 1,024 B codes
  + 8 B id per vector = 103 GB of inverted lists + 134 MB of centroids. Fits one
  large-memory host (shared by the worker's threads) or two 80 GB GPUs as an
  ``IndexShards``. Scores are within ~2e-4 of exact (float16 rounding).
* ``IVF65536,PQ64``: 64 B codes + 8 B id = 7.2 GB (+134 MB centroids, 0.5 MB codebooks),
  in ``graph/index/index.ivfdata``, which every query worker maps (no private copy: the
  host's page cache holds the pages its workers probe). PQ scores are off by several 1e-2, so
  candidates are searched at ``threshold - pq_rescore_margin`` and rescored with exact
  vectors from the feature files (see ``edges.py``).
* Training: ``IVF_TRAIN_PER_LIST`` (64) vectors per list, capped at ``advanced.max_train``
  (2M) → 2M × 512 × 4 B = 4 GB in the one training task (and as much again for FAISS's PQ
  residuals); k-means cost 25 iterations × 2M × 65,536 × 1,024 flop ≈ 3·10^15 flop (GPU minutes, CPU hours — use
  ``faiss-gpu`` for the build at this size). Adding: one task per block of about 64 MiB
  of lists (0.9M PQ64 vectors, ~110 blocks), then one merge of their lists into the file.
* Search: ``nprobe=16`` scans 16/65,536 of the corpus, ~24k codes per query; 100M
  queries read ~2.5 PB of SQfp16 codes (memory bound: ~7 h on one 100 GB/s host, ~15 min
  on one H100 at 3 TB/s) or ~160 TB of PQ64 codes. Queries fan out one task per staging
  shard (12.5k queries each, batched), so hosts add linearly; each worker process opens
  the index once and keeps it (``load_index`` caches by fingerprint): the quantiser in its
  memory, the lists mapped. A shard's 12.5k × 16 probes reach nearly every one of the
  65,536 lists, so a query host pages in the whole lists file once for all its workers
  (from an object store it first copies it to local disk).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import IO

import faiss
import numpy as np

from tasks.graph.config import IndexConfig
from tasks.shared.ivf import IVF_TRAIN_PER_LIST, auto_nlist
from tasks.shared.pair_score import PairScore, united_lists

SEARCH_BATCH = 4096  # queries per FAISS call: bounds the k-NN and range result buffers
# Exact searches look this far below a threshold and keep canonical scores >= it, so a
# pair is found whatever the summation order (BLAS blocking, thread count) of the search.
EXACT_SEARCH_MARGIN = 1e-3
# A query worker reads a flat index whole and maps an IVF index's lists, which a shard's
# queries probe all over, so each query host holds the whole index (a flat one in every
# worker's memory, IVF lists in its page cache and, from an object store, its local disk):
# above this it is refused before anything is built (issue 22's per-task bound; docs/near-duplicates.md).
INDEX_WORKER_BYTES = 16 << 30


@dataclass(frozen=True)
class IndexChoice:
    """Everything that determines the index's content, fixed before it is built."""

    kind: str          # "flat" | "ivf"
    dim: int
    n_vectors: int
    nlist: int = 0
    storage: str = "flat"
    pq_m: int = 0
    nprobe: int = 0
    n_train: int = 0

    @property
    def factory(self) -> str:
        if self.kind == "flat":
            return "IDMap2,Flat"
        codes = {"flat": "Flat", "sqfp16": "SQfp16", "pq": f"PQ{self.pq_m}"}[self.storage]
        return f"IVF{self.nlist},{codes}"

    @property
    def bytes_per_vector(self) -> int:
        """Codes and id of one vector in the saved index, which every query worker holds."""
        if self.kind == "flat" or self.storage == "flat":
            return 4 * self.dim + 8
        return (2 * self.dim if self.storage == "sqfp16" else self.pq_m) + 8

    @property
    def exact_scores(self) -> bool:
        """True when stored similarities need no rescoring (all but PQ)."""
        return self.kind == "flat" or self.storage != "pq"

    def to_json(self) -> dict:
        return {**asdict(self), "factory": self.factory}

    @classmethod
    def from_json(cls, obj: dict) -> IndexChoice:
        return cls(**{k: v for k, v in obj.items() if k != "factory"})


def choose_index(cfg: IndexConfig, n_vectors: int, dim: int, limit: int = INDEX_WORKER_BYTES) -> IndexChoice:
    """Pick flat or IVF (``auto`` by size) and fix the IVF parameters; a ValueError naming
    the alternative when the index would not fit in a query worker (``limit`` bytes)."""
    kind = cfg.kind if cfg.kind != "auto" else ("flat" if n_vectors <= cfg.flat_max_vectors else "ivf")
    if kind == "flat":
        choice = IndexChoice("flat", dim, n_vectors)
    else:
        nlist = cfg.nlist or auto_nlist(n_vectors, per_root=4)
        if cfg.storage == "pq" and dim % cfg.pq_m:
            raise ValueError(f"pq_m={cfg.pq_m} must divide the feature dimension {dim}")
        n_train = min(n_vectors, cfg.advanced.max_train, nlist * IVF_TRAIN_PER_LIST)
        choice = IndexChoice("ivf", dim, n_vectors, nlist, cfg.storage, cfg.pq_m if cfg.storage == "pq" else 0,
                             min(cfg.nprobe, nlist), n_train)
    need = n_vectors * choice.bytes_per_vector
    if need > limit:
        raise ValueError(
            f"near-duplicate index of {n_vectors:,} vectors x {dim} dims ({choice.factory}) needs "
            f"{need / 2**30:.1f} GiB in every query worker, above the {limit / 2**30:.1f} GiB one may hold: use a learned copy detector "
            f"(near_dedup.model_id, e.g. SSCD, 512 dims) with near_dedup.index.storage: pq (IVF-PQ, pq_m bytes "
            f"per vector, rescored exactly); wfd indexes 2,096 floats per image for its pair rule and has no "
            f"compact form")
    return choice


def new_index(choice: IndexChoice, seed: int) -> faiss.Index:
    """An empty index for ``choice``; k-means and PQ training seeded with ``seed``."""
    index = faiss.index_factory(choice.dim, choice.factory, faiss.METRIC_INNER_PRODUCT)
    if choice.kind == "ivf":
        ivf = faiss.extract_index_ivf(index)
        ivf.cp.seed = seed
        ivf.nprobe = choice.nprobe
        if choice.storage == "pq":
            ivfpq = faiss.downcast_index(index)
            ivfpq.pq.cp.seed = seed
            ivfpq.do_polysemous_training = False  # Hamming filtering is unused, and it costs minutes
    return index


def train_index(index: faiss.Index, sample: np.ndarray) -> None:
    """Train an IVF index on its sample (flat indexes need none)."""
    if not index.is_trained:
        index.train(np.ascontiguousarray(sample, dtype=np.float32))


def set_threads(n: int | None) -> None:
    if n:
        faiss.omp_set_num_threads(n)


def maybe_gpu(index: faiss.Index, use_gpu: bool) -> tuple[faiss.Index, bool]:
    """The index cloned onto all GPUs when FAISS has any and ``use_gpu``; else unchanged."""
    if not use_gpu or not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        return index, False
    return faiss.index_cpu_to_all_gpus(index), True


def write_index(index: faiss.Index, f: IO[bytes]) -> None:
    """Serialise through a Python file object (so it can go through ``Store.atomic_write``)."""
    faiss.write_index(index, faiss.PyCallbackIOWriter(f.write))


def read_index(f: IO[bytes], nprobe: int = 0) -> faiss.Index:
    index = faiss.read_index(faiss.PyCallbackIOReader(f.read))
    if nprobe:
        faiss.extract_index_ivf(index).nprobe = nprobe
    return index


def _batches(n: int, size: int = SEARCH_BATCH) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def search_pairs(index: faiss.Index, ids: np.ndarray, x: np.ndarray, threshold: float,
                 mode: str, k: int, range_ok: bool = True, rule: PairScore | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directed pairs (query id, neighbour id, similarity) with similarity >= ``threshold``.

    ``mode`` is "knn" (k results per query, the query among them) or "range" (all
    results); GPU indexes have no range search, so ``range_ok=False`` turns it into knn.
    ``x`` are query forms of ``rule``; with an active rule and a CPU IVF index, each of
    their probe parts picks its own ``nprobe`` lists (:func:`search_parts_ivf`).
    """
    ids = np.asarray(ids, dtype=np.int64)
    srcs, dsts, sims = [], [], []
    # FAISS's IP range search keeps scores > radius; step one float32 below to keep >=.
    radius = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    by_parts = rule is not None and rule.active and _cpu_ivf(index) is not None
    for sl in _batches(len(ids)):
        q = np.ascontiguousarray(x[sl], dtype=np.float32)
        kk = min(k, max(index.ntotal, 1))
        if mode == "range" and range_ok:
            lims, d, nbr = (search_parts_ivf(index, q, rule.probe_parts(q), radius, kk) if by_parts
                            else index.range_search(q, radius))
            src = np.repeat(ids[sl], np.diff(lims).astype(np.int64))
        else:
            _, d, nbr = (search_parts_ivf(index, q, rule.probe_parts(q), None, kk) if by_parts
                         else (None, *index.search(q, kk)))
            src = np.repeat(ids[sl], d.shape[1])
            d, nbr = d.ravel(), nbr.ravel()
        keep = (nbr >= 0) & (nbr != src) & (d >= np.float32(threshold))
        srcs.append(src[keep])
        dsts.append(nbr[keep].astype(np.int64))
        sims.append(d[keep].astype(np.float32))
    return _concat(srcs, np.int64), _concat(dsts, np.int64), _concat(sims, np.float32)


def _cpu_ivf(index: faiss.Index) -> tuple[faiss.IndexIVF, faiss.IndexPreTransform | None, np.ndarray | None] | None:
    """The CPU IVF inside ``index`` with the transform and id map wrapped around it (None:
    not a CPU IVF, e.g. flat or a GPU clone, which keep FAISS's own whole-form probing)."""
    inner, transform, id_map = faiss.downcast_index(index), None, None
    if isinstance(inner, faiss.IndexPreTransform):
        transform, inner = inner, faiss.downcast_index(inner.index)
    if isinstance(inner, faiss.IndexIDMap | faiss.IndexIDMap2):
        id_map, inner = faiss.vector_to_array(inner.id_map), faiss.downcast_index(inner.index)
    return (inner, transform, id_map) if isinstance(inner, faiss.IndexIVF) else None


def probe_lists(ivf: faiss.IndexIVF, q: np.ndarray, parts: tuple[np.ndarray, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Lists to probe per query: each part's ``nprobe`` nearest centroids, united, each once,
    in ascending list order (-1 padded), and the whole form ``q``'s inner product with them
    (what FAISS's own search passes on: residual codes such as SQ start from it)."""
    nlist = ivf.nlist
    lists = united_lists(ivf.quantizer, parts, ivf.nprobe)
    lists = np.sort(np.where(lists < 0, nlist, lists), axis=1)  # the -1 gaps to the end, then cut
    lists = lists[:, : max(int((lists < nlist).sum(axis=1).max(initial=0)), 1)]
    valid = lists < nlist
    lists = np.where(valid, lists, -1).astype(np.int64)
    dq = np.zeros(lists.shape, dtype=np.float32)
    for col in range(lists.shape[1]):  # one column at a time: batch × d floats, not batch × width × d
        rows = np.flatnonzero(valid[:, col])
        dq[rows, col] = np.einsum("ij,ij->i", q[rows], _centroids(ivf.quantizer, lists[rows, col]))
    return np.ascontiguousarray(lists), dq


def _centroids(quantizer: faiss.Index, keys: np.ndarray) -> np.ndarray:
    """Centroid rows ``keys``: straight from a flat quantizer's storage, else reconstructed."""
    flat = faiss.downcast_index(quantizer)
    if isinstance(flat, faiss.IndexFlat):
        return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)[keys]
    return quantizer.reconstruct_batch(keys) if len(keys) else np.zeros((0, quantizer.d), np.float32)


def search_parts_ivf(index: faiss.Index, q: np.ndarray, parts: tuple[np.ndarray, ...], radius: float | None,
                     k: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """A FAISS search of a CPU IVF ``index`` with the whole query forms ``q`` over the lists
    that :func:`probe_lists` picks by ``parts``: (lims, scores, ids) of a range search when
    ``radius`` is given, else (None, scores, ids) of a k-NN search, shaped like FAISS's."""
    ivf, transform, id_map = _cpu_ivf(index)
    q, parts = _pretransform(transform, q), tuple(_pretransform(transform, p) for p in parts)
    iq, dq = probe_lists(ivf, q, parts)
    n, params = len(q), faiss.SearchParametersIVF(nprobe=iq.shape[1])
    if radius is not None:
        res = faiss.RangeSearchResult(n)
        ivf.range_search_preassigned_c(n, faiss.swig_ptr(q), radius, faiss.swig_ptr(iq), faiss.swig_ptr(dq),
                                       res, False, params)
        lims = faiss.rev_swig_ptr(res.lims, n + 1).copy()
        d = faiss.rev_swig_ptr(res.distances, int(lims[-1])).copy()
        nbr = faiss.rev_swig_ptr(res.labels, int(lims[-1])).copy()
    else:
        lims, d, nbr = None, np.empty((n, k), np.float32), np.empty((n, k), np.int64)
        ivf.search_preassigned_c(n, faiss.swig_ptr(q), k, faiss.swig_ptr(iq), faiss.swig_ptr(dq),
                                 faiss.swig_ptr(d), faiss.swig_ptr(nbr), False, params)
    if id_map is not None:
        nbr = np.where(nbr >= 0, id_map[np.maximum(nbr, 0)], -1)
    return lims, d, nbr


def _pretransform(transform: faiss.IndexPreTransform | None, x: np.ndarray) -> np.ndarray:
    """``x`` through the index's vector transforms (float32, contiguous)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    for i in range(transform.chain.size() if transform is not None else 0):
        x = np.ascontiguousarray(transform.chain.at(i).apply(x), dtype=np.float32)
    return x


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def canonical_pairs(src: np.ndarray, dst: np.ndarray, sim: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unordered pairs once each as (min id, max id), sorted, with the max similarity: either side
    may find a pair (or only one, with approximate search), and the max does not depend on which."""
    a, b = np.minimum(src, dst), np.maximum(src, dst)
    keep = a != b
    a, b, s = a[keep], b[keep], np.asarray(sim, dtype=np.float32)[keep]
    order = np.lexsort((-s, b, a))
    a, b, s = a[order], b[order], s[order]
    first = np.ones(len(a), dtype=bool)
    first[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[first], b[first], s[first]


def exhaustive_pairs(q_ids: np.ndarray, q: np.ndarray, ids: np.ndarray, x: np.ndarray,
                     threshold: float, rule: PairScore | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (query id, id, similarity) with canonical similarity >= threshold, self-pairs excluded: the
    recall reference, no FAISS involved. ``rule``: the feature model's pair rule (plain cosine when None)."""
    rule = rule or PairScore()
    q_form = rule.query_forms(q)
    srcs, dsts, sims = [], [], []
    for sl in _batches(len(ids), 16384):
        s = q_form @ rule.candidate_forms(x[sl]).T
        qi, xi = np.nonzero(s >= np.float32(threshold - EXACT_SEARCH_MARGIN - rule.search_slack))
        exact = rule.scores(q[qi], x[sl][xi])
        keep = exact >= np.float32(threshold)
        srcs.append(q_ids[qi[keep]])
        dsts.append(ids[sl][xi[keep]])
        sims.append(exact[keep])
    src, dst, sim = _concat(srcs, np.int64), _concat(dsts, np.int64), _concat(sims, np.float32)
    keep = src != dst
    return src[keep], dst[keep], sim[keep]
