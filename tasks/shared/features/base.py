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
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from tasks.shared.features.config import ModelSpec, RuntimeConfig

class FeatureModel(ABC):
    """A loaded feature model; instances are cached per process by the registry."""

    model_id: str
    dim: int
    random_init: bool
    weights_sha256: str | None
    preprocessing: str
    normalized: bool = True
    # False when preprocess() output sizes vary (sscd_short288): embed one image per batch.
    fixed_input: bool = True

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


_PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when available; an explicit 'cuda' without CUDA is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but CUDA is not available")
    return torch.device(device)


class TorchFeatureModel(FeatureModel):
    """A torch network behind the FeatureModel interface, run as the RuntimeConfig says.

    ``net`` maps a float32 NCHW batch to raw (un-normalised) features. This class owns
    everything about running it: device, autocast precision, channels-last, pinned host
    memory with non-blocking copies on CUDA, and ``inference_mode``. Id, architecture,
    preprocessing and weights are ``spec``'s (no weights: random init).
    """

    def __init__(self, net: torch.nn.Module, spec: ModelSpec, *, dim: int,
                 preprocess_fn: Callable[[Image.Image], np.ndarray], runtime: RuntimeConfig,
                 normalized: bool = True, cnn: bool = False, fixed_input: bool = True):
        self.model_id, self.arch, self.dim = spec.model_id, spec.resolved_arch, dim
        self.preprocessing, self._preprocess_fn = spec.resolved_preprocessing, preprocess_fn
        self.random_init = spec.weights is None
        self.weights_sha256 = spec.weights.sha256 if spec.weights else None
        self.normalized, self.fixed_input = normalized, fixed_input
        self.device = resolve_device(runtime.device)
        self.autocast_dtype = _PRECISIONS[runtime.precision]
        self.channels_last = runtime.channels_last and cnn
        net = net.eval().to(self.device)
        if self.channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.net = net

    def preprocess(self, image: Image.Image) -> np.ndarray:
        return self._preprocess_fn(image)

    def _to_device(self, batch: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
        if self.device.type == "cuda":
            x = x.pin_memory().to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def forward_raw(self, batch: np.ndarray) -> torch.Tensor:
        """Raw float32 features on the model's device."""
        x = self._to_device(batch)
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.autocast_dtype,
                                                    enabled=self.autocast_dtype is not None):
            y = self.net(x)
        return y.float()

    def embed(self, batch: np.ndarray) -> np.ndarray:
        y = self.forward_raw(batch)
        if self.normalized:
            y = torch.nn.functional.normalize(y, dim=1)
        return y.cpu().numpy()

    def fingerprint(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id, "arch": self.arch,
            "weights": self.weights_sha256 or "random-init", "random_init": self.random_init,
            "preprocessing": self.preprocessing, "dim": self.dim, "normalized": self.normalized,
        }
