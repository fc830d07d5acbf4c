"""``corpusforge plan`` for the scans of a built corpus (contamination, qualify-prompts, evaluate):
the plan predicts exactly what the run then does.

Each case plans, checks that planning wrote nothing, runs the flow's function in-process and
compares the units the run computed — the markers it wrote — with those the plan said it
would recompute; a stage judged as a whole that the plan skips writes no marker at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flows.cli import flow_module, main
from tests.test_rerun_matrix import tree_with_markers

pytestmark = pytest.mark.timeout(600)


def planned(flow: str, config, *roots: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """``{stage: {unit: (action, reason)}}``, checking that planning wrote nothing under ``roots``."""
    before = [tree_with_markers(r) for r in roots]
    data = flow_module(flow).plan_run(config)
    assert [tree_with_markers(r) for r in roots] == before
    return {s["stage"]: {u["unit"]: (u["action"], u["reason"]) for u in s["units"]} for s in data["stages"]}


def actions(stage: dict[str, tuple[str, str]]) -> set[str]:
    return {a for a, _ in stage.values()}


def with_action(stage: dict[str, tuple[str, str]], action: str) -> set[str]:
    return {unit for unit, (a, _) in stage.items() if a == action}


def written_markers(root: Path, before: dict[str, tuple[int, int]]) -> set[str]:
    """Markers under ``root`` written since ``before`` (units the run computed)."""
    return {rel for rel, stamp in tree_with_markers(root).items()
            if "_markers/" in rel and rel.endswith(".json") and before.get(rel) != stamp}


# ---- contamination ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench(built_sample, sample_corpus, tmp_path_factory) -> tuple[Path, Path]:
    """The session's built corpus (only read) and an evaluation set of 10 items, 2 per chunk."""
    from tests.contamination_data import write_eval_set

    corpus = built_sample[0]
    captions = {r["key"]: r["caption"] for r in pq.read_table(sample_corpus / "metadata.parquet").to_pylist()}
    root = tmp_path_factory.mktemp("plan-scans")
    write_eval_set(root / "bench", corpus, captions, 2, 2, 4, held_out_copies=1, n_corrupt=1)
    return corpus, root / "bench"


def contamination_config(corpus: Path, bench: Path, out: Path, **eval_set):
    from flows.contamination import ContaminationConfig

    return ContaminationConfig.model_validate({
        "corpus": str(corpus), "out": str(out), "judge": {},
        "eval_set": {"source": str(bench / "bench.parquet"), "text_fields": ["question", "answer"],
                     "answer_field": "answer", "category_field": "category", "chunk_size": 4, **eval_set}})


def item_marker(chunk: str) -> str:
    return f"_markers/eval/items/{chunk}.parquet.json"


def feature_marker(chunk: str) -> str:
    return f"eval/_markers/features/wfd/vectors/{chunk}.npy.json"


def test_contamination_plan_predicts_its_units(bench, tmp_path):
    from flows.contamination import contamination

    corpus, bench_dir = bench
    out = tmp_path / "out"
    config = contamination_config(corpus, bench_dir, out)
    first = planned("contamination", config, corpus, bench_dir)
    assert not out.exists()
    chunks = set(first["eval.staging"])
    assert len(chunks) == 3 and actions(first["eval.staging"]) == {"recompute"}
    assert actions(first["eval.features.wfd"]) == {"recompute if upstream output changes"}
    for stage in ("image", "image_text", "text", "leakage", "edition"):
        assert first[stage] == {"(whole stage)": ("recompute", "no completed output")}
    contamination(config)

    # nothing changed: every unit skips, and the run writes no marker
    again = planned("contamination", config, corpus, bench_dir, out)
    assert {s: actions(units) for s, units in again.items()} == {
        "eval.staging": {"skip"}, "eval.features.wfd": {"skip"}, "image": {"skip"}, "image_text": {"skip"},
        "text": {"skip"}, "leakage": {"skip"}, "edition": {"skip"}, "report": {"recompute"}}
    before = tree_with_markers(out)
    contamination(config)
    assert written_markers(out, before) == set()

    # a config field the chunks are keyed by: every chunk restaged (its reason), features and
    # the scans after it only if their inputs change — the images are the same, so they skip
    changed = contamination_config(corpus, bench_dir, out, category_field=None)
    plan = planned("contamination", changed, out)
    assert plan["eval.staging"] == {c: ("recompute", "config eval_set.category_field; input digest changed")
                                    for c in chunks}  # the chunks' rows hold the fields read
    assert actions(plan["eval.features.wfd"]) == {"recompute if upstream output changes"}
    assert plan["edition"]["(whole stage)"][0] == "recompute if upstream output changes"
    before = tree_with_markers(out)
    contamination(changed)
    written = written_markers(out, before)
    assert {item_marker(c) for c in chunks} <= written
    assert not {feature_marker(c) for c in chunks} & written

    # one chunk's features gone: exactly that unit is embedded again
    chunk = sorted(chunks)[1]
    (out / feature_marker(chunk)).unlink()
    plan = planned("contamination", changed, out)
    assert with_action(plan["eval.features.wfd"], "recompute") == {chunk}
    assert plan["eval.features.wfd"][chunk] == ("recompute", "no completed output")
    assert actions(plan["eval.staging"]) == {"skip"} and plan["text"]["(whole stage)"] == ("skip", "unchanged")
    before = tree_with_markers(out)
    contamination(changed)
    assert written_markers(out, before) == {feature_marker(chunk)}  # the same bytes: nothing after it reruns


def test_contamination_plan_only_writes_nothing(bench, tmp_path):
    from flows.contamination import contamination

    corpus, bench_dir = bench
    config = contamination_config(corpus, bench_dir, tmp_path / "out").model_copy(update={"plan_only": True})
    data = contamination(config)
    assert data["flow"] == "contamination" and not (tmp_path / "out").exists()
    assert data["stages"][1]["estimate"]["units_if_upstream_changes"] == 3


# ---- qualify-prompts ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def prompt_inputs(tmp_path_factory) -> dict[str, Path]:
    from tests.test_prompt_qualification import write_inputs

    return write_inputs(tmp_path_factory.mktemp("plan-prompts") / "inputs")


def prompts_config(corpus: Path, inputs: dict[str, Path], out: Path, **density):
    from flows.prompt_qualification import PromptQualificationConfig

    return PromptQualificationConfig.model_validate({
        "prompts": {"path": str(inputs["prompts"])}, "out": str(out), "corpus": str(corpus),
        "density": {"mode": "direct", "sample_size": 40, "k": 3, "reference_queries": 40, **density},
        "variance": {"generated": str(inputs["generated"]), "prompts_per_unit": 5},
        "rotation": {"fraction": 0.2, "pool": str(inputs["pool"])}})


def test_qualify_prompts_plan_predicts_its_units(built_sample, prompt_inputs, tmp_path):
    from flows.prompt_qualification import qualify_prompts

    corpus, out = built_sample[0], tmp_path / "out"
    config = prompts_config(corpus, prompt_inputs, out)
    first = planned("qualify-prompts", config, corpus, prompt_inputs["prompts"].parent)
    assert not out.exists()
    assert first["density.caption_sample"] == {"caption_sample": ("recompute", "no completed output")}
    assert first["density.caption_embeddings"] == {}  # planned from the sample, drawn first
    assert set(first["density.text_embeddings"]) == {"prompts", "pool"}
    variance = set(first["variance"])
    assert len(variance) == 9 and actions(first["variance"]) == {"recompute"}  # 3 models × 3 chunks of 11
    qualify_prompts(config)

    again = planned("qualify-prompts", config, out)
    assert {s: actions(u) for s, u in again.items() if s != "decisions"} == {
        "density.caption_sample": {"skip"}, "density.caption_embeddings": {"skip"},
        "density.text_embeddings": {"skip"}, "variance": {"skip"}}
    assert len(again["density.caption_embeddings"]) > 0
    before = tree_with_markers(out)
    assert qualify_prompts(config)["work"]["variance_units"] == {"computed": 0, "skipped": 9}
    assert written_markers(out, before) == set()

    # another sample: the sample recomputes (its reason); the shards' embeddings depend on it
    changed = prompts_config(corpus, prompt_inputs, out, sample_seed=7)
    plan = planned("qualify-prompts", changed, out)
    assert plan["density.caption_sample"] == {"caption_sample": ("recompute", "config density.sample_seed")}
    assert actions(plan["density.caption_embeddings"]) == {"recompute if upstream output changes"}
    assert actions(plan["variance"]) == {"skip"} and actions(plan["density.text_embeddings"]) == {"skip"}
    before = tree_with_markers(out)
    qualify_prompts(changed)
    written = written_markers(out, before)
    assert "_markers/work/prompts/caption_sample.parquet.json" in written
    assert not {m for m in written if "/generated/" in m or "/texts/" in m}

    # one generated image replaced: exactly its unit recomputes
    image = prompt_inputs["generated"] / "gen_b" / "p07" / "00.jpg"
    data = image.read_bytes()
    try:
        image.write_bytes(data[:-2] + b"\xff\xd9")
        os.utime(image, (2_000_000_000, 2_000_000_000))
        plan = planned("qualify-prompts", changed, out)
        assert {u: plan["variance"][u] for u in with_action(plan["variance"], "recompute")} == {
            "gen_b/000001": ("recompute", "input digest changed")}
        assert actions(plan["density.caption_embeddings"]) == {"skip"}
        before = tree_with_markers(out)
        assert qualify_prompts(changed)["work"]["variance_units"] == {"computed": 1, "skipped": 8}
        assert written_markers(out, before) == {"_markers/work/prompts/generated/gen_b/000001.parquet.json"}
    finally:
        image.write_bytes(data)

    # the variance signal switched off: its units are deleted
    off = changed.model_copy(update={"variance": None})
    plan = planned("qualify-prompts", off, out)
    assert actions(plan["variance"]) == {"delete"} and len(plan["variance"]) == 9
    assert {r for _, r in plan["variance"].values()} == {"variance is switched off"}
    qualify_prompts(off)
    assert not list((out / "_markers/work/prompts/generated").rglob("*.json"))


# ---- evaluate -----------------------------------------------------------------------------

def test_evaluate_plan_predicts_its_chunks(tmp_path, capsys):
    from corpusforge.cluster import DaskConfig
    from flows.evaluate import EvaluateConfig, evaluate
    from flows.reference_stats import reference_stats
    from tasks.shared.features.config import RuntimeConfig
    from tasks.stats.reference import stats_path
    from tests.test_stats_flows import METRICS, MODEL_ID, SPEC, build_corpus, picture, ref_config, write_generated

    store = build_corpus(tmp_path / "corpus")
    reference_stats(ref_config(store, DaskConfig(n_workers=1, processes=False)))
    gen, out = tmp_path / "gen", tmp_path / "eval"
    write_generated(gen)
    config = EvaluateConfig(generated=[str(gen)], reference=store.path(stats_path("test", MODEL_ID) + ".npz"),
                            out=str(out), model=SPEC, runtime=RuntimeConfig(batch_size=8), metrics=METRICS,
                            chunk_size=3)
    stage = f"features.{MODEL_ID}"
    first = planned("evaluate", config, gen, tmp_path / "corpus")
    assert not out.exists()
    assert actions(first[stage]) == {"recompute"} and len(first[stage]) == 4  # 3 chunks of files, 1 tar
    assert first["metrics"] == {"metrics.json, report.md": ("recompute", "recomputed on every run from the "
                                                                         "features (no model)")}
    assert evaluate(config)["work"] == {"chunks_embedded": 4, "chunks_reused": 0}

    assert actions(planned("evaluate", config, gen, out)[stage]) == {"skip"}
    assert evaluate(config)["work"] == {"chunks_embedded": 0, "chunks_reused": 4}
    path = tmp_path / "evaluate.yaml"  # the command line: the same plan, as data and as text
    path.write_text(json.dumps(config.model_dump(mode="json", exclude={"dask"})))
    assert main(["plan", "evaluate", "--config", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["flow"] == "evaluate" and data["stages"][0]["counts"]["skip"] == 4
    assert main(["plan", "evaluate", "--config", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"Plan for evaluate on {gen} into {out}:")

    for name in ("g04.png", "more.tar"):  # touched, not changed: hashed, and read back
        os.utime(gen / name, (1_000_000_000, 1_000_000_000))
    touched = planned("evaluate", config, gen, out)[stage]
    assert actions(touched) == {"skip"}
    assert sum(r.startswith("unchanged (same bytes") for _, r in touched.values()) == 2
    assert evaluate(config)["work"] == {"chunks_embedded": 0, "chunks_reused": 4}

    (gen / "g04.png").write_bytes(picture(7, size=(40, 30)))
    plan = planned("evaluate", config, gen, out)[stage]
    (chunk,) = with_action(plan, "recompute")
    assert plan[chunk] == ("recompute", "input digest changed")
    before = tree_with_markers(out)
    assert evaluate(config)["work"] == {"chunks_embedded": 1, "chunks_reused": 3}
    assert written_markers(out, before) == {f"_markers/features/{MODEL_ID}/vectors/{chunk}.npy.json"}

    (gen / "more.tar").unlink()  # its chunk leaves: its features are deleted, nothing is embedded
    plan = planned("evaluate", config, gen, out)[stage]
    (gone,) = with_action(plan, "delete")
    assert plan[gone] == ("delete", "no longer among the generated images") and actions(plan) == {"skip", "delete"}
    assert evaluate(config)["work"] == {"chunks_embedded": 0, "chunks_reused": 3}
    assert not (out / f"_markers/features/{MODEL_ID}/vectors/{gone}.npy.json").exists()
