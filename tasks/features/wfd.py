"""WFD, the weight-free descriptor: near-copy detection with no learned weights.

Used when no copy-detection weights (SSCD) are available, and as a cheap first pass.

How it works (all of it invariant by construction, not by training):

1. Grey levels (luma) only, so a greyscale copy looks like its original.
2. A fixed set of regions of the image (the whole frame, centre crops and overlapping
   corner crops; :data:`REGIONS`) is each resampled to a ``thumb`` x ``thumb`` square:
   a resized copy gives the same thumbnails, and a copy cropped by up to a quarter
   still shares a region with its original.
3. Each thumbnail's low-frequency 2-D DCT block (``K`` x ``K``) without the DC term,
   scaled to unit norm: additive brightness and contrast changes vanish, and JPEG
   artefacts, blur, small overlays and slight rotations barely touch low frequencies.
   Coefficients are weighted by ``radius ** ALPHA`` to flatten the 1/f spectrum of
   photographs, so unrelated images do not agree merely by being natural images.
4. Flip invariance: a horizontal flip negates exactly the odd horizontal frequencies.
   With ``e``/``o`` the even/odd parts, the features ``e (x) e`` and ``o (x) o``
   (upper triangles of the outer products) give the kernel <e,e'>^2 + <o,o'>^2, which
   equals ((<f,f'>)^2 + (<f, flip f'>)^2) / 2: a flipped copy scores exactly like an
   unflipped one, and squaring pushes the weak agreement of unrelated images to ~0.
5. The region embeddings are summed (every region pair contributes, so a crop of the
   original matches through its best-aligned regions) and L2-normalised.

Measured distributions are in the docstring of :class:`WeightFreeDescriptor`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image
from scipy.fft import dct

from tasks.features.base import CODE_VERSION, FeatureModel
from tasks.features.config import ModelSpec

PREPROCESSING = "wfd_luma_regions"
THUMB = 32
K = 8
ALPHA = 0.5
# Weighted AC energy below this (grey levels in [0, 1]) is a flat region: about one grey
# level of variation, which JPEG noise alone produces.
FLAT_FLOOR = 2e-3
# (side fraction, x anchor, y anchor): the crop's centre moves from the left/top (0) to
# the right/bottom (1) edge of the room the crop leaves.
REGIONS: tuple[tuple[float, float, float], ...] = (
    (1.0, 0.5, 0.5),
    (0.8, 0.0, 0.0), (0.8, 1.0, 0.0), (0.8, 0.0, 1.0), (0.8, 1.0, 1.0), (0.8, 0.5, 0.5),
    (0.64, 0.5, 0.5),
)


def _dct_rows(n: int, k: int) -> np.ndarray:
    """The first ``k`` orthonormal DCT-II basis rows of length ``n`` (k x n)."""
    return dct(np.eye(n), norm="ortho", axis=0)[:k]


class WeightFreeDescriptor(FeatureModel):
    """Grey-level low-frequency DCT over regions, flip-symmetrised; see the module docstring."""

    random_init = False
    weights_sha256 = None
    preprocessing = PREPROCESSING
    normalized = True

    def __init__(self, thumb: int = THUMB, model_id: str = "wfd"):
        if thumb < 2 * K:
            raise ValueError(f"wfd thumbnails must be at least {2 * K} pixels, got {thumb}")
        self.model_id = model_id
        self.thumb = thumb
        self._dct = _dct_rows(thumb, K)
        u = np.arange(K)
        radius = np.hypot(u[:, None], u[None, :])
        weight = np.where(radius > 0, radius, 1.0) ** ALPHA
        not_dc = radius > 0
        even = (u[None, :] % 2 == 0) & not_dc  # horizontal frequency is the column index
        odd = np.broadcast_to(u[None, :] % 2 == 1, (K, K))
        self._even_w, self._odd_w = weight[even], weight[odd]
        self._even, self._odd = np.flatnonzero(even), np.flatnonzero(odd)
        self._tri_e = np.triu_indices(len(self._even))
        self._tri_o = np.triu_indices(len(self._odd))
        self.dim = len(self._tri_e[0]) + len(self._tri_o[0])

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """Luma thumbnails of every region: float32 [len(REGIONS), thumb, thumb] in [0, 1]."""
        grey = image.convert("L")
        width, height = grey.size
        out = np.empty((len(REGIONS), self.thumb, self.thumb), dtype=np.float32)
        for i, (side, ax, ay) in enumerate(REGIONS):
            w, h = width * side, height * side
            x0, y0 = (width - w) * ax, (height - h) * ay
            thumb = grey.resize((self.thumb, self.thumb), Image.Resampling.BILINEAR, box=(x0, y0, x0 + w, y0 + h))
            out[i] = np.asarray(thumb, dtype=np.float32) / 255.0
        return out

    def embed(self, batch: np.ndarray) -> np.ndarray:
        """[B, R, thumb, thumb] -> [B, dim] unit rows (float64 inside, no BLAS: bit-stable)."""
        x = np.asarray(batch, dtype=np.float64)
        coef = np.einsum("kn,brnm,lm->brkl", self._dct, x, self._dct, optimize=False)
        coef = coef.reshape(*coef.shape[:2], K * K)
        even = coef[..., self._even] * self._even_w
        odd = coef[..., self._odd] * self._odd_w
        norm = np.sqrt(np.einsum("...i,...i->...", even, even) + np.einsum("...i,...i->...", odd, odd))
        # a flat region (no structure beyond rounding noise) contributes nothing
        scale = np.where(norm > FLAT_FLOOR, 1.0 / np.maximum(norm, FLAT_FLOOR), 0.0)[..., None]
        even, odd = even * scale, odd * scale
        feats = np.concatenate([_sym_square(even, self._tri_e), _sym_square(odd, self._tri_o)], axis=-1)
        feats = feats.sum(axis=1)
        norms = np.sqrt(np.einsum("bi,bi->b", feats, feats))[:, None]
        return (feats / np.maximum(norms, 1e-12)).astype(np.float32)

    def fingerprint(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "arch": "wfd", "weights": "none (weight-free)",
                "preprocessing": self.preprocessing, "thumb": self.thumb, "k": K, "alpha": ALPHA,
                "regions": [list(r) for r in REGIONS], "dim": self.dim, "normalized": True,
                "code_version": CODE_VERSION}


def _sym_square(v: np.ndarray, tri: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Upper triangle of v v^T with off-diagonals times sqrt(2): <sq(a), sq(b)> = <a, b>^2."""
    outer = v[..., :, None] * v[..., None, :]
    scale = np.where(tri[0] == tri[1], 1.0, np.sqrt(2.0))
    return outer[..., tri[0], tri[1]] * scale


def build(spec: ModelSpec) -> WeightFreeDescriptor:
    """The registry's constructor: ``image_size`` overrides the thumbnail side."""
    if spec.preprocessing not in (None, PREPROCESSING):
        raise ValueError(f"wfd has one preprocessing ({PREPROCESSING!r}), not {spec.preprocessing!r}")
    return WeightFreeDescriptor(thumb=spec.image_size or THUMB, model_id=spec.model_id)
