"""An evaluation's units planned before a run (``corpusforge plan``): every chunk of generated
images, read back or embedded (:func:`tasks.stats.evaluate.judge_generated_chunk`, the check its
unit makes: read back when the listing is the one embedded, else the files are hashed and
re-embedded only when their bytes changed), then the metrics, recomputed on every run from the
features (no model).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corpusforge.contract import COMPUTED
from corpusforge.layout import FEATURES_DIR, features_dir
from corpusforge.plans import StagePlan, deletions, switched_off
from corpusforge.storage import Store
from tasks.shared.features.config import ModelSpec
from tasks.shared.features.plan import feature_stage
from tasks.stats.evaluate import GeneratedChunk, judge_generated_chunk


def plan_units(out: Store, features: Store | None, chunks: Iterable[GeneratedChunk], spec: ModelSpec,
               precision: str, storage_options: dict[str, Any]) -> list[StagePlan]:
    """An evaluation's chunks of generated images, then the metrics (every run). ``features``:
    a shared feature store the chunks are embedded into, which is never pruned (None: ``out``,
    which is pruned to this run's chunks)."""
    model_id = spec.model_id
    pruned, features = features is None, out if features is None else features
    stage = feature_stage(model_id)
    names: list[str] = []
    for chunk in chunks:  # judged as they come: only their names are kept
        verdict = judge_generated_chunk(features, chunk, spec, precision, storage_options, hash_new=False)
        stage.add(chunk.name, verdict.action, verdict.reason)
        names.append(chunk.name)
    if pruned:
        deletions(stage, out, f"{features_dir(model_id)}/vectors", ".npy", names,
                  "no longer among the generated images")
        for name in out.listdir(FEATURES_DIR):
            if name != model_id:
                switched_off(stage, out, (features_dir(name),), f"model {name} is not the evaluation's")
    metrics = StagePlan("metrics")
    metrics.add("metrics.json, report.md", COMPUTED, "recomputed on every run from the features (no model)")
    return [stage, metrics]
