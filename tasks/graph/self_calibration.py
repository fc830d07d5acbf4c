"""Thresholds fitted to the user's own pictures: plant copies, measure, choose (issue 34).

A threshold calibrated on one corpus holds on that corpus only: SSCD int8's 0.80 / 0.88 come
from the synthetic sample, and on real photographs copies scored 0.74-0.89 while the closest
unrelated pair scored 0.813. So the corpus itself is the calibration set: a seeded sample of its
pictures (:func:`planted_sample`) gets every transform of :mod:`tasks.graph.planted` planted, the
configured model embeds and scores originals and copies (:func:`model_embedder`, :func:`rule_scores`),
and the link threshold is the closest unrelated pair plus ``margin``: zero false links on the sample
with that margin to spare (:func:`chosen_thresholds` turns it into the stage's). Which pairs count as
unrelated, and why originals that score like a light re-encode count as one: docs/near-duplicates.md
("Thresholds fitted to your own pictures").

The result (:class:`Calibration`) carries the seed, the margin and every measured similarity,
and a digest of them, so a record of it names exactly what it was fitted on. The build's unit
(:mod:`tasks.graph.self_calibration_unit`) and ``corpusforge calibrate`` both call
:func:`calibrate_sample`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from corpusforge.hashing import canonical_json, sha256_bytes
from tasks.graph.components import UnionFind
from tasks.graph.planted import TRANSFORMS, plant
from tasks.shared.features.content import model_input
from tasks.shared.pair_score import PairScore

if TYPE_CHECKING:  # torch is imported by the model's module, not by the flow that plans calibration
    from tasks.shared.features.base import FeatureModel

Embed = Callable[[list[Image.Image]], np.ndarray]
Score = Callable[[np.ndarray], np.ndarray]  # rows -> their full similarity matrix

SAMPLE = 200  # originals drawn from the corpus (fewer when it is smaller)
PER_TRANSFORM = 8  # originals each transform is planted on
MARGIN = 0.02  # similarity between the closest unrelated pair and the link threshold
MAX_SIDE = 1024  # px: pictures are reduced to this longer side before planting (models see 224-512)
MIN_PICTURES = 8  # fewer pictures give no unrelated tail worth the name
LIGHT = ("jpeg_q40", "resize_50")  # the re-encodes that say how close a duplicate original scores
REVIEW_QUANTILE = 0.05  # the review band reaches this quantile of the copies (less the margin)


@dataclass(frozen=True)
class Calibration:
    """Thresholds and the evidence they were chosen on."""

    seed: int
    margin: float
    link_above: float  # similarity above which a pair links (zero false links on the sample, + margin)
    closest_unrelated: float
    recall: dict[str, float]  # transform -> share of its copies above link_above
    copies: dict[str, list[float]]  # transform -> each copy's similarity to its original
    merged_originals: int = 0  # originals counted with another (a duplicate the corpus holds)
    unrelated_top: list[float] = field(default_factory=list)  # the closest unrelated similarities, highest first

    def digest(self) -> str:
        return sha256_bytes(canonical_json(asdict(self)).encode())


@dataclass
class Measured:
    """Everything measured on one planted sample (the report shows pairs from it)."""

    planted: list[tuple[int, str, int]]  # (original index, transform, copy seed) per copy
    images: list[Image.Image]  # originals, then the copies in planted order
    sims: np.ndarray  # [n, n] similarity of every pair of images
    group: np.ndarray  # per image: its original's group (merged duplicate originals share one)
    merged: int

    @property
    def originals(self) -> int:
        return len(self.images) - len(self.planted)

    def copy_scores(self) -> dict[str, list[float]]:
        per: dict[str, list[float]] = {name: [] for name in sorted(TRANSFORMS)}
        for k, (i, name, _) in enumerate(self.planted):
            per[name].append(float(self.sims[self.originals + k, i]))
        return per

    def unrelated(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, b, similarity) of every pair of images of different groups, a < b."""
        a, b = np.triu_indices(len(self.images), 1)
        keep = self.group[a] != self.group[b]
        return a[keep], b[keep], self.sims[a[keep], b[keep]]


def planted_sample(n: int, seed: int, per_transform: int) -> list[tuple[int, str, int]]:
    """(original index, transform, copy seed) for ``per_transform`` originals of ``n`` per transform."""
    rng = np.random.default_rng(seed)  # one draw per transform, in name order
    return [(int(i), name, seed * 1_000_003 + t * 10_007 + int(i)) for t, name in enumerate(sorted(TRANSFORMS))
            for i in sorted(rng.choice(n, min(per_transform, n), replace=False).tolist())]


def _groups(sims: np.ndarray, n: int, planted: list[tuple[int, str, int]], duplicate_above: float | None
            ) -> tuple[np.ndarray, int]:
    """Group of every original, and how many merged: two originals at least as close as the median
    light re-encode, or above ``duplicate_above``, are a duplicate the corpus holds, not unrelated."""
    light = [float(sims[n + k, i]) for k, (i, name, _) in enumerate(planted) if name in LIGHT]
    bars = ([float(np.median(light))] if light else []) + ([float(np.nextafter(duplicate_above, 2))]
                                                           if duplicate_above is not None else [])
    merged = UnionFind(n)  # each group's root is its smallest original
    if bars:
        bar = min(bars)  # at least as close as a light re-encode, or above the configured pair rule
        merged.union(*np.nonzero(np.triu(sims[:n, :n] >= bar, 1)))
    roots = merged.roots()
    return roots, int(n - len(np.unique(roots)))


def measure_sample(pictures: Sequence[Image.Image], embed: Embed, score: Score, seed: int,
                   per_transform: int, duplicate_above: float | None = None) -> Measured:
    """Plant, embed and score one sample."""
    planted = planted_sample(len(pictures), seed, per_transform)
    copies = [plant(pictures[i], name, copy_seed) for i, name, copy_seed in planted]
    images = [p.convert("RGB") for p in pictures] + copies
    sims = score(embed(images))
    roots, merged = _groups(sims, len(pictures), planted, duplicate_above)
    group = np.concatenate([roots, roots[[i for i, _, _ in planted]]]) if planted else roots
    return Measured(planted, images, sims, group, merged)


def choose(m: Measured, seed: int, margin: float) -> Calibration:
    """The link threshold at zero false links on the sample, plus ``margin``."""
    per = m.copy_scores()
    unrelated = np.sort(m.unrelated()[2])[::-1]
    closest = float(unrelated[0]) if unrelated.size else -1.0
    link = min(1.0, math.ceil((closest + margin) * 1e4) / 1e4)
    recall = {name: float(np.mean(np.asarray(s) > link)) if s else 0.0 for name, s in per.items()}
    return Calibration(seed, margin, link, round(closest, 6), recall,
                       {k: [round(v, 6) for v in s] for k, s in per.items()}, m.merged,
                       [round(float(v), 6) for v in unrelated[:20]])


def calibrate_sample(pictures: Sequence[Image.Image], model: FeatureModel, *, seed: int,
                     duplicate_above: float | None = None, per_transform: int = PER_TRANSFORM,
                     margin: float = MARGIN) -> tuple[Calibration, Measured]:
    """Plant, embed with ``model``, score by its pair rule, measure and choose the link threshold;
    the measurements too (for the report)."""
    if len(pictures) < MIN_PICTURES:
        raise ValueError(f"self-calibration needs at least {MIN_PICTURES} decodable pictures, found {len(pictures)}")
    m = measure_sample(pictures, model_embedder(model), rule_scores(PairScore.from_model(model.fingerprint())),
                       seed, per_transform, duplicate_above)
    return choose(m, seed, margin), m


def model_embedder(model: FeatureModel, batch: int = 32) -> Embed:
    """The extraction stage's path for copy detection: ``model_input`` (frame cut), then ``embed``."""
    def embed(images: list[Image.Image]) -> np.ndarray:
        step = batch if model.fixed_input else 1
        rows = [model.embed(np.stack([model_input(model, im) for im in images[i:i + step]]))
                for i in range(0, len(images), step)]
        return np.concatenate(rows).astype(np.float32)
    return embed


def rule_scores(rule: PairScore) -> Score:
    """The full similarity matrix under the model's pair rule (float64, as the graph rescores)."""
    def score(rows: np.ndarray) -> np.ndarray:
        x = rows.astype(np.float64)
        if not rule.active:
            return x @ x.T
        layout = rule.unit_layout(rows).astype(np.float64)
        grey = rule.colourless(rows)
        return np.where(grey[:, None] | grey[None, :], layout @ layout.T, x @ x.T)
    return score


def reduced(image: Image.Image) -> Image.Image:
    """RGB, longer side at most :data:`MAX_SIDE` (a copy; the original is untouched)."""
    out = image.convert("RGB")
    out.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.BICUBIC)
    return out


def chosen_thresholds(cal: Calibration, *, verifying: bool, edge: float, review: float) -> dict[str, Any]:
    """The stage's thresholds from a calibration, or ``{"fitted": False, "reason"}``.

    ``verifying`` (wfd's gpic_verified): a pair above ``pair_removal_above`` removes on its own,
    below it only verified pairs link: the calibrated link is ``pair_removal_above``, and
    ``component_link_above`` is the closest unrelated pair (it links nothing without verification).
    Otherwise (GPIC's rule): the calibrated link is ``component_link_above`` and
    ``pair_removal_above`` is ``margin`` above it. ``edge_min_similarity`` never rises above the
    component link (the configured value ``edge`` when lower). The review band's floor is the
    copies' :data:`REVIEW_QUANTILE` less the margin, never below the configured ``review`` (which
    bounds the search's cost) and never above the component link.
    """
    if verifying:
        pair, component = cal.link_above, round(cal.closest_unrelated, 4)
    else:
        component, pair = cal.link_above, round(cal.link_above + cal.margin, 4)
    if pair >= 1.0 or component >= pair:
        return {"fitted": False, "reason": f"the closest unrelated pair scores {cal.closest_unrelated:.4f}: no "
                                           f"threshold below 1 keeps zero false links with margin {cal.margin}"}
    scores = [s for v in cal.copies.values() for s in v]
    band = math.floor((float(np.quantile(scores, REVIEW_QUANTILE)) - cal.margin) * 1e4) / 1e4 if scores else review
    return {"fitted": True, "edge_min_similarity": min(edge, component), "component_link_above": component,
            "pair_removal_above": pair, "review_min_similarity": min(component, max(review, band))}
