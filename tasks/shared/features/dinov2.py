"""DINOv2 CLS features through timm: GPIC's reference-statistics model and a semantic dedup model.

``timm.create_model(arch, pretrained=False, num_classes=0, img_size=224)``: with no head
and timm's default ``global_pool='token'`` for these models, the output is the final
LayerNorm's CLS token, i.e. DINOv2's ``x_norm_clstoken`` (the tests check it equals
``forward_features(x)[:, 0]``). Variants: ``vit_{small,base,large,giant}_patch14_dinov2``
and their ``_reg4_`` register versions.

Two purposes, chosen by the preprocessing:

* ``gpic_eval`` (default): GPIC's evaluation protocol for reference statistics (FD, PRDC,
  MMD), which use the raw CLS features, so ``embed`` returns them un-normalised
  (``normalized = False``);
* ``dinov2_eval``: DINOv2's own eval transform, unit rows for similarity search.

Weights: a pinned state dict with timm key names (``timm/vit_large_patch14_dinov2.lvd142m``)
or the original DINOv2 ones (``dinov2_vitl14_pretrain.pth``: ``mask_token``,
``register_tokens``, SwiGLU ``w12``/``w3``), mapped here. Position embeddings stored for
another grid (518 px -> 37 x 37) are resampled once at load time exactly as DINOv2's hub
models do on every forward pass (bicubic; scale factor (g + 0.1) / M without antialias
for the original models, output size with antialias for register models), so features
match ``torch.hub.load('facebookresearch/dinov2', ...)`` at the same input size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from functools import partial

import timm
import torch
import torch.nn.functional as F

from tasks.shared.features import preprocess as pp
from tasks.shared.features.base import TorchFeatureModel
from tasks.shared.features.config import ModelSpec, RuntimeConfig
from tasks.shared.features.weights import load_state_dict

DEFAULT_SIZE = 224


def resample_patch_pos(pos: torch.Tensor, grid: int, registers: bool) -> torch.Tensor:
    """[1, M*M, D] patch position embeddings -> [1, grid*grid, D], DINOv2 hub style."""
    _, n, dim = pos.shape
    m = math.isqrt(n)
    if m * m != n:
        raise ValueError(f"{n} patch positions are not a square grid")
    if m == grid:
        return pos
    x = pos.float().reshape(1, m, m, dim).permute(0, 3, 1, 2)
    if registers:
        x = F.interpolate(x, size=(grid, grid), mode="bicubic", antialias=True)
    else:
        scale = (grid + 0.1) / m
        x = F.interpolate(x, scale_factor=(scale, scale), mode="bicubic", antialias=False)
    if x.shape[-2:] != (grid, grid):
        raise ValueError(f"position resampling gave {tuple(x.shape[-2:])}, wanted {grid}x{grid}")
    return x.permute(0, 2, 3, 1).reshape(1, grid * grid, dim).to(pos.dtype)


def to_timm_keys(state: Mapping[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Original-DINOv2 or timm state dict -> ``model``'s keys, position grid resampled."""
    sd = dict(state)
    sd.pop("mask_token", None)
    if "register_tokens" in sd:
        # timm's register models add positions to patches only: fold the CLS position in
        sd["reg_token"] = sd.pop("register_tokens")
        sd["cls_token"] = sd["cls_token"] + sd["pos_embed"][:, :1]
        sd["pos_embed"] = sd["pos_embed"][:, 1:]
    sd = {re.sub(r"(blocks\.\d+\.mlp\.)w12\.", r"\1fc1.", re.sub(r"(blocks\.\d+\.mlp\.)w3\.", r"\1fc2.", k)): v
          for k, v in sd.items()}
    prefix = 0 if model.no_embed_class else 1
    registers = getattr(model, "reg_token", None) is not None
    grid = model.patch_embed.grid_size[0]
    pos = sd.get("pos_embed")
    if pos is None:
        raise KeyError("no pos_embed in the DINOv2 state dict")
    sd["pos_embed"] = torch.cat([pos[:, :prefix], resample_patch_pos(pos[:, prefix:], grid, registers)], dim=1)
    return sd


def load(spec: ModelSpec, runtime: RuntimeConfig, torchscript_allowlist: Sequence[str] = ()) -> TorchFeatureModel:
    arch, prep = spec.resolved_arch, spec.resolved_preprocessing
    if not re.fullmatch(r"vit_(small|base|large|giant)_patch14(_reg4)?_dinov2", arch):
        raise ValueError(f"unknown DINOv2 architecture {arch!r}")
    size = spec.image_size or DEFAULT_SIZE
    net = timm.create_model(arch, pretrained=False, num_classes=0, img_size=size)
    if spec.weights is not None:
        net.load_state_dict(to_timm_keys(load_state_dict(spec.weights), net), strict=True)
    fn = partial({"gpic_eval": pp.gpic_eval, "gpic_eval_port": pp.gpic_eval_port}.get(prep, pp.dinov2_eval),
                 size=size)
    return TorchFeatureModel(net, spec, dim=int(net.num_features), preprocess_fn=fn, runtime=runtime,
                             normalized=prep not in ("gpic_eval", "gpic_eval_port"))
