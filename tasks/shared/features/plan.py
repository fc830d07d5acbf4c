"""Feature units planned before a run (``corpusforge plan``): per model and staging shard,
judged with :func:`tasks.shared.features.extract.feature_fingerprint` (the build, whose
staging shards may not be written yet) or :func:`tasks.shared.features.extract.judge_shard`
(a corpus already staged: the very check ``extract_shard`` makes).
"""

from __future__ import annotations

from collections.abc import Iterable

from corpusforge.contract import completed_units, explain, read_marker
from corpusforge.layout import FEATURES_DIR, feature_vectors, features_dir
from corpusforge.plans import DELETE, StagePlan, deletions
from corpusforge.storage import Store
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.extract import Selection, decode_size, feature_fingerprint, judge_shard, load_models

# The config behind the positions of a feature key's config (explain names positions).
FEATURE_NAMES = {"[0]": "model", "[1]": "features.dtype", "[2]": "decode size", "[3]": "features.runtime.precision"}


def feature_stage(model_id: str) -> StagePlan:
    """The plan of one model's feature units (the run logs count them per model so)."""
    return StagePlan(f"features.{model_id}", names=FEATURE_NAMES)


def plan_units(store: Store, cfg: FeaturesConfig, images: dict[str, str] | None, keep: Iterable[str]
               ) -> list[StagePlan]:
    """The build's feature units: one stage per configured model over the staging shards
    ``images`` (shard → images digest; None: staging is recomputed first, so the shards
    completed before are judged on code and config only and units may be added), then the
    features of models no longer configured nor in ``keep``, which the run deletes."""
    models = load_models(cfg) if cfg.models else []
    draft = decode_size(models) if models else None
    plans = []
    for model in models:
        stage = feature_stage(model.model_id)
        folder = f"{features_dir(model.model_id)}/vectors"
        if images is None:
            for name in completed_units(store, folder, ".npy"):
                key = feature_fingerprint(model, cfg.dtype, draft, cfg.runtime.precision, "?")
                stage.add(name, *explain(read_marker(store, feature_vectors(model.model_id, name)), key,
                                         inputs_known=False))
            stage.open = True
        else:
            for name, digest in images.items():
                key = feature_fingerprint(model, cfg.dtype, draft, cfg.runtime.precision, digest)
                stage.add(name, *explain(read_marker(store, feature_vectors(model.model_id, name)), key))
            deletions(stage, store, folder, ".npy", images)
        plans.append(stage)
    kept = {m.model_id for m in cfg.models} | set(keep)
    dropped = StagePlan("features.removed", names=FEATURE_NAMES)
    for name in store.listdir(FEATURES_DIR):
        if name not in kept:
            for shard in completed_units(store, f"{features_dir(name)}/vectors", ".npy"):
                dropped.add(f"{name}/{shard}", DELETE, f"model {name} is no longer configured")
    return plans + ([dropped] if dropped.units else [])


def plan_shard_units(store: Store, shards: Iterable[str], cfg: FeaturesConfig, selection: Selection | None = None
                     ) -> list[StagePlan]:
    """The feature units of staged ``shards``, one stage per model, as
    :func:`tasks.shared.features.extract.extract_features` runs them (the decode size of all
    configured models, as its ``draft="auto"``)."""
    models = load_models(cfg) if cfg.models else []
    draft = decode_size(models) if models else None
    stages = {m.model_id: feature_stage(m.model_id) for m in models}
    for shard in shards:
        for model_id, verdict in judge_shard(store, shard, cfg, models, draft, selection).models.items():
            stages[model_id].add(shard, verdict.action, verdict.reason)
    return list(stages.values())
