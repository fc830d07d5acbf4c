"""Model name -> loaded :class:`FeatureModel`, once per process.

Each Dask worker calls :func:`load_model` for every task; the cache (keyed by the spec,
the runtime and the allow-list) makes that one load per worker. Family modules are
imported lazily, so a run that only uses ``wfd`` never imports open_clip or timm.

A learned model without pinned weights needs ``random_init: true`` (docs/features.md, weights);
it is then built from a fixed torch seed, so every CPU worker holds identical values.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from corpusforge.hashing import canonical_json
from tasks.shared.features.config import ModelSpec, RuntimeConfig

if TYPE_CHECKING:  # torch is imported where a model is built: the flow that names models never needs it
    from tasks.shared.features.base import FeatureModel

log = logging.getLogger(__name__)

RANDOM_INIT_SEED = 0
_FAMILIES = {
    "sscd_disc_mixup": "tasks.shared.features.sscd",
    "sscd_disc_large": "tasks.shared.features.sscd",
    "sscd_onnx": "tasks.shared.features.sscd_onnx",
    "clip": "tasks.shared.features.clip",
    "dinov2": "tasks.shared.features.dinov2",
    "inception": "tasks.shared.features.inception",
}
_cache: dict[str, FeatureModel] = {}
_lock = threading.Lock()


class MissingWeightsError(ValueError):
    """A learned model configured without weights and without ``random_init``."""


def family_module(spec: ModelSpec) -> str:
    """The module that builds ``spec``'s family (named, not imported: for code versions)."""
    return "tasks.shared.features.wfd" if spec.name == "wfd" else _FAMILIES[spec.name]


def cached_models() -> list[str]:
    """Ids of the models loaded in this process (tests: which work loaded a model)."""
    with _lock:
        return sorted(m.model_id for m in _cache.values())


def build_model(spec: ModelSpec, runtime: RuntimeConfig,
                torchscript_allowlist: Sequence[str] = ()) -> FeatureModel:
    """Load a model afresh (no cache); see :func:`load_model`."""
    if spec.name == "wfd":
        from tasks.shared.features import wfd

        return wfd.build(spec)
    if spec.weights is None and not spec.random_init:
        raise MissingWeightsError(
            f"model {spec.name!r} ({spec.model_id}) has no weights: set weights (uri + sha256) to a "
            f"pinned file, or random_init: true to run the architecture untrained (tests, benchmarks)")
    if spec.weights is not None and spec.random_init:
        raise ValueError(f"model {spec.model_id}: weights and random_init are mutually exclusive")
    import torch

    from tasks.shared.features.base import resolve_device

    if resolve_device(runtime.device).type == "cpu":
        torch.set_num_threads(runtime.torch_threads or 1)  # see RuntimeConfig.torch_threads: same bits anywhere
    family = importlib.import_module(_FAMILIES[spec.name])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_INIT_SEED)
        model = family.load(spec, runtime, torchscript_allowlist)
    if model.random_init:
        log.warning("feature model %s runs with RANDOM weights: its features mean nothing", model.model_id)
    return model


def load_model(spec: ModelSpec, runtime: RuntimeConfig,
               torchscript_allowlist: Sequence[str] = ()) -> FeatureModel:
    """The model for ``spec`` on this process, loaded on first use."""
    key = canonical_json([spec.model_dump(mode="json"), runtime.model_dump(mode="json"),
                          sorted(s.lower() for s in torchscript_allowlist)])
    with _lock:
        model = _cache.get(key)
        if model is None:
            model = _cache[key] = build_model(spec, runtime, torchscript_allowlist)
    return model


def clear_cache() -> None:
    """Drop cached models (tests; freeing accelerator memory)."""
    with _lock:
        _cache.clear()
