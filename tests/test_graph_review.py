"""Which review-band pairs are verified (tasks/graph/review.py) against a direct re-implementation."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.graph.config import NearDedupConfig, VerificationConfig
from tasks.graph.review import chosen, in_band, update_top_k


def reference(pairs: list[tuple[int, int, float]], k: int) -> set[tuple[int, int]]:
    """A pair is chosen when fewer than k partners of either end score strictly higher."""
    partners: dict[int, list[float]] = {}
    for a, b, s in pairs:
        partners.setdefault(a, []).append(s)
        partners.setdefault(b, []).append(s)
    return {(a, b) for a, b, s in pairs
            if sum(x > s for x in partners[a]) < k or sum(x > s for x in partners[b]) < k}


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_choice_matches_a_direct_count_with_ties_and_any_chunking(k, seed):
    rng = np.random.default_rng(seed)
    n = 30
    a = rng.integers(0, n, 200)
    b = rng.integers(0, n, 200)
    keep = a < b
    a, b = a[keep], b[keep]
    _, first = np.unique(a * n + b, return_index=True)
    a, b = a[first], b[first]
    sim = rng.choice(np.float32([0.5, 0.6, 0.6, 0.7, 0.8, 0.85, 0.9]), len(a))  # many ties
    top = np.full((n, k), -np.inf, dtype=np.float32)
    for part in np.array_split(rng.permutation(len(a)), 5):  # edge files arrive in any order and split
        update_top_k(top, np.concatenate([a[part], b[part]]), np.concatenate([sim[part]] * 2))
    assert np.all(top[:, :-1] >= top[:, 1:])  # descending per node (-inf: fewer than k partners)
    got = {(int(x), int(y)) for x, y in zip(a[chosen(a, b, sim, top[:, -1])], b[chosen(a, b, sim, top[:, -1])],
                                             strict=True)}
    assert got == reference(list(zip(a.tolist(), b.tolist(), sim.tolist(), strict=True)), k)
    assert len(got) <= n * k + int(np.sum(sim == sim.max()))  # bounded by N * k up to exact ties


def test_adding_pairs_never_chooses_an_old_pair_anew():
    """Why a rerun with new images verifies only pairs with a new image: k-th bests only rise."""
    rng = np.random.default_rng(7)
    n, k = 40, 2
    a = rng.integers(0, n - 10, 150)
    b = a + rng.integers(1, 10, 150)
    sim = rng.uniform(0.5, 0.96, 150).astype(np.float32)
    old = slice(0, 100)
    top = np.full((n, k), -np.inf, dtype=np.float32)
    update_top_k(top, np.concatenate([a[old], b[old]]), np.concatenate([sim[old]] * 2))
    before = chosen(a[old], b[old], sim[old], top[:, -1])
    update_top_k(top, np.concatenate([a[100:], b[100:]]), np.concatenate([sim[100:]] * 2))
    after = chosen(a[old], b[old], sim[old], top[:, -1])
    assert not np.any(after & ~before)


def test_band_reaches_the_pair_threshold_inclusive():
    cfg = NearDedupConfig(verification=VerificationConfig(review_min_similarity=0.5))
    sim = np.float32([0.49, 0.5, 0.9, 0.9625, 0.963, 1.0])
    assert in_band(sim, cfg).tolist() == [False, True, True, True, False, False]
    assert cfg.link_above == cfg.pair_removal_above
    assert NearDedupConfig(model_id="sscd_disc_mixup").link_above == 0.90  # gpic_exact: GPIC's candidate graph


def _tile_ncc_reference(a: np.ndarray, b: np.ndarray, tiles: int = 4, min_std: float = 2.0) -> float:
    """Median NCC over the textured tiles of two same-size grey images aligned by the identity
    (the frame's own edge is not an interpolation border: nothing is trimmed)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    h, w = a.shape
    scores = []
    for ty in range(tiles):
        for tx in range(tiles):
            ys = slice(h * ty // tiles, h * (ty + 1) // tiles)
            xs = slice(w * tx // tiles, w * (tx + 1) // tiles)
            u, v = a[ys, xs].ravel(), b[ys, xs].ravel()
            if u.std() < min_std or v.std() < min_std:
                continue
            scores.append(float(np.corrcoef(u, v)[0, 1]))
    return float(np.median(scores)) if scores else 0.0


def test_aligned_agreement_matches_a_direct_tile_correlation():
    from tasks.graph.verify import aligned_agreement

    rng = np.random.default_rng(3)
    a = np.clip(rng.normal(128, 40, (96, 128)), 0, 255).astype(np.uint8)
    b = np.clip(0.6 * a + 50 + rng.normal(0, 8, a.shape), 0, 255).astype(np.uint8)  # contrast, brightness, noise
    b[80:] = 0  # a bar over the bottom: its tiles are flat in b and have no say
    identity = np.float64([[1, 0, 0], [0, 1, 0]])
    overlap, agreement, agreeing, _ = aligned_agreement(identity, a, b)
    assert overlap == pytest.approx(1.0)
    assert agreement == pytest.approx(_tile_ncc_reference(a, b), abs=1e-6)
    assert agreement > 0.9
    assert agreeing == pytest.approx(6 / 7)  # of 7 textured fine rows, the one the bar's edge cuts disagrees
    other = b.copy()
    other[:, 64:] = np.clip(rng.normal(128, 40, (96, 64)), 0, 255).astype(np.uint8)  # half another picture
    assert aligned_agreement(identity, a, other)[2] == pytest.approx(0.5, abs=0.1)
    shifted = np.float64([[1, 0, 64], [0, 1, 0]])  # half of a lies outside b
    assert aligned_agreement(shifted, a, b)[0] == pytest.approx(0.5)
    noise = aligned_agreement(identity, a, rng.integers(0, 255, a.shape).astype(np.uint8))
    assert abs(noise[1]) < 0.2 and noise[2] < 0.2


def test_parallax_is_the_share_of_tiles_that_agree_only_shifted():
    """A copy agrees where the transform puts each tile; a second viewpoint shifts part of the
    scene by its depth (here the right half by 3 px), and those tiles agree only shifted."""
    import cv2

    from tasks.graph.verify import aligned_agreement

    rng = np.random.default_rng(4)
    a = cv2.GaussianBlur(rng.integers(0, 255, (256, 256)).astype(np.uint8), (5, 5), 1.5)
    identity = np.float64([[1, 0, 0], [0, 1, 0]])
    assert aligned_agreement(identity, a, a)[3] == 0
    b = a.copy()
    b[:, 128:] = np.roll(a, 3, axis=1)[:, 128:]  # the right half lies 3 px further away
    assert aligned_agreement(identity, a, b)[3] == pytest.approx(0.5, abs=0.1)
