"""How evaluation images are embedded: with the corpus's own feature settings (from its
receipt) unless given, for the one model the image scan reads, at the decode size the corpus's
features of that model were computed at (why: docs/contamination.md, "How it runs").
"""

from __future__ import annotations

from typing import Literal

from corpusforge.feature_files import feature_marker, list_feature_shards
from tasks.report.files import RECEIPT
from corpusforge.storage import Store
from tasks.shared.features.config import FeaturesConfig


def eval_features_config(given: FeaturesConfig | None, corpus: Store, model_id: str | None) -> FeaturesConfig:
    """``given``, else the corpus's feature settings (from its receipt); must include the
    image scan's model ``model_id`` (None: no image scan)."""
    if given is not None:
        fcfg = given
    elif corpus.exists(RECEIPT) and "features" in corpus.read_json(RECEIPT).get("config", {}):
        fcfg = FeaturesConfig.model_validate(corpus.read_json(RECEIPT)["config"]["features"])
    else:
        raise ValueError(f"{corpus.root} has no receipt with feature settings: give `features` explicitly")
    if model_id is not None and model_id not in {m.model_id for m in fcfg.models}:
        raise ValueError(f"image.model_id {model_id!r} is not among the evaluation feature models "
                         f"{sorted(m.model_id for m in fcfg.models)}")
    return fcfg


def scan_model_only(fcfg: FeaturesConfig, model_id: str) -> FeaturesConfig:
    """The settings for embedding evaluation images: only ``model_id``, and no share of failed
    images fails a chunk (they were never validated: each failure is that item's error)."""
    models = [m for m in fcfg.models if m.model_id == model_id]
    return fcfg.model_copy(update={"max_error_share": 1.0, "models": models})


def corpus_decode_size(corpus: Store, model_id: str) -> int | None | Literal["auto"]:
    """The decode size of the corpus's ``model_id`` features (read off one shard's marker;
    the scan compares every shard's), or "auto" when it has none (the scan then says so)."""
    shards = list_feature_shards(corpus, model_id)
    return feature_marker(corpus, model_id, shards[0]).info.get("decode_size") if shards else "auto"
