"""GPIC's two-tier near-duplicate rule (§2.3), on node-id arrays.

The candidate graph holds pairs with similarity > ``component_link_above`` (0.90).

* Tier 1 (pairs): for every pair > ``pair_removal_above`` (0.9625), the lower-resolution
  image is removed.
* Tier 2 (components): in every connected component of the candidate graph with at
  least ``min_component_size`` (5) images, only the highest-resolution image is kept.

"Better" is a total order, so every decision is deterministic: higher resolution
(width × height) wins; at equal resolution the smaller key (string compare) wins, i.e.
**equal resolution ⇒ the image with the larger key is removed**. :func:`priority_rank`
turns this order into one integer per node (0 = best).

How the tiers interact
----------------------
* Components are computed over *all* nodes, including those tier 1 removes: removal
  does not split a component (GPIC applies both rules "within this graph").
* Tier 1 is pairwise, so in a chain a > b > c (by rank) with both pairs > 0.9625, b and
  c are removed even though b itself is removed. The best node of every tier-1
  connected set is never removed, so tier 1 always keeps at least one image per set.
* A tier-1 loser points at its most similar winning partner (ties: the better
  partner). Partners are strictly better in rank, so following pointers ends at an
  image tier 1 keeps; that image is ``duplicate_of``.
* In a big component the best node beats every member, so tier 1 never removes it,
  and tier 2 keeps exactly that one image. Every other member is removed; its
  ``duplicate_of`` is the component's kept image (a tier-1 target inside a big
  component may itself fall to tier 2), and its reason is tier 1's if tier 1 already
  removed it, else the component rule's.
* Small components (< 5) lose only their tier-1 losers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KEPT, TIER1, COMPONENT, VERIFIED, VERIFIED_CROP, VERIFIED_MIRROR = 0, 1, 2, 3, 4, 5


def reason_texts(pair_threshold: float, min_component_size: int, min_inliers: int | None = None,
                 crops: bool = False, mirror: bool = False) -> dict[int, str | None]:
    """Reason strings by decision code, naming the thresholds that applied."""
    reasons = {KEPT: None, TIER1: f"tier1_pair>{pair_threshold:g}", COMPONENT: f"component>={min_component_size}"}
    if min_inliers is not None:  # mode gpic_verified (tasks/graph/verify.py)
        reasons[VERIFIED] = f"verified_pair:inliers>={min_inliers}"
        if crops:  # off-centre crop candidates (tasks/graph/crops.py)
            reasons[VERIFIED_CROP] = f"verified_crop:inliers>={min_inliers}"
        if mirror:  # a review pair verified as a mirror image (a model that is not flip-symmetric)
            reasons[VERIFIED_MIRROR] = f"verified_mirror:inliers>={min_inliers}"
    return reasons


def keys_as_bytes(keys: Sequence[str]) -> np.ndarray:
    """Keys as a fixed-width bytes array: compact, and sorts like the strings (ASCII keys)."""
    return np.array([k.encode("ascii") for k in keys], dtype="S") if len(keys) else np.zeros(0, "S1")


def priority_rank(resolution: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """0 for the best node: highest width × height first, then the smallest key."""
    order = np.lexsort((keys, -np.asarray(resolution, dtype=np.int64)))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank


class TierOnePartners:
    """Streams pairs > ``pair_threshold`` and keeps, per loser, its best winning partner."""

    def __init__(self, n_nodes: int, pair_threshold: float):
        self.pair_threshold = np.float32(pair_threshold)
        self.partner = np.full(n_nodes, -1, dtype=np.int64)
        self.partner_sim = np.full(n_nodes, -np.inf, dtype=np.float32)

    def add(self, src: np.ndarray, dst: np.ndarray, sim: np.ndarray, rank: np.ndarray) -> None:
        hit = sim > self.pair_threshold
        if not hit.any():
            return
        src, dst, sim = src[hit], dst[hit], sim[hit]
        src_loses = rank[src] > rank[dst]
        loser = np.where(src_loses, src, dst)
        winner = np.where(src_loses, dst, src)
        seen = np.unique(loser)
        seen = seen[self.partner[seen] >= 0]
        loser = np.concatenate([loser, seen])
        winner = np.concatenate([winner, self.partner[seen]])
        sim = np.concatenate([sim, self.partner_sim[seen]])
        order = np.lexsort((rank[winner], -sim, loser))
        loser, winner, sim = loser[order], winner[order], sim[order]
        first = np.ones(len(loser), dtype=bool)
        first[1:] = loser[1:] != loser[:-1]
        self.partner[loser[first]] = winner[first]
        self.partner_sim[loser[first]] = sim[first]


@dataclass
class Decisions:
    """Per-node outcome: ``code`` (KEPT/TIER1/COMPONENT) and ``duplicate_of`` (-1 if kept)."""

    code: np.ndarray          # int8
    duplicate_of: np.ndarray  # int64
    kept_of_root: np.ndarray  # int64, per node id: the kept image of a big component rooted there, else -1


def decide(roots: np.ndarray, sizes: np.ndarray, rank: np.ndarray, partner: np.ndarray,
           min_component_size: int, verified_partner: np.ndarray | None = None) -> Decisions:
    """Apply both tiers given components, ranks and tier-1 partners (see module docstring).
    ``verified_partner`` (mode gpic_verified): per node, its best winning partner among verified
    review-band pairs, or -1; such a pair acts as a tier-1 pair, and a node removed only through one
    gets the code VERIFIED."""
    n = len(roots)
    nodes = np.arange(n, dtype=np.int64)
    by_verification = np.zeros(n, dtype=bool)
    if verified_partner is not None:
        by_verification = (partner < 0) & (verified_partner >= 0)
        partner = np.where(by_verification, verified_partner, partner)
    tier1 = partner >= 0
    target = np.where(tier1, partner, nodes)
    while True:  # pointer jumping: each step moves to a strictly better-ranked node
        nxt = target[target]
        if np.array_equal(nxt, target):
            break
        target = nxt
    big = sizes >= min_component_size
    best_rank = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best_rank, roots[big], rank[big])
    is_best = big & (rank == best_rank[roots])
    if tier1[is_best].any():
        raise AssertionError("tier 1 removed the best image of a component")
    kept_of_root = np.full(n, -1, dtype=np.int64)
    kept_of_root[roots[is_best]] = nodes[is_best]
    code = np.where(tier1, np.where(by_verification, VERIFIED, TIER1), KEPT).astype(np.int8)
    dup = np.where(tier1, target, -1)
    fall = big & ~is_best
    code[fall & ~tier1] = COMPONENT
    dup[fall] = kept_of_root[roots[fall]]
    return Decisions(code, dup, kept_of_root)
