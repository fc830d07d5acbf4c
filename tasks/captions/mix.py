"""Caption-type assignment: the configured mix, exactly up to integer rounding, stable per image.

Every image the model captions gets a seeded number u = stable_uniform(seed, key).
Quotas per type are the mix times the number of images, by largest remainder (they sum
to the count; each is within one of its exact share). Images sorted by u are dealt the
types in order: the first ``quota[tag]`` are tag, the next ``quota[short]`` short, and
so on — so the type boundaries are quantiles of u.

Why this rule: it depends only on the set of keys (not their order, shards or worker
count), it meets the mix within integer rounding, and it is stable as a corpus grows —
appending rows moves the quantile boundaries by about as much as the new images' share,
so only images whose u lies near a boundary change type (and are captioned again),
instead of everyone's. The split plan stratifies by caption type, so every split and
release shard then keeps the mix as closely as integer counts allow (:mod:`tasks.release.splits`).
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
    # dealt in order: the first quota[tag] keys are tag, the next quota[short] short, … (quotas sum to the count)
    return dict(zip(ordered, [t for t, count in quotas(len(ordered), mix).items() for _ in range(count)], strict=True))
