"""A fixed-size, order-independent sample of feature rows, mergeable across shards.

Each key gets the priority ``stable_uniform(seed, key)``; a sample keeps the ``size``
rows of smallest priority (ties broken by key). The bottom-k of a union is the
bottom-k of the parts' bottom-ks, so shards are sampled independently and merged in
any order or tree shape with the same result: which images land in the reference
subsample depends only on the seed and the set of keys, never on sharding or workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from corpusforge.hashing import stable_uniform


@dataclass(frozen=True)
class KeyedSample:
    """Up to ``size`` rows of smallest priority, sorted by (priority, key)."""

    size: int
    keys: tuple[str, ...]
    priorities: np.ndarray  # float64 [m]
    features: np.ndarray  # float32 [m, dim]

    @classmethod
    def of(cls, keys: Sequence[str], features: np.ndarray, size: int, seed: int) -> KeyedSample:
        """Sample rows of ``features`` (one per key)."""
        if len(keys) != features.shape[0]:
            raise ValueError(f"{len(keys)} keys for {features.shape[0]} feature rows")
        priorities = np.array([stable_uniform(seed, k) for k in keys], dtype=np.float64)
        return cls._keep(size, tuple(keys), priorities, np.asarray(features, dtype=np.float32))

    @classmethod
    def _keep(cls, size: int, keys: tuple[str, ...], priorities: np.ndarray,
              features: np.ndarray) -> KeyedSample:
        order = np.lexsort((np.array(keys, dtype=object), priorities))[:size] if keys else np.zeros(0, int)
        return cls(size, tuple(keys[i] for i in order), priorities[order], features[order])

    def merge(self, other: KeyedSample) -> KeyedSample:
        if self.size != other.size:
            raise ValueError(f"cannot merge samples of size {self.size} and {other.size}")
        return self._keep(self.size, self.keys + other.keys,
                          np.concatenate([self.priorities, other.priorities]),
                          np.concatenate([self.features, other.features]))
