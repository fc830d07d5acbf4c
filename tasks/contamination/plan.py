"""The contamination scan's per-unit work planned before a run (``corpusforge plan``): the
evaluation set's staging chunks and their features for the image scan's model (the GPU work),
judged by the functions the run uses. The scans after them plan their units from their own
outputs, so the flow judges them as a whole.
"""

from __future__ import annotations

from typing import Any

from corpusforge.contract import MAYBE, SKIPPED, explain, read_marker
from corpusforge.layout import FEATURES_DIR, feature_vectors, features_dir
from tasks.contamination.files import CONTAMINATION_EVAL, CONTAMINATION_ITEMS, eval_items_path
from corpusforge.plans import StagePlan, deletions, switched_off
from corpusforge.storage import Store
from tasks.contamination.config import EvalSetConfig, ImageScanConfig
from tasks.contamination.eval_features import corpus_decode_size, eval_features_config, scan_model_only
from tasks.contamination.eval_set import judge_eval_chunk, cut_eval_set
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.extract import decode_size, feature_fingerprint, judge_shard, load_models


def plan_units(out: Store, corpus: Store, eval_set: EvalSetConfig | None, image: ImageScanConfig | None,
               features: FeaturesConfig | None) -> list[StagePlan]:
    """The evaluation set's chunks, then their features when the image scan is on; without
    an evaluation set, its staged chunks are deleted."""
    if eval_set is None:
        return [switched_off(StagePlan("eval.staging"), out, (CONTAMINATION_EVAL,), "eval_set is not configured")]
    eval_store = out.sub(CONTAMINATION_EVAL)
    staging = StagePlan("eval.staging")
    staged: dict[str, dict[str, Any] | None] = {}
    for chunk in cut_eval_set(eval_set).chunks:
        action, reason, _, _ = judge_eval_chunk(out, eval_store, chunk, eval_set)
        staging.add(chunk.name, action, reason)
        staged[chunk.name] = read_marker(out, eval_items_path(chunk.name)) if action == SKIPPED else None
    deletions(staging, out, CONTAMINATION_ITEMS, ".parquet", staged, "no longer in the evaluation set")
    if image is None:
        return [staging]
    return [staging, _eval_features(eval_store, corpus, image.model_id, features, staged)]


def _eval_features(eval_store: Store, corpus: Store, model_id: str, features: FeaturesConfig | None,
                   staged: dict[str, dict[str, Any] | None]) -> StagePlan:
    """The evaluation chunks' features for the image scan's model, as the run embeds them."""
    fcfg = scan_model_only(eval_features_config(features, corpus, model_id), model_id)
    models = load_models(fcfg)
    draft = corpus_decode_size(corpus, model_id)
    draft = decode_size(models) if draft == "auto" else draft
    stage = StagePlan(f"eval.features.{model_id}")
    keep = set()
    for chunk, marker in staged.items():
        feature = read_marker(eval_store, feature_vectors(model_id, chunk))
        if marker is None:  # restaged first: embedded if it then holds images, by their digest
            keep.add(chunk)
            if feature is None:
                stage.add(chunk, MAYBE, "its chunk is staged first (embedded if it holds images)")
                stage.open = True
            else:
                key = feature_fingerprint(models[0], fcfg.dtype, draft, fcfg.runtime.precision, "?")
                stage.add(chunk, *explain(feature, key, inputs_known=False))
        elif marker.info["staged"]:
            keep.add(chunk)
            verdict = judge_shard(eval_store, chunk, fcfg, models, draft).models[model_id]
            stage.add(chunk, verdict.action, verdict.reason)
    if not keep:  # no chunk with images: the run embeds nothing, and prunes nothing
        return stage
    deletions(stage, eval_store, f"{features_dir(model_id)}/vectors", ".npy", keep,
              "its chunk has no readable images, or is no longer in the evaluation set")
    for name in eval_store.listdir(FEATURES_DIR):
        if name != model_id:
            switched_off(stage, eval_store, (features_dir(name),), f"model {name} is not the image scan's")
    return stage
