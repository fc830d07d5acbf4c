"""Thresholds fitted to the user's own pictures: plant copies, measure, choose (the core of issue 34's
self-calibration; the CLI, the receipt record and the HTML report are not built yet).

A threshold calibrated on one corpus holds on that corpus only: SSCD int8's 0.80 / 0.88 come
from the synthetic sample, and on real photographs copies scored 0.74-0.89 while the closest
unrelated pair scored 0.813. So the corpus itself is the calibration set:

1. a seeded sample of its pictures (:func:`planted_sample`) gets every transform of
   :mod:`tasks.graph.planted` planted on ``per_transform`` of them;
2. the configured model embeds originals and copies (``embed``: the extraction stage's path,
   ``model_input`` then ``embed``), and ``score`` gives the graph's similarity matrix (the
   model's pair rule);
3. per transform, each copy's similarity to its original; the unrelated pairs are every pair of
   pictures of *different* originals (originals and copies alike): in a sample of the corpus,
   its nearest unrelated neighbours;
4. the link threshold is the closest unrelated pair plus ``margin``: zero false links on the
   sample with that margin to spare; per transform, the share of copies above it.

The result (:class:`Calibration`) carries the seed, the margin and every measured similarity,
and a digest of them, so a record of it names exactly what it was fitted on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from corpusforge.hashing import canonical_json, sha256_bytes
from tasks.graph.planted import TRANSFORMS, plant

Embed = Callable[[list[Image.Image]], np.ndarray]
Score = Callable[[np.ndarray], np.ndarray]  # rows -> their full similarity matrix


@dataclass(frozen=True)
class Calibration:
    """Thresholds and the evidence they were chosen on."""

    seed: int
    margin: float
    link_above: float  # similarity above which a pair links (zero false links on the sample, + margin)
    closest_unrelated: float
    recall: dict[str, float]  # transform -> share of its copies above link_above
    copies: dict[str, list[float]]  # transform -> each copy's similarity to its original

    def digest(self) -> str:
        return sha256_bytes(canonical_json(asdict(self)).encode())


def planted_sample(n: int, seed: int, per_transform: int) -> list[tuple[int, str, int]]:
    """(original index, transform, copy seed) for ``per_transform`` originals of ``n`` per transform."""
    rng = np.random.default_rng(seed)
    out = []
    for t, name in enumerate(sorted(TRANSFORMS)):
        for i in sorted(rng.choice(n, min(per_transform, n), replace=False).tolist()):
            out.append((int(i), name, seed * 1_000_003 + t * 10_007 + int(i)))
    return out


def measure(pictures: Sequence[Image.Image], embed: Embed, score: Score, seed: int, per_transform: int
            ) -> tuple[dict[str, list[float]], np.ndarray]:
    """Copy similarities per transform, and every unrelated pair's similarity (a flat array)."""
    plan = planted_sample(len(pictures), seed, per_transform)
    copies = [plant(pictures[i], name, copy_seed) for i, name, copy_seed in plan]
    rows = embed(list(pictures) + copies)
    sims = score(rows)
    source = np.array(list(range(len(pictures))) + [i for i, _, _ in plan])
    upper = np.triu_indices(len(source), 1)
    unrelated = sims[upper][source[upper[0]] != source[upper[1]]]
    per: dict[str, list[float]] = {name: [] for name in sorted(TRANSFORMS)}
    for k, (i, name, _) in enumerate(plan):
        per[name].append(float(sims[len(pictures) + k, i]))
    return per, unrelated


def calibrate(pictures: Sequence[Image.Image], embed: Embed, score: Score, *, seed: int = 0,
              per_transform: int = 8, margin: float = 0.02) -> Calibration:
    """Plant, embed, measure and choose the link threshold (module docstring)."""
    per, unrelated = measure(pictures, embed, score, seed, per_transform)
    closest = float(unrelated.max())
    link = min(1.0, closest + margin)
    recall = {name: float(np.mean(np.asarray(s) > link)) for name, s in per.items()}
    return Calibration(seed, margin, link, closest, recall, {k: [round(v, 6) for v in s] for k, s in per.items()})
