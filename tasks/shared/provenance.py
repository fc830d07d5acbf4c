"""What a set of statistics was computed with, and whether two sets may be compared.

A model's identity is its ``FeatureModel.fingerprint()`` (model id, architecture, weights
SHA-256 or "random-init", preprocessing, dimension, normalisation, model code version):
the same dict the feature stage writes into every feature file's completion marker, so
a reference built from stored features and an evaluation that runs the model itself
describe their model the same way. Metrics between features of different models or
preprocessings are meaningless: :func:`identity_mismatches` lists every difference and
the evaluation refuses to proceed unless told otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from tasks.shared.features.config import ModelSpec

# The protocol's feature model (App. B.3): DINOv2 ViT-L/14 without registers.
PROTOCOL_ARCH = "vit_large_patch14_dinov2"
# Evaluation modes and their preprocessing: "paper" follows App. B.1 (square centre crop,
# bicubic to 256, then 224); "gpic_eval_port" follows the public port of GPIC's toolkit
# (Resize((224, 224)) bicubic squash of the whole image). Metrics are the same in both.
PROTOCOL_MODES = {"paper": "gpic_eval", "gpic_eval_port": "gpic_eval_port"}

RANDOM_INIT_WARNING = ("RANDOM-INIT MODEL: features come from untrained weights; these numbers carry no "
                       "meaning and must not be compared with published values")


# ModelSpec.model_id ends in "_s{size}" exactly when the input size is overridden.
_INPUT_SIZE = re.compile(r"_s(\d+)$")
# Words for the weights a model identity records (FeatureModel.fingerprint()["weights"]).
RANDOM_INIT_LABEL = "RANDOM INIT"
WEIGHT_FREE = "none (weight-free)"
NOT_RECORDED = "not recorded"


def weights_label(identity: dict[str, Any]) -> str:
    """What a report says a model's weights were, from its identity alone: ``RANDOM INIT``,
    ``none (weight-free)`` (wfd), ``sha256 <first 16 hex>…`` for pinned weights, or
    ``not recorded`` (never a guess: an empty identity is not a weight-free model)."""
    weights = identity.get("weights")
    if identity.get("random_init") or weights == "random-init":
        return RANDOM_INIT_LABEL
    if weights == WEIGHT_FREE:
        return WEIGHT_FREE
    if isinstance(weights, str) and re.fullmatch(r"[0-9a-f]{64}", weights):
        return f"sha256 {weights[:16]}…"
    return NOT_RECORDED


def model_deviations(identity: dict[str, Any]) -> list[str]:
    """How a feature model departs from GPIC's protocol (App. B.1, B.3), in words: random
    weights, what the model itself declares (int8 quantisation), another architecture or
    preprocessing, the port's preprocessing, a resized input, normalised features."""
    out = []
    if identity.get("random_init"):
        out.append(RANDOM_INIT_WARNING)
    if identity.get("protocol_deviation"):
        out.append(str(identity["protocol_deviation"]))
    if identity.get("arch") != PROTOCOL_ARCH:
        out.append(f"feature model {identity.get('arch')} instead of DINOv2 ViT-L/14 without registers "
                   f"({PROTOCOL_ARCH})")
    modes = {prep: mode for mode, prep in PROTOCOL_MODES.items()}
    if identity.get("preprocessing") not in modes:
        out.append(f"preprocessing {identity.get('preprocessing')!r} instead of one of the protocol's "
                   f"{sorted(modes)}")
    elif modes[identity["preprocessing"]] != "paper":
        out.append(f"preprocessing {identity['preprocessing']!r} (port mode: the public port's Resize((224, 224)) "
                   "squash of the whole image) instead of the paper's centre crop (App. B.1)")
    if m := _INPUT_SIZE.search(str(identity.get("model_id", ""))):
        out.append(f"input resized to {m.group(1)}×{m.group(1)} px by an input size override (model id "
                   f"{identity.get('model_id')}), not the model's own input size")
    if identity.get("normalized"):
        out.append("L2-normalised features (the protocol uses raw CLS features)")
    return out


def identity_mismatches(reference: dict[str, Any], evaluation: dict[str, Any]) -> list[str]:
    """Every identity field on which a reference's model and an evaluation's model differ."""
    fields = sorted(set(reference) | set(evaluation))
    return [f"{f}: reference {reference.get(f)!r}, evaluation {evaluation.get(f)!r}"
            for f in fields if reference.get(f) != evaluation.get(f)]


def public_spec(spec: ModelSpec) -> dict[str, Any]:
    """The model spec as recorded in outputs: no storage options (they may hold secrets)."""
    return spec.model_dump(mode="json", exclude={"weights": {"storage_options"}})
