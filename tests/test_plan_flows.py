"""``corpusforge plan`` for the flows on a built corpus: the plan predicts exactly what the run then does.

Each case plans, checks that planning wrote nothing, runs the flow's work in-process
(the flow function without a Prefect run: its units run here, in order) and compares the
units the run computed with those the plan said it would recompute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from flows.build_corpus import build
from flows.cli import flow_module, main
from flows.extract_features import ExtractFeaturesConfig, extract, extract_features_flow
from flows.near_dedup import NearDedupFlowParams, near_dedup
from flows.reference_stats import ReferenceStatsFlowParams, reference_stats
from tasks.shared.features.config import ModelSpec
from tests.test_plan import small_config
from tests.test_rerun_matrix import tree_with_markers

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def built(tmp_path_factory, sample_corpus) -> Path:
    """The sample corpus built once (wfd features, float16; no graph), copied by each test."""
    out = tmp_path_factory.mktemp("plan-flows") / "built"
    build(small_config(sample_corpus, out))
    return out


@pytest.fixture()
def corpus(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "corpus")
    return tmp_path / "corpus"


def planned(flow: str, config) -> dict[str, dict[str, tuple[str, str]]]:
    """``{stage: {unit: (action, reason)}}``, checking that planning wrote nothing."""
    root = Path(config.source if flow == "near-dedup" else config.corpus)
    before = tree_with_markers(root)
    data = flow_module(flow).plan_run(config)
    assert tree_with_markers(root) == before
    return {s["stage"]: {u["unit"]: (u["action"], u["reason"]) for u in s["units"]} for s in data["stages"]}


def recomputed(stage: dict[str, tuple[str, str]]) -> set[str]:
    return {unit for unit, (action, _) in stage.items() if action == "recompute"}


def computed_shards(result: dict) -> int:
    return result["models"]["wfd"]["computed"]


def test_nothing_changed_plans_all_skips_and_the_run_computes_nothing(corpus):
    config = ExtractFeaturesConfig(corpus=str(corpus))
    plan = planned("extract-features", config)
    assert list(plan) == ["features.wfd"] and len(plan["features.wfd"]) >= 4
    assert {a for a, _ in plan["features.wfd"].values()} == {"skip"}
    result = extract(config)
    assert computed_shards(result) == 0 and result["models"]["wfd"]["skipped"] == len(plan["features.wfd"])


def test_changed_dtype_plans_every_shard_with_its_reason_and_the_run_recomputes_them(corpus):
    config = ExtractFeaturesConfig(corpus=str(corpus), features={"dtype": "float32"})
    plan = planned("extract-features", config)["features.wfd"]
    assert recomputed(plan) == set(plan)
    assert {reason for _, reason in plan.values()} == {"config features.dtype"}
    assert computed_shards(extract(config)) == len(plan)
    assert recomputed(planned("extract-features", config)["features.wfd"]) == set()


def test_deleted_features_of_one_shard_plan_that_one_and_the_run_recomputes_it(corpus):
    config = ExtractFeaturesConfig(corpus=str(corpus))
    shard = sorted(p.stem for p in (corpus / "features/wfd/vectors").glob("*.npy"))[1]
    for rel in (f"features/wfd/vectors/{shard}.npy", f"features/wfd/keys/{shard}.parquet",
                f"_markers/features/wfd/vectors/{shard}.npy.json"):
        (corpus / rel).unlink()
    plan = planned("extract-features", config)["features.wfd"]
    assert {u: plan[u] for u in recomputed(plan)} == {shard: ("recompute", "no completed output")}
    result = extract(config)
    assert computed_shards(result) == 1 and result["models"]["wfd"]["skipped"] == len(plan) - 1


def test_plan_only_returns_the_plan_and_writes_nothing(corpus):
    config = ExtractFeaturesConfig(corpus=str(corpus), features={"dtype": "float32"}, plan_only=True)
    before = tree_with_markers(corpus)
    data = extract(config)
    assert tree_with_markers(corpus) == before
    assert data["stages"][0]["counts"]["recompute"] == len(data["stages"][0]["units"]) > 0
    estimate = data["stages"][0]["estimate"]
    assert estimate["basis"] == "the last run log's seconds per feature unit computed" and estimate["images"] > 0


def test_plan_only_flow_run_shows_the_plan_as_an_artifact(corpus, prefect_server):
    config = ExtractFeaturesConfig(corpus=str(corpus), plan_only=True, dask={"n_workers": 1, "processes": False})
    before = tree_with_markers(corpus)
    assert extract_features_flow(config)["flow"] == "extract-features"
    assert tree_with_markers(corpus) == before
    artifacts = httpx.post(f"{prefect_server}/artifacts/filter", json={"artifacts": {"key": {"any_": [
        "extract-features-plan"]}}}).json()
    assert artifacts and f"Plan for extract-features on {corpus}" in artifacts[-1]["data"]


def test_reference_stats_plan_predicts_its_feature_units(corpus):
    model = ModelSpec(name="dinov2", arch="vit_small_patch14_dinov2", random_init=True, image_size=28)
    config = ReferenceStatsFlowParams(corpus=str(corpus), splits=["test"], model=model, max_partials=2)
    plan = planned("reference-stats", config)
    features = plan[f"features.{model.model_id}"]
    assert recomputed(features) == set(features) and len(features) > 0
    assert {r for _, r in features.values()} == {"no completed output"}
    assert {a for a, _ in plan["statistics"].values()} == {"recompute"}
    result = reference_stats(config)
    extraction = result["extraction"]["models"][model.model_id]
    assert (extraction["computed"], extraction["skipped"]) == (len(features), 0)
    again = planned("reference-stats", config)[f"features.{model.model_id}"]
    assert recomputed(again) == set() and set(again) == set(features)

    # features of every image with the same settings: the run reads those and removes its subset files
    extract(ExtractFeaturesConfig(corpus=str(corpus), features=config.features()))
    reused = planned("reference-stats", config)[f"features.{model.model_id}"]
    assert {reused[s] for s in features} == {("skip", "features of every image are current (reused)")}
    deleted = {u for u, (a, _) in reused.items() if a == "delete"}
    assert deleted == {f"stats/{s}" for s in features}
    subsets = corpus / f"features/{model.model_id}/subsets/stats/vectors"
    assert sorted(p.stem for p in subsets.glob("*.npy")) == sorted(features)
    extraction = reference_stats(config)["extraction"]["models"][model.model_id]
    assert (extraction["computed"], extraction["skipped"]) == (0, len(features))
    assert list(subsets.glob("*.npy")) == []


def test_near_dedup_plan_is_judged_per_stage(corpus, tmp_path):
    config = NearDedupFlowParams(source=str(corpus), out=str(tmp_path / "v2"))
    first = planned("near-dedup", config)
    assert first["graph"]["(whole stage)"] == ("recompute", "no completed graph in the new version's root")
    assert not (tmp_path / "v2").exists()
    near_dedup(config)
    assert planned("near-dedup", config) == {"graph": {"(whole stage)": ("skip", "unchanged")},
                                             "release": {"(whole stage)": ("skip", "unchanged")}}
    stricter = config.model_copy(update={"near_dedup": config.near_dedup.model_copy(
        update={"edge_min_similarity": config.near_dedup.edge_min_similarity + 0.01})})
    changed = planned("near-dedup", stricter)
    assert changed["graph"]["(whole stage)"] == ("recompute", "config near_dedup.edge_min_similarity")
    assert changed["release"]["(whole stage)"][0] == "recompute if upstream output changes"
    extract(ExtractFeaturesConfig(corpus=str(corpus), features={"dtype": "float32"}))  # new feature bytes
    action, reason = planned("near-dedup", config)["graph"]["(whole stage)"]
    assert action == "recompute" and reason.startswith("feature digest changed: ")


def test_cli_plans_a_flow_and_user_errors_are_one_line(corpus, tmp_path, capsys, cli):
    config = tmp_path / "features.yaml"
    config.write_text(json.dumps({"corpus": str(corpus)}))
    assert main(["plan", "extract-features", "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["flow"] == "extract-features" and data["stages"][0]["counts"]["skip"] > 0
    assert main(["plan", "extract-features", "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith(f"Plan for extract-features on {corpus}:")
    config.write_text(json.dumps({"corpus": str(tmp_path / "nowhere")}))
    run = subprocess.run([*cli, "plan", "extract-features", "--config", str(config)],
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("corpusforge plan: error: ")
