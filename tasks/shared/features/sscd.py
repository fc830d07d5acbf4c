"""SSCD copy-detection descriptors (Pizzi et al., CVPR 2022), the near-duplicate model.

Architecture as in facebookresearch/sscd-copy-detection ``sscd/models/model.py``: a
ResNet trunk without its classifier, GeM pooling (p = 3) over the final feature map, a
linear projection, L2 normalisation.

* ``sscd_disc_mixup``: torchvision ResNet-50 trunk, 2048 -> 512 (the recommended default).
* ``sscd_disc_large``: ResNeXt-101 32x4d trunk (Classy Vision's cardinality, built here
  with torchvision's ``ResNet(Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4)``,
  the same layer shapes), 2048 -> 1024. Published only as Classy Vision weights and
  TorchScript (torchvision's ResNeXt-101 is 32x8d).

Weight files accepted (key names mapped onto :class:`SSCDNet`, then loaded strictly):
the published ``*.torchvision.pt`` (``backbone.*`` torchvision ResNet with ``backbone.fc``
as the projection), the published ``*.classy.pt`` (``backbone.initial_block``/``blocks``
Classy Vision trunk, ``embeddings.1`` projection), this module's own state dict, or the
published ``*.torchscript.pt`` (allow-listed SHA-256 only; it normalises by itself).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import partial

import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

from tasks.shared.features import preprocess as pp
from tasks.shared.features.base import TorchFeatureModel
from tasks.shared.features.config import ModelSpec, RuntimeConfig
from tasks.shared.features.weights import load_state_dict, load_torchscript

DIMS = {"sscd_disc_mixup": 512, "sscd_disc_large": 1024}
DEFAULT_SIZES = {"sscd_square320": 320, "sscd_short288": 288}
GEM_P = 3.0


class GeM(nn.Module):
    """Generalised-mean pooling over H x W, computed in float32 (x^3 overflows fp16)."""

    def __init__(self, p: float = GEM_P, eps: float = 1e-6):
        super().__init__()
        self.p, self.eps = p, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().flatten(2).clamp(min=self.eps)
        return x.pow(self.p).mean(dim=2).pow(1.0 / self.p)


def build_trunk(arch: str) -> nn.Sequential:
    """The convolutional part of a torchvision-layout ResNet (stem + layer1..4)."""
    if arch == "resnet50":
        net = ResNet(Bottleneck, [3, 4, 6, 3])
    elif arch == "resnext101_32x4d":
        net = ResNet(Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4)
    else:
        raise ValueError(f"unknown SSCD trunk {arch!r}")
    names = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")
    return nn.Sequential(OrderedDict((n, getattr(net, n)) for n in names))


class SSCDNet(nn.Module):
    """Trunk -> GeM -> linear projection; raw (un-normalised) descriptors."""

    def __init__(self, arch: str, dim: int):
        super().__init__()
        self.trunk = build_trunk(arch)
        self.pool = GeM()
        self.proj = nn.Linear(2048, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.pool(self.trunk(x)))


_CLASSY_LAYER = {"0": "conv1", "1": "bn1", "3": "conv2", "4": "bn2", "6": "conv3"}


def _classy_key(key: str) -> str:
    """Classy Vision ResNeXt key -> torchvision layout, e.g.
    backbone.blocks.2.block2-5.convolutional_block.3.weight -> trunk.layer3.5.conv2.weight."""
    if key.startswith("embeddings.1."):
        return "proj." + key.removeprefix("embeddings.1.")
    m = re.fullmatch(r"backbone\.initial_block\._module\.([01])\.(.+)", key)
    if m:
        return f"trunk.{'conv1' if m.group(1) == '0' else 'bn1'}.{m.group(2)}"
    m = re.fullmatch(r"backbone\.blocks\.(\d+)\.block\d+-(\d+)\.(.+)", key)
    if not m:
        raise KeyError(f"unexpected Classy Vision SSCD key {key!r}")
    stage, block, rest = int(m.group(1)), m.group(2), m.group(3)
    prefix = f"trunk.layer{stage + 1}.{block}."
    m2 = re.fullmatch(r"convolutional_block\.(\d+)\.(.+)", rest)
    if m2:
        return prefix + f"{_CLASSY_LAYER[m2.group(1)]}.{m2.group(2)}"
    if rest.startswith("bn."):
        return prefix + "bn3." + rest.removeprefix("bn.")
    return prefix + rest  # downsample.{0,1}.* is named the same


def to_sscdnet_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map any accepted SSCD state-dict layout onto :class:`SSCDNet`'s key names."""
    keys = list(state)
    if any(k.startswith("trunk.") for k in keys):
        return dict(state)
    if "backbone.initial_block._module.0.weight" in state:
        return {_classy_key(k): v for k, v in state.items()}
    if "backbone.conv1.weight" in state:
        out = {}
        for k, v in state.items():
            if k.startswith("backbone.fc."):
                out["proj." + k.removeprefix("backbone.fc.")] = v
            elif k.startswith("backbone."):
                out["trunk." + k.removeprefix("backbone.")] = v
            else:
                raise KeyError(f"unexpected torchvision-format SSCD key {k!r}")
        return out
    raise KeyError(f"unrecognised SSCD state dict (first keys: {keys[:3]})")


def load(spec: ModelSpec, runtime: RuntimeConfig, torchscript_allowlist: Sequence[str] = ()) -> TorchFeatureModel:
    arch, dim, prep = spec.resolved_arch, DIMS[spec.name], spec.resolved_preprocessing
    size = spec.image_size or DEFAULT_SIZES[prep]
    if spec.weights is not None and spec.weights.format == "torchscript":
        net: nn.Module = load_torchscript(spec.weights, torchscript_allowlist)
    else:
        net = SSCDNet(arch, dim)
        if spec.weights is not None:
            net.load_state_dict(to_sscdnet_keys(load_state_dict(spec.weights)), strict=True)
    fn = partial(pp.sscd_square if prep == "sscd_square320" else pp.sscd_short, size=size)
    return TorchFeatureModel(net, spec, dim=dim, preprocess_fn=fn, runtime=runtime, cnn=True,
                             fixed_input=prep == "sscd_square320")
