"""The one interface every feature model offers the extraction stage.

A model turns one decoded RGB image into a fixed-size float32 CHW array
(:meth:`FeatureModel.preprocess`, run on CPU threads ahead of the model) and a stacked
batch of those into feature rows (:meth:`FeatureModel.embed`). Keeping the two apart lets
the extraction stage decode and preprocess in parallel with the forward pass.

``normalized`` says what ``embed`` rows are: True (all dedup models) means unit L2 norm,
so a dot product is the cosine similarity. DINOv2 with the ``gpic_eval`` preprocessing
is the one exception: it exists for GPIC reference statistics (FD, PRDC, MMD), which use
the raw CLS features, so its ``embed`` returns them un-normalised and ``normalized`` is
False. Consumers that need unit rows check ``normalized`` (it is also in ``fingerprint``
and hence in every feature file's completion marker).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from PIL import Image

# Bump when a change in this package changes feature values for the same weights.
CODE_VERSION = "1"


class FeatureModel(ABC):
    """A loaded feature model; instances are cached per process by the registry."""

    model_id: str
    dim: int
    random_init: bool
    weights_sha256: str | None
    preprocessing: str
    normalized: bool = True

    @abstractmethod
    def preprocess(self, image: Image.Image) -> np.ndarray:
        """One RGB image -> float32 CHW array of the model's fixed input size."""

    @abstractmethod
    def embed(self, batch: np.ndarray) -> np.ndarray:
        """[B, C, H, W] float32 -> [B, dim] float32 (unit rows when ``normalized``)."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """What determines the feature values: id, arch, weights or "random-init",
        preprocessing, dim, normalized, code version. Goes into completion markers."""


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit L2 norm (all-zero rows stay zero), computed in float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, eps)
