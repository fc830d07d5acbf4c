"""Connected components of the similarity graph by a vectorised union-find on int64 ids.

Edges arrive in chunks (one edge file at a time), so the graph never has to be in
memory at once: the state is one int64 parent per node. Roots are always linked to the
smaller root, so every tree's root is the smallest node id of its component — which is
the component id the decisions carry, with no relabelling pass.

Memory at 10^8 nodes: the parent array is 800 MB; a chunk of E edges needs ~40·E bytes
of temporaries. Each union round is O(E) numpy work; rounds repeat only while a chunk
still joins roots (few, thanks to path compression on every find).
"""

from __future__ import annotations

import numpy as np


class UnionFind:
    """Disjoint sets over node ids ``0..n-1``; root of each set = its smallest id."""

    def __init__(self, n_nodes: int):
        self.parent = np.arange(n_nodes, dtype=np.int64)

    def find(self, x: np.ndarray) -> np.ndarray:
        """Roots of ``x``, compressing the paths of ``x`` on the way."""
        x = np.asarray(x, dtype=np.int64)
        r = self.parent[x]
        while True:
            rr = self.parent[r]
            if np.array_equal(rr, r):
                break
            r = rr
        self.parent[x] = r
        return r

    def union(self, a: np.ndarray, b: np.ndarray) -> None:
        """Join the sets of each pair ``(a[i], b[i])``."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        while len(a):
            ra, rb = self.find(a), self.find(b)
            open_ = ra != rb
            if not open_.any():
                return
            ra, rb = ra[open_], rb[open_]
            a, b = a[open_], b[open_]
            # parent[x] <= x always holds, so hooking the larger root under the smaller
            # one cannot make a cycle; conflicting hooks resolve to the smallest.
            np.minimum.at(self.parent, np.maximum(ra, rb), np.minimum(ra, rb))

    def roots(self) -> np.ndarray:
        """Root (= smallest member id) of every node, fully compressed."""
        p = self.parent
        while True:
            pp = p[p]
            if np.array_equal(pp, p):
                break
            p = pp
        self.parent = p
        return p.copy()


def component_sizes(roots: np.ndarray) -> np.ndarray:
    """Size of each node's component (int32), from the per-node roots."""
    counts = np.bincount(roots, minlength=len(roots))
    return counts[roots].astype(np.int32)
