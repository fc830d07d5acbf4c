"""Inception-v3 pool features through torchvision: an optional reference-statistics model.

Only run when its weights are supplied (GPIC: "Inception-v3 optional when its weights are
supplied"); GPIC's default statistics model is DINOv2 ViT-L/14 (``dinov2.py``), so
statistics from this model are recorded as a protocol deviation
(``tasks/shared/provenance.py``: architecture and preprocessing differ).

The output is the 2048-d global average pool ("pool3") after ``Mixed_7c``, returned raw
(``normalized = False``) as FID-style statistics use it.

Preprocessing ``inception_299`` (``preprocess.inception_299``): the whole image, aspect
not kept, to 299x299 with Pillow bicubic on uint8, then ImageNet mean/std. Bicubic
because clean-fid's "clean" resize and this project's ``gpic_eval`` protocol both use
Pillow bicubic (pytorch-fid instead resizes bilinearly inside its network); on GPIC's
256x256 images it is the only resampling step. ``transform_input=True``, as
torchvision sets it for its published ``IMAGENET1K_V1`` weights, maps those normalised
inputs back to ``(x - 0.5) / 0.5``, the [-1, 1] range the Google-ported weights were
trained on; the same flag is used at random init so the two differ only in weights.

NOT the FID network. The standard FID Inception (pytorch-fid's ``pt_inception`` weights,
ported from TensorFlow's 2015 graph, which clean-fid also loads) has architectural
differences from torchvision's Inception3 (1008 classes, ``count_include_pad=False``
average pools in the A/C/E blocks, a max pool in the last E block, its own in-network
bilinear resize) and different weights, so features and any FD computed from this model
are not comparable with published FID numbers.

Weights: a pinned torchvision-format state dict (``inception_v3_google-0cc3c7bd.pth`` or any
``Inception3`` state dict; verified and loaded as docs/features.md says). Its auxiliary classifier
and 1000-class head, which this feature network lacks, are dropped; every other key must match.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from torch import nn
from torchvision.models import inception_v3

from tasks.shared.features import preprocess as pp
from tasks.shared.features.base import TorchFeatureModel
from tasks.shared.features.config import ModelSpec, RuntimeConfig
from tasks.shared.features.weights import load_state_dict

DEFAULT_SIZE = 299
MIN_SIZE = 75
DIM = 2048
# Parts of the published torchvision file that the feature network leaves out.
DROPPED_PREFIXES = ("AuxLogits.", "fc.")


def load(spec: ModelSpec, runtime: RuntimeConfig, torchscript_allowlist: Sequence[str] = ()) -> TorchFeatureModel:
    size = spec.image_size or DEFAULT_SIZE
    if size < MIN_SIZE:
        raise ValueError(f"{spec.model_id}: Inception-v3 needs inputs of at least {MIN_SIZE} px, got {size}")
    # torchvision Inception3 without auxiliary classifier and head: NCHW -> [N, 2048]
    net = inception_v3(weights=None, aux_logits=False, init_weights=False, transform_input=True)
    net.fc = nn.Identity()
    if spec.weights is not None:
        state = load_state_dict(spec.weights)
        net.load_state_dict({k: v for k, v in state.items() if not k.startswith(DROPPED_PREFIXES)}, strict=True)
    fn = partial(pp.inception_299, size=size)
    return TorchFeatureModel(net, spec, dim=DIM, preprocess_fn=fn, runtime=runtime, normalized=False, cnn=True)
