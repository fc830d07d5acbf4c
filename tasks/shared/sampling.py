"""Seeded smallest-k sampling: the evaluation caption set and the reference statistics'
Test-50K are the test records this rule picks (with the same seed and size, the same records),
and the statistics' stored subsamples are picked by it too."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from corpusforge.hashing import stable_uniform


class SmallestKeys:
    """The ``size`` distinct keys with the smallest ``(stable_uniform(seed, key), key)`` among
    those added, whatever their order and batches, in O(size) memory: candidates at or below
    the current bound are kept, and cut back to ``size`` whenever they reach twice that."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.priorities = np.empty(0, np.float64)
        self.candidates: list[str] = []
        self.bound = np.inf

    def add(self, keys: Sequence[str], priorities: np.ndarray | None = None) -> None:
        """Offer ``keys``; ``priorities``: their ``stable_uniform(seed, key)`` where the caller has them."""
        if priorities is None:
            priorities = np.fromiter((stable_uniform(self.seed, k) for k in keys), np.float64, len(keys))
        take = np.flatnonzero(priorities <= self.bound)
        self.priorities = np.concatenate([self.priorities, priorities[take]])
        self.candidates += [keys[i] for i in take]
        if len(self.candidates) >= 2 * self.size:
            self._cut()

    def _cut(self) -> None:
        ranked = sorted(set(zip(self.priorities.tolist(), self.candidates, strict=True)))[:self.size]
        self.priorities = np.array([p for p, _ in ranked], np.float64)
        self.candidates = [k for _, k in ranked]
        if ranked and len(ranked) == self.size:
            self.bound = ranked[-1][0]

    def keys(self) -> set[str]:
        self._cut()
        return set(self.candidates)

    def threshold(self) -> float:
        """The largest kept priority: a key is kept iff its priority is at most this (ties of
        distinct keys aside); -1 when nothing is kept."""
        self._cut()
        return float(self.priorities.max()) if len(self.priorities) else -1.0
