"""Chaining guard: which big components hold together only through long chains.

GPIC's component rule keeps one image of every component with >= 5 images, but a
component of the > 0.90 graph can be a chain a–b–c–…: each link is similar, the ends
need not be (pairs at 0.90–0.95 are often distinct images, Fig. 5). For every big
component we measure, from the image the rule keeps:

* ``hop1_fraction`` — share of members that are the kept image or its direct
  neighbours (removed as near-copies *of it*, not of something similar to it);
* ``eccentricity`` — most hops from the kept image to any member (diameter / 2 <=
  eccentricity <= diameter, and one BFS per component instead of all pairs);
* ``weakest_edge`` — the lowest similarity among the component's candidate edges.

A component is flagged when ``hop1_fraction < chain_min_hop1_fraction`` (default 0.5)
or ``eccentricity > chain_max_hops`` (default 3). Flags are reported, not acted on:
they are where a reviewer should look before trusting the component rule.

All components are searched at once: one multi-source BFS from every kept image over
a CSR matrix of the big components' edges (relabelled to compact ids), so the cost is
O(edges + hops) numpy work regardless of the number of components.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass
class ComponentMetrics:
    """One entry per big component, sorted by size (desc) then component id."""

    component_id: np.ndarray   # int64: smallest node id
    size: np.ndarray           # int64
    kept: np.ndarray           # int64: node the rule keeps
    weakest_edge: np.ndarray   # float32
    hop1_fraction: np.ndarray  # float64
    eccentricity: np.ndarray   # int64
    flagged: np.ndarray        # bool


def component_metrics(roots: np.ndarray, sizes: np.ndarray, kept_of_root: np.ndarray,
                      src: np.ndarray, dst: np.ndarray, sim: np.ndarray, min_size: int,
                      min_hop1_fraction: float, max_hops: int) -> ComponentMetrics:
    """Metrics of every component with >= ``min_size`` members. ``src, dst, sim``: the candidate edges
    inside those components (others are ignored); ``kept_of_root[root]``: each big component's kept node."""
    big_roots = np.flatnonzero((roots == np.arange(len(roots))) & (sizes >= min_size))
    inside = sizes[src] >= min_size
    src, dst, sim = src[inside], dst[inside], sim[inside]
    nodes = np.flatnonzero(sizes[roots] >= min_size) if len(big_roots) else np.zeros(0, np.int64)
    local = np.searchsorted(nodes, np.concatenate([src, dst]))
    m = len(nodes)
    graph = sp.csr_matrix((np.ones(len(local), dtype=np.int8), (local, np.roll(local, len(src)))),
                          shape=(m, m))
    hops = np.full(m, -1, dtype=np.int64)
    frontier = np.searchsorted(nodes, kept_of_root[big_roots])
    hops[frontier] = 0
    level = 0
    while len(frontier):
        level += 1
        nbrs = graph[frontier].indices
        nbrs = np.unique(nbrs[hops[nbrs] < 0])
        hops[nbrs] = level
        frontier = nbrs
    comp = np.searchsorted(big_roots, roots[nodes])
    n_big = len(big_roots)
    near = np.bincount(comp, weights=(hops <= 1), minlength=n_big)
    ecc = np.zeros(n_big, dtype=np.int64)
    np.maximum.at(ecc, comp, hops)
    weakest = np.full(n_big, np.inf, dtype=np.float32)
    np.minimum.at(weakest, np.searchsorted(big_roots, roots[src]), sim)
    size = sizes[big_roots].astype(np.int64)
    hop1 = near / np.maximum(size, 1)
    flagged = (hop1 < min_hop1_fraction) | (ecc > max_hops)
    order = np.lexsort((big_roots, -size))
    return ComponentMetrics(big_roots[order], size[order], kept_of_root[big_roots][order], weakest[order],
                            hop1[order], ecc[order], flagged[order])


def components_report(metrics: ComponentMetrics, key_of: dict[int, str], top: int,
                      limits: dict) -> dict:
    """JSON-able report: the largest components and the flagged ones (each list <= ``top``)."""
    def entry(i: int) -> dict:
        return {"component_id": int(metrics.component_id[i]), "size": int(metrics.size[i]),
                "kept_key": key_of.get(int(metrics.kept[i])),
                "weakest_edge": round(float(metrics.weakest_edge[i]), 6),
                "hop1_fraction": round(float(metrics.hop1_fraction[i]), 6),
                "eccentricity": int(metrics.eccentricity[i]), "flagged": bool(metrics.flagged[i])}

    flagged = np.flatnonzero(metrics.flagged)
    return {
        "limits": limits,
        "big_components": int(len(metrics.size)),
        "images_in_big_components": int(metrics.size.sum()),
        "flagged_components": int(len(flagged)),
        "images_in_flagged_components": int(metrics.size[flagged].sum()),
        "largest": [entry(i) for i in range(min(top, len(metrics.size)))],
        "flagged": [entry(int(i)) for i in flagged[:top]],
    }
