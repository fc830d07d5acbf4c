"""CLIP image embeddings through open_clip, for semantic search and contamination checks.

The architecture is an open_clip model name (default ``ViT-L-14``). Weights are a pinned
open_clip state dict (``.safetensors``, ``.bin``, ``.pt``), verified and then handed to
``open_clip.create_model_and_transforms(arch, pretrained=<local path>)``, which reads it
with ``weights_only=True`` or safetensors. OpenAI's original checkpoints use QuickGELU:
load them with the ``-quickgelu`` architecture name (``ViT-L-14-quickgelu``); the
original TorchScript ``.pt`` archives are refused (convert them to a state dict once).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import open_clip
import torch
from torch import nn

from tasks.shared.features import preprocess as pp
from tasks.shared.features.base import TorchFeatureModel
from tasks.shared.features.config import ModelSpec, RuntimeConfig
from tasks.shared.features.weights import WeightsError, fetch_weights, sniff_format


class _ImageTower(nn.Module):
    """The image encoder alone (raw projections), so the runner treats it like any net."""

    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip = clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.clip.encode_image(x)


def _checkpoint_path(spec: ModelSpec) -> str | None:
    if spec.weights is None:
        return None
    if spec.weights.format != "state_dict":
        raise WeightsError("clip takes open_clip state dicts only; convert TorchScript checkpoints once")
    path = fetch_weights(spec.weights)
    kind = sniff_format(path)
    if kind == "torchscript":
        raise WeightsError(f"{path} is a TorchScript archive; clip takes open_clip state dicts only")
    if kind == "safetensors" and path.suffix != ".safetensors":
        raise WeightsError(f"{path} is safetensors but not named *.safetensors (open_clip picks the reader by suffix)")
    return str(path)


def load(spec: ModelSpec, runtime: RuntimeConfig, torchscript_allowlist: Sequence[str] = ()) -> TorchFeatureModel:
    arch = spec.resolved_arch
    clip, _, _ = open_clip.create_model_and_transforms(arch, pretrained=_checkpoint_path(spec),
                                                       force_image_size=spec.image_size)
    cfg = clip.visual.preprocess_cfg
    if cfg.get("resize_mode", "shortest") != "shortest" or cfg.get("interpolation", "bicubic") != "bicubic":
        raise ValueError(f"{arch}: clip_eval reproduces shortest-side bicubic resizing, model wants {cfg}")
    size = clip.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    fn = partial(pp.clip_eval, size=int(size), mean=tuple(cfg["mean"]), std=tuple(cfg["std"]))
    return TorchFeatureModel(_ImageTower(clip), spec, dim=int(clip.visual.output_dim), preprocess_fn=fn,
                             runtime=runtime)
