"""The size of an inverted-file (IVF) index: one rule for the near-duplicate graph's and the
contamination scans' indexes."""

from __future__ import annotations

import math

IVF_TRAIN_PER_LIST = 64  # k-means training vectors per IVF list (FAISS warns below 39)


def auto_nlist(n_vectors: int, per_root: int) -> int:
    """The next power of two >= ``per_root``·√N within [16, 65536], halved while a list would
    get fewer than 39 vectors (k-means' minimum) down to 16 lists, and never more lists than vectors.

    ``per_root`` is the workload's. The graph (4) queries all N vectors through FAISS's search,
    whose cost per query, nlist centroids + nprobe·N/nlist list entries, is least at
    √(nprobe·N) = 4√N for nprobe 16. A contamination scan (1) has far fewer queries than
    vectors and searches list by list (one matrix product per probed list), so more lists buy
    no search time and cost build time (measured: bench/results/contamination-nlist.txt,
    docs/contamination.md)."""
    target = 1 << max(4, math.ceil(math.log2(max(per_root * math.sqrt(max(n_vectors, 1)), 1))))
    nlist = min(target, 65536)
    while nlist > 16 and nlist * 39 > n_vectors:
        nlist //= 2
    return max(1, min(nlist, n_vectors))
