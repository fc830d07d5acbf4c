"""WFD, the weight-free descriptor: near-copy detection with no learned weights.

Used when no copy-detection weights (SSCD) are available, and as a cheap first pass.
Every invariance is built in, none is trained. Two blocks, each scaled to unit norm and
weighted ``1 - COLOUR_WEIGHT`` and ``COLOUR_WEIGHT`` of the squared norm:

**Layout (luma).** A fixed set of regions (:data:`REGIONS`: the whole frame, three
centre crops and eight overlapping 80 % crops) is each resampled to a ``thumb`` x
``thumb`` grey square. Each thumbnail's low-frequency 2-D DCT block (``K`` x ``K``)
without the DC term, weighted by ``radius ** ALPHA`` (flattens the 1/f spectrum of
photographs, so images do not agree merely by being smooth), is scaled to unit norm:
additive brightness and contrast changes vanish; JPEG, blur, small overlays and
resizing barely touch low frequencies; greyscale copies are untouched. A horizontal flip
negates exactly the odd horizontal frequencies; with ``e``/``o`` the even/odd parts,
the features ``e (x) e`` and ``o (x) o`` (upper triangles of outer products) have the
kernel <e,e'>^2 + <o,o'>^2 = (<f,f'>^2 + <f,flip f'>^2) / 2, so a mirrored copy scores
exactly like the original, and squaring pushes weak chance agreement towards 0. The
region features are summed: every region pair contributes, so a crop of up to a
quarter of each side still meets its original through the best-aligned regions.

**Colour (hue).** A 16 hue x 3 saturation histogram of a colour thumbnail, each pixel
weighted by its saturation (dark pixels less), soft-binned in hue and saturation (a
nearly grey image keeps a weak block rather than amplified chroma noise). It ignores where
colours are, so crops, flips, rotations and overlays in black, white or grey barely
move it, and it is blind to brightness scaling. It tells apart the many unrelated
images whose grey layout is alike (smooth gradients, stripes, checkerboards).

**Pair rule: colour is evidence only when both images have colour.** A greyscale copy has
no colour block, so its cosine with its own original is capped at sqrt(1 - COLOUR_WEIGHT)
= 0.866; the fingerprint names the pair rule (``pair_rule``) that tasks/shared/pair_score.py
defines and the graph scores pairs by (colourless: histogram below ``COLOURLESS_BELOW`` x
``COLOUR_FLOOR``).

Measured recall per edit, false pairs and the variants tried and not adopted (``ALPHA``, ``K``,
extra regions: each bought rotations with false pairs) are in bench/README.md (near-duplicate
detection on the sample corpus). In short: above GPIC's 0.9625 there are no false pairs, and light
edits, flips, blur, watermarks, bursts and greyscale copies clear it; heavy crops, rotations and
caption bars mostly do not, although the descriptor mostly still ranks their originals first. That
ranking is what the near-duplicate mode ``gpic_verified`` uses: each image's best band partners
are checked geometrically (tasks/graph/review.py, verify.py). On a held-out sample (seed 1) eight
unrelated pairs score above 0.90 (max 0.962), which is why, in that mode, a wfd similarity alone
links only above 0.9625.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image
from scipy.fft import dct

from tasks.shared.features.base import FeatureModel
from tasks.shared.features.config import ModelSpec

PREPROCESSING = "wfd_luma_regions_hue"
THUMB = 32
K = 8
ALPHA = 1.0
# Weighted AC energy below this (grey levels in [0, 1]) is a flat region: about one grey
# level of variation, which JPEG noise alone produces.
FLAT_FLOOR = 2e-3
# (side fraction, x anchor, y anchor); the anchor moves the crop from the left/top (0)
# to the right/bottom (1) of the room it leaves.
REGIONS: tuple[tuple[float, float, float], ...] = (
    (1.0, 0.5, 0.5), (0.87, 0.5, 0.5), (0.76, 0.5, 0.5), (0.66, 0.5, 0.5),
    (0.8, 0.0, 0.0), (0.8, 0.5, 0.0), (0.8, 1.0, 0.0), (0.8, 0.0, 0.5),
    (0.8, 1.0, 0.5), (0.8, 0.0, 1.0), (0.8, 0.5, 1.0), (0.8, 1.0, 1.0),
)
HUE_BINS = 16
SAT_BINS = 3
COLOUR_WEIGHT = 0.25
# Histogram norms below this (mean saturation-weighted mass) are not scaled up: a nearly
# grey image keeps a weak colour block instead of amplified chroma noise.
COLOUR_FLOOR = 0.05
# The pair rule (tasks/shared/pair_score.py): an image whose colour histogram holds less
# than this share of COLOUR_FLOOR counts as colourless, and its pairs score by layout alone.
COLOURLESS_BELOW = 0.5


class WeightFreeDescriptor(FeatureModel):
    """Flip-symmetrised luma layout over regions plus a hue histogram; see the module docstring."""

    random_init = False
    weights_sha256 = None
    preprocessing = PREPROCESSING
    normalized = True

    def __init__(self, thumb: int = THUMB, model_id: str = "wfd"):
        if thumb < 2 * K:
            raise ValueError(f"wfd thumbnails must be at least {2 * K} pixels, got {thumb}")
        self.model_id = model_id
        self.thumb = thumb
        self._dct = dct(np.eye(thumb), norm="ortho", axis=0)[:K]  # the first K orthonormal DCT-II basis rows
        u = np.arange(K)
        radius = np.hypot(u[:, None], u[None, :])
        weight = np.where(radius > 0, radius, 1.0) ** ALPHA
        even = (u[None, :] % 2 == 0) & (radius > 0)  # the column index is the horizontal frequency
        odd = np.broadcast_to(u[None, :] % 2 == 1, (K, K))
        self._even, self._odd = np.flatnonzero(even), np.flatnonzero(odd)
        self._even_w, self._odd_w = weight[even], weight[odd]
        self._tri_e = np.triu_indices(len(self._even))
        self._tri_o = np.triu_indices(len(self._odd))
        self.dim = len(self._tri_e[0]) + len(self._tri_o[0]) + HUE_BINS * SAT_BINS

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """float32 [len(REGIONS) + 3, thumb, thumb] in [0, 1]: one luma thumbnail per region,
        then the whole frame's RGB thumbnail for the colour block."""
        grey = image.convert("L")
        width, height = grey.size
        out = np.empty((len(REGIONS) + 3, self.thumb, self.thumb), dtype=np.float32)
        for i, (side, ax, ay) in enumerate(REGIONS):
            w, h = width * side, height * side
            x0, y0 = (width - w) * ax, (height - h) * ay
            thumb = grey.resize((self.thumb, self.thumb), Image.Resampling.BILINEAR, box=(x0, y0, x0 + w, y0 + h))
            out[i] = np.asarray(thumb, dtype=np.float32) / 255.0
        colour = image.convert("RGB").resize((self.thumb, self.thumb), Image.Resampling.BILINEAR)
        out[len(REGIONS):] = np.moveaxis(np.asarray(colour, dtype=np.float32), -1, 0) / 255.0
        return out

    def embed(self, batch: np.ndarray) -> np.ndarray:
        """[B, len(REGIONS) + 3, thumb, thumb] -> [B, dim] unit rows.

        float64 inside and no BLAS calls, so a row does not depend on the batch it is in
        or on the thread count: features are bit-identical across workers.
        """
        x = np.asarray(batch, dtype=np.float64)
        layout = _unit(self._layout(x[:, : len(REGIONS)]))
        colour = _hue_histogram(x[:, len(REGIONS):])
        norm = np.sqrt(np.einsum("bi,bi->b", colour, colour))[:, None]
        colour = colour / np.maximum(norm, COLOUR_FLOOR)
        feats = np.concatenate([np.sqrt(1.0 - COLOUR_WEIGHT) * layout, np.sqrt(COLOUR_WEIGHT) * colour], axis=1)
        return _unit(feats).astype(np.float32)

    def _layout(self, thumbs: np.ndarray) -> np.ndarray:
        """Summed flip-symmetric squared-DCT features of the region thumbnails [B, R, t, t]."""
        even, odd = self.layout_parts(thumbs)
        feats = np.concatenate([_sym_square(even, self._tri_e), _sym_square(odd, self._tri_o)], axis=-1)
        return feats.sum(axis=1)

    def layout_parts(self, thumbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each region thumbnail's ([B, R, t, t]) weighted DCT coefficients of even and of odd
        horizontal frequency, scaled to unit norm together (zero for a flat region). A region's
        layout feature is their squares, so two regions' layout features have the inner product
        <even_a, even_b>^2 + <odd_a, odd_b>^2: 63 numbers stand for 1,024 (tasks/graph/crops.py)."""
        coef = np.einsum("kn,brnm,lm->brkl", self._dct, thumbs, self._dct, optimize=False)
        coef = coef.reshape(*coef.shape[:2], K * K)
        even = coef[..., self._even] * self._even_w
        odd = coef[..., self._odd] * self._odd_w
        norm = np.sqrt(np.einsum("...i,...i->...", even, even) + np.einsum("...i,...i->...", odd, odd))
        # a flat region (no structure beyond rounding noise) contributes nothing
        scale = np.where(norm > FLAT_FLOOR, 1.0 / np.maximum(norm, FLAT_FLOOR), 0.0)[..., None]
        return even * scale, odd * scale

    def fingerprint(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "arch": "wfd", "weights": "none (weight-free)",
                "preprocessing": self.preprocessing, "thumb": self.thumb, "k": K, "alpha": ALPHA,
                "regions": [list(r) for r in REGIONS], "hue_bins": HUE_BINS, "sat_bins": SAT_BINS,
                "colour_weight": COLOUR_WEIGHT, "dim": self.dim, "normalized": True,
                "pair_rule": {"name": "layout_when_colourless", "colour_dims": HUE_BINS * SAT_BINS,
                              "colour_weight": COLOUR_WEIGHT, "colourless_below": COLOURLESS_BELOW}}


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.einsum("bi,bi->b", x, x))[:, None]
    return x / np.maximum(norms, 1e-12)


def _sym_square(v: np.ndarray, tri: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Upper triangle of v v^T with off-diagonals times sqrt(2): <sq(a), sq(b)> = <a, b>^2."""
    outer = v[..., :, None] * v[..., None, :]
    scale = np.where(tri[0] == tri[1], 1.0, np.sqrt(2.0))
    return outer[..., tri[0], tri[1]] * scale


def _hue_histogram(rgb: np.ndarray) -> np.ndarray:
    """[B, 3, h, w] RGB in [0, 1] -> [B, HUE_BINS * SAT_BINS] saturation-weighted hue mass.

    HSV as Pillow and colorsys define it; each pixel adds ``saturation * min(1, 4 value)``
    (the hue of dark pixels is noise), split bilinearly between its nearest hue bins
    (circular) and saturation bins (centres at (i + 0.5) / SAT_BINS), so a small change of
    hue, contrast or exposure moves mass smoothly instead of across a bin edge.
    """
    b = rgb.shape[0]
    r, g, bl = (rgb[:, c].reshape(b, -1) for c in range(3))
    top = np.maximum(np.maximum(r, g), bl)
    spread = top - np.minimum(np.minimum(r, g), bl)
    sat = np.where(top > 0, spread / np.where(top > 0, top, 1.0), 0.0)
    safe = np.where(spread > 0, spread, 1.0)
    hue = np.where(top == r, (g - bl) / safe, np.where(top == g, 2.0 + (bl - r) / safe, 4.0 + (r - g) / safe))
    hue = np.where(spread > 0, (hue / 6.0) % 1.0, 0.0)
    weight = sat * np.minimum(1.0, 4.0 * top) / r.shape[1]
    h_pos = hue * HUE_BINS
    h_low = np.floor(h_pos)
    h_frac = h_pos - h_low
    h_low = h_low.astype(np.int64) % HUE_BINS
    h_high = (h_low + 1) % HUE_BINS
    s_pos = np.clip(sat * SAT_BINS - 0.5, 0.0, SAT_BINS - 1.0)
    s_low = np.minimum(np.floor(s_pos), SAT_BINS - 2).astype(np.int64)
    s_frac = s_pos - s_low
    row = np.arange(b)[:, None] * (HUE_BINS * SAT_BINS)
    size = b * HUE_BINS * SAT_BINS
    hist = np.zeros(size)
    for h_bin, h_w in ((h_low, 1.0 - h_frac), (h_high, h_frac)):
        for s_bin, s_w in ((s_low, 1.0 - s_frac), (s_low + 1, s_frac)):
            hist += np.bincount((row + h_bin * SAT_BINS + s_bin).ravel(), (weight * h_w * s_w).ravel(), size)
    return hist.reshape(b, HUE_BINS * SAT_BINS)


def build(spec: ModelSpec) -> WeightFreeDescriptor:
    """The registry's constructor: ``image_size`` overrides the thumbnail side."""
    if spec.preprocessing not in (None, PREPROCESSING):
        raise ValueError(f"wfd has one preprocessing ({PREPROCESSING!r}), not {spec.preprocessing!r}")
    return WeightFreeDescriptor(thumb=spec.image_size or THUMB, model_id=spec.model_id)
