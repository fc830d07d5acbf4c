"""Caption-type assignment: the configured mix, exactly up to integer rounding, stable per image.

Images sorted by u = stable_uniform(seed, key) are dealt the types by quota (largest remainder
of mix × count: they sum to the count, each within one of its share), so the type boundaries
are quantiles of u. It depends only on the set of keys (not their order, shards or workers),
and as a corpus grows only images whose u lies near a boundary change type (and are captioned
again), instead of everyone's. The split plan stratifies by caption type, so every split and
release shard keeps the mix as closely as integer counts allow (:mod:`tasks.release.splits`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from corpusforge.hashing import stable_uniform


def quotas(n: int, mix: dict[str, float]) -> dict[str, int]:
    """Images per type for ``n`` images: largest remainder of n·share (ties: mix order)."""
    total = sum(mix.values())
    exact = {t: n * w / total for t, w in mix.items()}
    counts = {t: math.floor(v) for t, v in exact.items()}
    order = sorted(mix, key=lambda t: (-(exact[t] - counts[t]), list(mix).index(t)))
    for t in order[: n - sum(counts.values())]:
        counts[t] += 1
    return counts


def assign_types(keys: Iterable[str], mix: dict[str, float], seed: int) -> dict[str, str]:
    """key -> caption type for every key (see the module docstring)."""
    ordered = sorted(set(keys), key=lambda k: (stable_uniform(seed, k), k))
    return dict(zip(ordered, [t for t, count in quotas(len(ordered), mix).items() for _ in range(count)], strict=True))
