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

from typing import Any

from tasks.features.config import ModelSpec
from tasks.stats.config import PROTOCOL_ARCH, PROTOCOL_MODES, protocol_model

RANDOM_INIT_WARNING = ("RANDOM-INIT MODEL: features come from untrained weights; these numbers carry no "
                       "meaning and must not be compared with published values")


def model_deviations(identity: dict[str, Any]) -> list[str]:
    """How a feature model departs from GPIC's protocol (App. B.1, B.3), in words."""
    out = []
    if identity.get("random_init"):
        out.append(RANDOM_INIT_WARNING)
    if identity.get("arch") != PROTOCOL_ARCH:
        out.append(f"feature model {identity.get('arch')} instead of DINOv2 ViT-L/14 without registers "
                   f"({PROTOCOL_ARCH})")
    modes = {prep: mode for mode, prep in PROTOCOL_MODES.items()}
    if identity.get("preprocessing") not in modes:
        out.append(f"preprocessing {identity.get('preprocessing')!r} instead of one of the protocol's "
                   f"{sorted(modes)}")
    expected_id = protocol_model(modes.get(identity.get("preprocessing"), "paper")).model_id
    if not out and identity.get("model_id") != expected_id:
        out.append(f"model id {identity.get('model_id')} instead of {expected_id} (input size override)")
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
