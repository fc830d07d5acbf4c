"""Renamed and moved config keys (issue 23): an old config file loads to the same model as
its new-style twin, and each old key is named once in a one-line deprecation message."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

import corpusforge.config
from flows.build_corpus import BuildConfig
from flows.contamination import ContaminationConfig
from tasks.graph.config import IVF_TRAIN_PER_LIST, VERIFY_FIXED, NearDedupConfig

ROOT = Path(__file__).resolve().parent.parent
OLD_DEMO = ROOT / "tests" / "configs" / "demo_old_keys.yaml"

# What tests/configs/demo_old_keys.yaml sets beyond configs/demo.yaml, at the new places.
NEW_PLACES = {
    "advanced": {"chain_min_hop1_fraction": 0.4, "chain_max_hops": 4, "report_top": 10, "recall_tolerance": 0.001,
                 "merge_max_edges": 1_000_000},
    "index": {"advanced": {"pq_rescore_margin": 0.1, "max_train": 100_000}},
    "verification": {"review_min_similarity": 0.45},
}

OLD_NEAR_DEDUP_KEYS = [
    ("graph_threshold", "edge_min_similarity"), ("candidate_threshold", "component_link_above"),
    ("pair_threshold", "pair_removal_above"),
    *((k, f"advanced.{k}") for k in NEW_PLACES["advanced"]),
    *((f"index.{k}", f"index.advanced.{k}") for k in NEW_PLACES["index"]["advanced"]),
    ("verification.review_low", "verification.review_min_similarity"),
]
# Keys that became module constants, with the value now fixed.
RETIRED_NEAR_DEDUP_KEYS = [("index.train_per_list", IVF_TRAIN_PER_LIST),
                           *((f"verification.{k}", v) for k, v in VERIFY_FIXED.items())]


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """No deprecation named yet in this process; the messages captured."""
    monkeypatch.setattr(corpusforge.config, "_warned", set())
    caplog.set_level(logging.WARNING, logger="corpusforge.config")
    return caplog


def _deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is deprecated" in r.getMessage()]


def test_the_old_demo_config_loads_to_the_new_style_model(fresh_warnings):
    new_style = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    near = new_style["near_dedup"]
    for key, value in NEW_PLACES.items():
        near[key] = {**near.get(key, {}), **value}
    assert not _deprecations(fresh_warnings)
    expected = BuildConfig.model_validate({**new_style, "source": "src", "out": "out"})
    assert not _deprecations(fresh_warnings)

    old = BuildConfig.from_yaml(OLD_DEMO, source="src", out="out")
    assert old == expected
    assert old.near_dedup.verification.recorded()["review_low"] == 0.45
    assert sorted(_deprecations(fresh_warnings)) == sorted(
        [f"config: near_dedup.{a} is deprecated; use near_dedup.{b} (same meaning)" for a, b in OLD_NEAR_DEDUP_KEYS]
        + [f"config: near_dedup.{a} is deprecated; it is no longer a setting (fixed at {v!r})"
           for a, v in RETIRED_NEAR_DEDUP_KEYS])

    BuildConfig.from_yaml(OLD_DEMO, source="src", out="out")  # loaded again: nothing new to say
    assert len(_deprecations(fresh_warnings)) == len(OLD_NEAR_DEDUP_KEYS) + len(RETIRED_NEAR_DEDUP_KEYS)


def test_a_retired_key_loads_only_at_its_fixed_value(fresh_warnings):
    with pytest.raises(ValidationError, match="verification.ransac_iters is no longer a setting: it is fixed at 2000"):
        NearDedupConfig.model_validate({"verification": {"ransac_iters": 500}})
    with pytest.raises(ValidationError, match="ivf.train_per_list is no longer a setting: it is fixed at 64"):
        ContaminationConfig.model_validate({"corpus": "c", "out": "o", "image": {"ivf": {"train_per_list": 50}}})


def test_renamed_contamination_thresholds_keep_their_meaning(fresh_warnings):
    old = ContaminationConfig.model_validate({
        "corpus": "c", "out": "o", "eval_set": {"source": "e", "answer_field": "answer"},
        "image": {"threshold": 0.85, "ivf": {"train_per_list": 64}},
        "leakage": {"review_threshold": 0.7},
        "judge": {"min_similarity": 0.2}})
    new = ContaminationConfig.model_validate({
        "corpus": "c", "out": "o", "eval_set": {"source": "e", "answer_field": "answer"},
        "image": {"flag_above": 0.85},
        "leakage": {"review_min_similarity": 0.7},
        "judge": {"retrieve_above": 0.2}})
    assert old == new
    assert sorted(_deprecations(fresh_warnings)) == sorted([
        "config: image.threshold is deprecated; use image.flag_above (same meaning)",
        "config: <image|leakage>.ivf.train_per_list is deprecated; it is no longer a setting (fixed at 64)",
        "config: leakage.review_threshold is deprecated; use leakage.review_min_similarity (same meaning)",
        "config: judge.min_similarity is deprecated; use judge.retrieve_above (same meaning)"])


def test_an_old_key_beside_its_new_one_is_refused(fresh_warnings):
    with pytest.raises(ValidationError, match="both graph_threshold .deprecated. and edge_min_similarity are set"):
        NearDedupConfig.model_validate({"graph_threshold": 0.8, "edge_min_similarity": 0.8})
    with pytest.raises(ValidationError, match="both merge_max_edges"):
        NearDedupConfig.model_validate({"merge_max_edges": 10, "advanced": {"merge_max_edges": 10}})


def test_the_callers_dict_is_not_edited(fresh_warnings):
    data = {"pair_threshold": 0.97, "index": {"max_train": 5000}, "verification": {"seed": 0}}
    cfg = NearDedupConfig.model_validate(data)
    assert cfg.pair_removal_above == 0.97 and cfg.index.advanced.max_train == 5000
    assert data == {"pair_threshold": 0.97, "index": {"max_train": 5000}, "verification": {"seed": 0}}


def test_old_keys_are_not_in_the_prefect_form():
    """The UI form (JSON schema) offers only the new names; old ones load from files only."""
    props = NearDedupConfig.model_json_schema()["properties"]
    assert {"edge_min_similarity", "component_link_above", "pair_removal_above", "advanced"} <= set(props)
    assert not {"graph_threshold", "candidate_threshold", "pair_threshold", "merge_max_edges"} & set(props)
