"""Prompt qualification (seed 000): each signal on synthetic data with a known answer and
against a straightforward numpy re-implementation; anchors never rotate; the rotation
size follows the fraction; the receipt changes with any input byte or threshold and not
otherwise; input files are never modified; the CLI end to end on a tiny built corpus."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tasks.prompts import cohorts, density, rotation, variance
from tasks.prompts.config import CohortConfig, RotationConfig
from tests.contamination_data import noise_png


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# ---- signal 1 ---------------------------------------------------------------------------

def test_direct_density_equals_numpy_and_flags_the_planted_dense_region():
    rng = np.random.default_rng(0)
    dim = 32
    centre = _unit(rng.normal(size=(1, dim)))
    dense = _unit(centre + 0.05 * rng.normal(size=(80, dim)))         # a planted dense region (8 %)
    spread = _unit(rng.normal(size=(920, dim)))
    corpus = np.concatenate([dense, spread])
    prompts = np.concatenate([_unit(centre + 0.05 * rng.normal(size=(5, dim))), _unit(rng.normal(size=(5, dim)))])

    d = density.direct_density(prompts, corpus, k=10, quantile=0.9, n_queries=400, seed=3)

    sims = prompts.astype(np.float64) @ corpus.astype(np.float64).T
    expected = np.sort(sims, axis=1)[:, ::-1][:, 9]
    np.testing.assert_allclose(d["scores"], expected, atol=1e-5)
    rows = np.sort(np.random.default_rng(3).choice(len(corpus), size=400, replace=False))
    self_sims = corpus[rows].astype(np.float64) @ corpus.astype(np.float64).T
    self_sims[np.arange(len(rows)), rows] = -np.inf                    # leave the caption itself out
    reference = np.sort(self_sims, axis=1)[:, ::-1][:, 9]
    assert d["threshold"] == pytest.approx(np.quantile(reference, 0.9), abs=1e-5)
    assert d["flags"].tolist() == [True] * 5 + [False] * 5


def test_taxonomy_density_flags_the_planted_dense_categories():
    rng = np.random.default_rng(1)
    n_cat, dim = 6, 16
    categories = _unit(np.eye(n_cat, dim) + 0.01 * rng.normal(size=(n_cat, dim)))
    caption_cats = np.array([0] * 350 + [1] * 350 + [2] * 75 + [3] * 75 + [4] * 75 + [5] * 75)
    captions = _unit(categories[caption_cats] + 0.08 * rng.normal(size=(len(caption_cats), dim)))
    prompt_cats = np.repeat(np.arange(n_cat), 3)
    prompts = _unit(categories[prompt_cats] + 0.08 * rng.normal(size=(len(prompt_cats), dim)))

    assigned_captions, _ = density.assign(captions, categories)
    assigned_prompts, _ = density.assign(prompts, categories)
    assert (assigned_captions == caption_cats).all() and (assigned_prompts == prompt_cats).all()
    d = density.taxonomy_density(assigned_prompts, assigned_captions, n_cat, quantile=0.75)

    shares = np.bincount(caption_cats, minlength=n_cat) / len(caption_cats)
    np.testing.assert_allclose(d["shares"], shares)
    assert d["threshold"] == pytest.approx(np.quantile(shares, 0.75))
    assert d["dense"].tolist() == [True, True, False, False, False, False]
    assert d["flags"].tolist() == [c in (0, 1) for c in prompt_cats]
    assert d["prompt_divergence"] == {"kl_nats": pytest.approx(0.0), "total_variation": pytest.approx(0.0)}
    p = shares
    assert d["corpus_divergence"]["kl_nats"] == pytest.approx(float(np.sum(p * np.log(p * n_cat))))
    assert d["corpus_divergence"]["total_variation"] == pytest.approx(0.5 * np.abs(p - 1 / n_cat).sum())


# ---- signal 2 ---------------------------------------------------------------------------

def test_variance_flags_planted_low_variance_prompts_for_two_of_three_models():
    rng = np.random.default_rng(2)
    n_prompts, n_images, dim = 40, 20, 24
    planted = {5, 17}
    variances, reference = {}, {}
    for model in ("m_a", "m_b", "m_c"):
        values = []
        for p in range(n_prompts):
            scale = 0.02 if p in planted and model != "m_c" else rng.uniform(0.8, 1.2)
            x = rng.normal(size=(n_images, dim)) * scale
            values.append(variance.trace_covariance(x))
            assert values[-1] == pytest.approx(float(np.trace(np.cov(x, rowvar=False))))
        variances[model] = np.array(values)
        v = np.array(values)
        reference[model] = v < v.mean() - 2 * v.std(ddof=1)

    flags = {m: variance.variance_flags(v, 2.0) for m, v in variances.items()}
    for m in variances:
        assert flags[m]["flags"].tolist() == reference[m].tolist()
        assert flags[m]["cut"] == pytest.approx(variances[m].mean() - 2 * variances[m].std(ddof=1))
    assert set(np.flatnonzero(flags["m_a"]["flags"])) == planted == set(np.flatnonzero(flags["m_b"]["flags"]))
    assert not flags["m_c"]["flags"].any()

    strong = []
    for p in range(n_prompts):
        row = {"status": "valid", "reason": "", "variance": {
            m: {"variance": float(variances[m][p]), "cut": flags[m]["cut"], "flagged": bool(flags[m]["flags"][p])}
            for m in variances}}
        d = rotation.decide(row, strong_min_models=2)
        assert d["decision"] == ("quarantined" if p in planted else "qualified")
        strong += [p] if d["strong"] else []
    assert set(strong) == planted
    # with three models required, two flags are not the strong case
    row["variance"]["m_a"]["flagged"] = row["variance"]["m_b"]["flagged"] = True
    assert not rotation.decide(row, strong_min_models=3)["strong"]


def test_variance_ignores_prompts_without_enough_images():
    v = np.array([1.0, 1.1, np.nan, 0.9, 1.05, 0.95])
    f = variance.variance_flags(v, 2.0)
    assert f["n"] == 5 and not f["flags"][2]
    assert f["mean"] == pytest.approx(np.nanmean(v))


# ---- signal 3 ---------------------------------------------------------------------------

def _cohort_data(gap: float, confound: bool, seed: int, n: int = 240):
    """Old (2025-Q1) and new (2025-Q3) prompts; score = 80 − 8·(difficulty − 1) + gap·old + noise.
    With ``confound`` the old prompts are mostly easy and the new mostly hard."""
    rng = np.random.default_rng(seed)
    prompts, scores = [], []
    for i in range(n):
        old = i < n // 2
        weights = ([0.7, 0.2, 0.1] if old else [0.1, 0.2, 0.7]) if confound else [1 / 3] * 3
        difficulty = int(rng.choice([1, 2, 3], p=weights))
        pid = f"p{i:04d}"
        prompts.append({"prompt_id": pid, "cohort": "2025-Q1" if old else "2025-Q3", "difficulty": str(difficulty)})
        scores.append((pid, "model", 80 - 8 * (difficulty - 1) + gap * old + rng.normal(0, 3)))
    return prompts, scores


def _stratified_reference(prompts, scores):
    by = {}
    for p, (_, _, s) in zip(prompts, scores, strict=True):
        by.setdefault(p["difficulty"], {"2025-Q1": [], "2025-Q3": []})[p["cohort"]].append(s)
    total = sum(len(c["2025-Q1"]) + len(c["2025-Q3"]) for c in by.values() if c["2025-Q1"] and c["2025-Q3"])
    return sum((len(c["2025-Q1"]) + len(c["2025-Q3"])) * (np.mean(c["2025-Q1"]) - np.mean(c["2025-Q3"]))
               for c in by.values() if c["2025-Q1"] and c["2025-Q3"]) / total


@pytest.mark.parametrize(("gap", "confound", "flagged"), [
    (10.0, False, True),    # above 6 points
    (2.0, False, False),    # below
    (0.0, True, False),     # old prompts only easier: the raw gap exceeds 6, the stratified one does not
    (8.0, True, True),      # a real gap under the same confound
])
def test_cohort_divergence_with_and_without_a_difficulty_confound(gap, confound, flagged):
    prompts, scores = _cohort_data(gap, confound, seed=int(gap * 10) + confound)
    cfg = CohortConfig(scores="unused.parquet", bootstrap=400, seed=7)
    result = cohorts.cohort_divergence(prompts, scores, cfg, use_difficulty=True)
    (m,) = result["models"]
    assert m["divergence"] == pytest.approx(_stratified_reference(prompts, scores))
    assert m["flagged"] is flagged
    assert m["interval"][0] < m["divergence"] < m["interval"][1]
    assert abs(m["divergence"] - gap) < 2.5
    old = [s for p, (_, _, s) in zip(prompts, scores, strict=True) if p["cohort"] == "2025-Q1"]
    new = [s for p, (_, _, s) in zip(prompts, scores, strict=True) if p["cohort"] == "2025-Q3"]
    assert m["raw_divergence"] == pytest.approx(np.mean(old) - np.mean(new))
    if confound:
        assert m["raw_divergence"] > 6.0  # the confound alone would have fired the flag
        unadjusted = cohorts.cohort_divergence(prompts, scores, cfg, use_difficulty=False)["models"][0]
        assert unadjusted["flagged"] and unadjusted["divergence"] == pytest.approx(m["raw_divergence"])
    again = cohorts.cohort_divergence(prompts, scores, cfg, use_difficulty=True)["models"][0]
    assert again["interval"] == m["interval"]  # seeded


def test_many_valued_difficulty_is_binned_by_quantiles():
    strata = cohorts.difficulty_strata([str(v) for v in range(100)] + [None], bins=4)
    assert strata[-1] == "(none)" and len(set(strata[:-1])) == 4
    assert cohorts.difficulty_strata(["easy", "hard", None], bins=4) == ["easy", "hard", "(none)"]


# ---- rotation, anchors, normalisation ------------------------------------------------------

def _decided_set(n: int = 100, n_anchor: int = 10, n_strong: int = 20, n_review: int = 5):
    prompts = []
    for i in range(n):
        strong = i < n_strong or (n - n_anchor <= i < n - n_anchor + 3)  # three anchors are strong cases too
        review = n_strong <= i < n_strong + n_review
        prompts.append({"prompt_id": f"p{i:03d}", "row": i, "text": f"prompt {i}", "cohort": f"2025-Q{1 + i % 3}",
                        "difficulty": None, "category": None, "anchor": i >= n - n_anchor, "status": "valid",
                        "reason": "", "decision": "quarantined" if strong or review else "qualified",
                        "strong": strong, "n_variance_flags": 2 if strong else 1 if review else 0,
                        "rules": ["variance:x"] if strong or review else []})
    return prompts


def _pool(n: int, flagged_every: int = 4):
    return [{"prompt_id": f"q{i:03d}", "text": f"pool {i}", "cohort": None, "difficulty": None, "category": None,
             "anchor": False, "density": {"score": i / n, "flagged": i % flagged_every == 0}} for i in range(n)]


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.08, 0.3])
def test_rotation_size_follows_the_fraction_and_never_touches_anchors(fraction):
    prompts = _decided_set()
    choice = rotation.choose_rotation(prompts, _pool(60), RotationConfig(fraction=fraction))
    anchors = {p["prompt_id"] for p in prompts if p["anchor"]}
    leaving = dict(choice["leaving"])
    assert len(leaving) == len(choice["joining"]) == round(fraction * 100)
    assert not anchors & set(leaving)
    strong = [p["prompt_id"] for p in prompts if p["strong"] and not p["anchor"]]
    assert all(why == "contamination" for pid, why in choice["leaving"][:min(len(strong), len(leaving))])
    if fraction == 0.3:  # 20 strong cases, then 10 prompts of planned diversity cycling
        assert sorted(pid for pid, why in choice["leaving"] if why == "contamination") == sorted(strong)
        assert sum(why == "diversity_cycling" for why in leaving.values()) == 10
    joining = {q["prompt_id"]: q for q in _pool(60)}
    assert not any(joining[q]["density"]["flagged"] for q in choice["joining"])  # density-flagged pool never joins

    rows, mapping = rotation.edition_tables(prompts, _pool(60), choice, "2026-Q1")
    assert len(rows) == len(prompts) and anchors <= {r["prompt_id"] for r in rows}
    assert {m["previous_id"] for m in mapping if m["previous_id"]} == {p["prompt_id"] for p in prompts}
    assert {m["new_id"] for m in mapping if m["status"] == "added"} == set(choice["joining"])
    ledger = rotation.ledger_rows(prompts, choice)
    fates = {r["prompt_id"]: r["fate"] for r in ledger}
    assert all(fates[a] == "kept: anchor, never rotated" for a in anchors if a in fates)
    assert len(ledger) == sum(p["decision"] == "quarantined" for p in prompts)


def test_rotation_without_pool_replacements_defers_instead_of_shrinking():
    prompts = _decided_set()
    choice = rotation.choose_rotation(prompts, _pool(8, flagged_every=2), RotationConfig(fraction=0.08))
    assert len(choice["leaving"]) == len(choice["joining"]) == 4  # 4 of 8 pool prompts are density-flagged
    assert sum(v == "no_pool_replacement" for v in choice["deferred"].values()) == 4


def test_anchor_normalisation_is_mean_equating():
    prompts = _decided_set(n=20, n_anchor=5, n_strong=0, n_review=0)
    rng = np.random.default_rng(4)
    scores = [(p["prompt_id"], m, float(rng.uniform(0, 100))) for m in ("a", "b") for p in prompts]
    norm = rotation.anchor_normalization(prompts, scores)
    anchor = {p["prompt_id"] for p in prompts if p["anchor"]}
    full = {m: np.mean([s for _, mm, s in scores if mm == m]) for m in ("a", "b")}
    anc = {m: np.mean([s for p, mm, s in scores if mm == m and p in anchor]) for m in ("a", "b")}
    offset = np.mean([full[m] - anc[m] for m in ("a", "b")])
    assert norm["offset"] == pytest.approx(offset)
    assert [m["comparable_score"] for m in norm["models"]] == pytest.approx([full["a"] - offset, full["b"] - offset])


# ---- the flow and the CLI on a tiny built corpus ----------------------------------------------

TAXONOMY = {"categories": [
    {"name": "geometric graphics", "description": "simple flat graphics of coloured geometric shapes such as "
                                                  "triangles, hexagons, rings and stars on stripes or gradients"},
    {"name": "animals", "description": "photographs of dogs, cats, horses, birds and wild animals"},
    {"name": "food", "description": "dishes, fruit, vegetables, bread and meals on plates"},
    {"name": "vehicles", "description": "cars, trains, bicycles, aeroplanes and boats"},
    {"name": "people", "description": "portraits of people, faces, crowds and athletes"},
]}
SHAPE_PROMPTS = ["A simple graphic of a large red hexagon and two yellow stars on diagonal blue stripes.",
                 "A large outlined green triangle and a purple ring float over a black-to-orange gradient.",
                 "Three simple shapes, a violet pentagon, a gold oval and a white star, on a checkerboard."]
OTHER_PROMPTS = ["A golden retriever catches a frisbee on a beach at sunset.",
                 "A bowl of ramen with a soft-boiled egg and spring onions on a wooden table.",
                 "A vintage steam train crosses a stone viaduct in the mountains.",
                 "A portrait of an elderly fisherman with a weathered face and a wool cap.",
                 "A tabby cat sleeping on a windowsill next to a potted basil plant.",
                 "A red racing bicycle leaning against a brick wall in the rain.",
                 "A plate of fresh sushi with salmon, tuna and pickled ginger.",
                 "A marathon runner crossing the finish line with arms raised."]
MODELS = ("gen_a", "gen_b", "gen_c")
N_IMAGES = 4
JPEG_MAGIC = b"\xff\xd8"
LOW_VARIANCE = {"p03", "p07"}  # clustered outputs for gen_a and gen_b, diverse for gen_c


def _png(rng: np.random.Generator) -> bytes:
    return noise_png(rng, (64, 64))


def _jpeg_variants(base: bytes, n: int) -> list[bytes]:
    from PIL import Image

    image = Image.open(io.BytesIO(base)).convert("RGB")
    out = []
    for q in range(n):
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90 - q)
        out.append(buf.getvalue())
    return out


def write_inputs(root: Path) -> dict[str, Path]:
    """Prompt table (11 prompts + 3 bad rows), generated images for three models, scores, pool, taxonomy."""
    texts = SHAPE_PROMPTS + OTHER_PROMPTS
    ids = [f"p{i:02d}" for i in range(len(texts))]
    cohort = ["2025-Q1" if i < 6 else "2025-Q3" for i in range(len(texts))]
    rows = {"prompt_id": ids + ["p00", "bad/id", "p99"], "text": texts + ["duplicate", "unsafe", ""],
            "cohort": cohort + ["2025-Q1"] * 3, "difficulty": [str(1 + i % 2) for i in range(len(texts))] + [None] * 3,
            "anchor": [i in (3, 9) for i in range(len(texts))] + [False] * 3}
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), root / "prompts.parquet")
    rng = np.random.default_rng(11)
    for model in MODELS:
        for pid in ids:
            folder = root / "generated" / model / pid
            folder.mkdir(parents=True)
            if pid in LOW_VARIANCE and model != "gen_c":
                images = _jpeg_variants(_png(rng), N_IMAGES)
            else:
                images = [_png(rng) for _ in range(N_IMAGES)]
            for n, data in enumerate(images):
                ext = "jpg" if data.startswith(JPEG_MAGIC) else "png"
                (folder / f"{n:02d}.{ext}").write_bytes(data)
    (root / "generated" / "gen_a" / "p05" / "99.png").write_bytes(b"not a png")  # one undecodable image
    scores = [(pid, model, 70.0 + (12.0 if model == "gen_a" and c == "2025-Q1" else 0.0) + (i % 3))
              for model in MODELS for i, (pid, c) in enumerate(zip(ids, cohort, strict=True))]
    pq.write_table(pa.table({"prompt_id": [s[0] for s in scores], "model": [s[1] for s in scores],
                             "score": [s[2] for s in scores]}), root / "scores.parquet")
    pool = ["A hot-air balloon festival over green hills at dawn.", "A lighthouse on a rocky coast in a storm.",
            "A simple graphic of two blue hexagons on yellow stripes.", "An astronaut planting a flag on Mars."]
    pq.write_table(pa.table({"prompt_id": [f"n{i}" for i in range(len(pool))], "text": pool,
                             "cohort": ["2026-Q1"] * len(pool)}), root / "pool.parquet")
    (root / "taxonomy.yaml").write_text(yaml.safe_dump(TAXONOMY))
    return {"prompts": root / "prompts.parquet", "generated": root / "generated", "scores": root / "scores.parquet",
            "pool": root / "pool.parquet", "taxonomy": root / "taxonomy.yaml"}


def _tree_hashes(root: Path) -> dict[str, str]:
    root = Path(root)
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    """A 60-record sample corpus built in-process (wfd features)."""
    from flows.build_corpus import BuildConfig, build
    from sample_corpus import write_sample_corpus

    root = tmp_path_factory.mktemp("pq")
    write_sample_corpus(str(root / "source"), n=60, seed=0)
    build(BuildConfig.model_validate({
        "source": str(root / "source"), "out": str(root / "corpus"), "input": {"partition_size": 30},
        "staging": {"shard_size": 20}, "splits": {"shard_size": 20, "val": 0.1, "test": 0.15}}))
    return root / "corpus"


def _config_data(corpus: Path, inputs: dict[str, Path], out: Path, **over) -> dict:
    data = {"prompts": {"path": str(inputs["prompts"])}, "out": str(out), "corpus": str(corpus),
            "density": {"mode": "direct", "sample_size": 40, "k": 3, "reference_queries": 40},
            "variance": {"generated": str(inputs["generated"]), "prompts_per_unit": 5},
            "cohorts": {"scores": str(inputs["scores"]), "bootstrap": 200},
            "rotation": {"fraction": 0.2, "pool": str(inputs["pool"])}}
    for key, value in over.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    return data


def _config(*args, **over):
    from flows.prompt_qualification import PromptQualificationConfig

    return PromptQualificationConfig.model_validate(_config_data(*args, **over))


@pytest.fixture(scope="module")
def qualified(tiny_corpus, tmp_path_factory):
    """One CLI run end to end (YAML → preflight → flow in-process), inputs hashed before."""
    import flows.prompt_qualification as module
    from flows.cli import main

    root = tmp_path_factory.mktemp("qualify")
    inputs = write_inputs(root / "inputs")
    before = {"inputs": _tree_hashes(root / "inputs"), "corpus": _tree_hashes(tiny_corpus)}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(_config_data(tiny_corpus, inputs, root / "out")))
    mp = pytest.MonkeyPatch()
    mp.setattr(module, "run_qualify_prompts", module.qualify_prompts)  # the Dask flow: tests/test_contamination's way
    try:
        code = main(["qualify-prompts", "--config", str(path)])
    finally:
        mp.undo()
    return SimpleNamespace(root=root, inputs=inputs, before=before, code=code, out=root / "out", corpus=tiny_corpus)


def test_cli_end_to_end_flags_the_planted_prompts(qualified):
    assert qualified.code == 0
    out = qualified.out
    table = pq.read_table(out / "qualification/prompts.parquet").to_pylist()
    errors = {r["row"]: r["reason"] for r in table if r["status"] == "error"}
    assert errors == {11: "duplicate_id", 12: "unsafe_id", 13: "empty_text"}  # each bad row: its reason
    prompts = {r["prompt_id"]: r for r in table if r["status"] == "valid"}
    assert len(prompts) == 11

    variance_rows = pq.read_table(out / "qualification/variance.parquet").to_pylist()
    assert len(variance_rows) == len(MODELS) * 11
    flagged = {pid: set(json.loads(r["variance_flags"])) for pid, r in prompts.items()}
    assert {p for p, ms in flagged.items() if ms} == LOW_VARIANCE
    assert all(flagged[p] == {"gen_a", "gen_b"} and prompts[p]["strong"] for p in LOW_VARIANCE)
    bad = next(r for r in variance_rows if r["model"] == "gen_a" and r["prompt_id"] == "p05")
    assert bad["n_images"] == N_IMAGES + 1 and bad["n_embedded"] == N_IMAGES
    assert json.loads(bad["images"])[-1][0] == "99.png" and json.loads(bad["images"])[-1][2]  # that image's error

    cohorts_table = {r["model"]: r for r in pq.read_table(out / "qualification/cohorts.parquet").to_pylist()}
    assert cohorts_table["gen_a"]["flagged"] and not cohorts_table["gen_b"]["flagged"]

    ledger = {r["prompt_id"]: r for r in pq.read_table(out / "qualification/quarantine.parquet").to_pylist()}
    assert LOW_VARIANCE <= set(ledger)
    assert ledger["p03"]["fate"] == "kept: anchor, never rotated"  # p03 is an anchor
    assert ledger["p07"]["fate"] == "rotated_out"
    mapping = {m["previous_id"]: m for m in pq.read_table(out / "prompt_edition/mapping.parquet").to_pylist()
               if m["previous_id"]}
    assert mapping["p03"]["status"] == "kept" and mapping["p09"]["status"] == "kept"  # anchors
    assert mapping["p07"]["status"] == "rotated_out"
    edition = pq.read_table(out / "prompt_edition/prompts.parquet").to_pylist()
    assert len(edition) == 11 and sum(r["origin"] == "pool" for r in edition) == round(0.2 * 11)
    receipt = json.loads((out / "qualification/receipt.json").read_bytes())
    assert receipt["text_model"]["weights_sha256"] and receipt["text_model"]["name"] == "all-MiniLM-L6-v2"
    assert receipt["image_model"]["model_id"] == "wfd"
    assert receipt["thresholds"]["cohorts"]["threshold"] == 6.0
    assert receipt["results"]["normalization"]["computed"]
    report = (out / "qualification/report.md").read_text()
    assert "heuristics and risk indicators, not proofs" in report


def test_inputs_and_corpus_are_never_modified(qualified):
    assert _tree_hashes(qualified.root / "inputs") == qualified.before["inputs"]
    assert _tree_hashes(qualified.corpus) == qualified.before["corpus"]


def test_direct_density_equals_numpy_on_the_stored_embeddings(qualified):
    """The flow's density scores recomputed from its own stored embeddings, brute force."""
    out = qualified.out
    caption_vectors = np.concatenate([np.load(p) for p in sorted((out / "work/prompts/captions").glob("*.npy"))])
    prompt_vectors = np.load(out / "work/prompts/texts/prompts.npy")
    assert caption_vectors.shape[0] == 40 and np.allclose(np.linalg.norm(caption_vectors, axis=1), 1, atol=1e-4)
    expected = np.sort(prompt_vectors.astype(np.float64) @ caption_vectors.T.astype(np.float64), axis=1)[:, ::-1][:, 2]
    rows = [r for r in pq.read_table(out / "qualification/prompts.parquet").to_pylist() if r["status"] == "valid"]
    np.testing.assert_allclose([r["density_score"] for r in rows], expected, atol=1e-5)
    # shape prompts (the corpus is made of shape graphics) are denser than every other prompt
    assert min(r["density_score"] for r in rows[:3]) > max(r["density_score"] for r in rows[3:])


def test_taxonomy_mode_reuses_the_caption_embeddings(qualified):
    from flows.prompt_qualification import qualify_prompts

    out = qualified.root / "out-taxonomy"
    import shutil

    shutil.copytree(qualified.out / "work", out / "work")
    shutil.copytree(qualified.out / "_markers", out / "_markers")
    result = qualify_prompts(_config(qualified.corpus, qualified.inputs, out,
                                     density={"mode": "taxonomy", "taxonomy": str(qualified.inputs["taxonomy"]),
                                              "category_quantile": 0.9}))
    assert result["work"]["caption_shards"]["computed"] == 0 and result["work"]["caption_shards"]["skipped"] > 0
    categories = {r["name"]: r for r in pq.read_table(out / "qualification/categories.parquet").to_pylist()}
    assert categories["geometric graphics"]["dense"] and categories["geometric graphics"]["corpus_share"] > 0.5
    rows = [r for r in pq.read_table(out / "qualification/prompts.parquet").to_pylist() if r["status"] == "valid"]
    assert [r["category"] == "geometric graphics" for r in rows] == [True] * 3 + [False] * 8
    assert [r["density_flagged"] for r in rows] == [True] * 3 + [False] * 8
    summary = json.loads((out / "qualification/summary.json").read_bytes())
    assert summary["density"]["prompt_divergence"]["kl_nats"] > 0


def test_receipt_changes_with_any_input_byte_or_threshold_and_not_otherwise(qualified, tmp_path):
    import shutil

    from flows.prompt_qualification import qualify_prompts

    inputs = {k: tmp_path / "in" / v.relative_to(qualified.root / "inputs") for k, v in qualified.inputs.items()}
    shutil.copytree(qualified.root / "inputs", tmp_path / "in")
    out = tmp_path / "out"
    for folder in ("work", "_markers"):  # the units of the CLI run are reused (same inputs, other folder)
        shutil.copytree(qualified.out / folder, out / folder)

    def run(**over) -> tuple[bytes, dict]:
        result = qualify_prompts(_config(qualified.corpus, inputs, out, **over))
        return (out / "qualification/receipt.json").read_bytes(), result["work"]

    base, work = run()
    assert work["caption_shards"]["computed"] == 0  # the images moved (their root is in the fingerprint):
    again, work = run()                             # variance units were recomputed once, and now are not
    assert again == base and work["variance_units"] == {"computed": 0, "skipped": 9}
    assert run(dask={"n_workers": 3})[0] == base
    assert run(cohorts={"threshold": 5.0})[0] != base
    assert run(variance={"sd_threshold": 1.5})[0] != base
    assert run(density={"k": 4})[0] != base
    assert run(rotation={"fraction": 0.1})[0] != base
    assert run()[0] == base

    image = inputs["generated"] / "gen_b" / "p08" / "00.png"
    original = image.read_bytes()
    image.write_bytes(_png(np.random.default_rng(99)))
    changed, work = run()
    assert changed != base
    assert work["variance_units"]["computed"] == 1  # only the unit holding that image
    image.write_bytes(original)
    assert run()[0] == base

    scores = pq.read_table(inputs["scores"]).to_pydict()
    scores["score"][0] += 0.5
    pq.write_table(pa.table(scores), inputs["scores"])
    assert run()[0] != base


@pytest.mark.parametrize(("case", "message"), [
    ("missing_prompts", "prompt table"),
    ("out_inside_corpus", "overlaps the corpus"),
    ("bad_taxonomy", "taxonomy"),
    ("unknown_key", "unknown key"),
    ("missing_column", "needs columns"),
])
def test_user_errors_are_one_line_and_exit_2(qualified, tmp_path, capsys, monkeypatch, case, message):
    import corpusforge.cluster as cluster
    from flows.cli import main

    def refuse(*_args, **_kwargs):
        raise AssertionError("a server or cluster was started before the user error was reported")

    monkeypatch.setattr(cluster, "prefect_api", refuse)
    monkeypatch.setattr(cluster, "task_runner", refuse)

    inputs = dict(qualified.inputs)
    data = _config_data(qualified.corpus, inputs, tmp_path / "out")
    if case == "missing_prompts":
        data["prompts"]["path"] = str(tmp_path / "nope.parquet")
    elif case == "out_inside_corpus":
        data["out"] = str(qualified.corpus / "qualification")
    elif case == "bad_taxonomy":
        (tmp_path / "tax.yaml").write_text("categories: [{name: only}]\n")
        data["density"] = {"mode": "taxonomy", "taxonomy": str(tmp_path / "tax.yaml")}
    elif case == "unknown_key":
        data["variance"]["sd_treshold"] = 2
    else:
        data["prompts"]["text_column"] = "prompt"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["qualify-prompts", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("corpusforge qualify-prompts: error:")
    assert not (tmp_path / "out").exists() and not (qualified.corpus / "qualification").exists()


@pytest.mark.slow
def test_flow_on_two_dask_workers_equals_the_in_process_run(qualified, tmp_path, prefect_server):
    """The Prefect flow on a LocalCluster with two worker processes writes the same bytes."""
    from corpusforge.cluster import DaskConfig
    from flows.prompt_qualification import prompt_qualification_flow

    prompt_qualification_flow(_config(qualified.corpus, qualified.inputs, tmp_path / "dask",
                                      dask=DaskConfig(n_workers=2, threads_per_worker=1, processes=True)))
    for rel in ("qualification/prompts.parquet", "qualification/variance.parquet", "qualification/cohorts.parquet",
                "qualification/quarantine.parquet", "prompt_edition/mapping.parquet", "work/prompts/texts/prompts.npy"):
        assert (tmp_path / "dask" / rel).read_bytes() == (qualified.out / rel).read_bytes(), rel
    receipts = [json.loads((root / "qualification/receipt.json").read_bytes()) for root in (tmp_path / "dask",
                                                                                              qualified.out)]
    for r in receipts:
        r["config"].pop("out")  # the one setting that differs
    assert receipts[0] == receipts[1]


def test_text_embeddings_are_the_same_bytes_whatever_torch_threads_the_process_had():
    """The density signal's caption embeddings are made on Dask workers (one torch thread)
    or in the flow's process (every core); under load MKL picks fewer threads. The bytes of
    prompts.parquet once differed between a Dask and an in-process run for this reason."""
    import torch

    from tasks.prompts.text_model import embed_texts

    texts = [f"a photo of a dog number {i} in the park" for i in range(300)]
    before = torch.get_num_threads()
    rows = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            rows.append(embed_texts(texts, "all-MiniLM-L6-v2", 32, 256))
    finally:
        torch.set_num_threads(before)
    assert rows[0].tobytes() == rows[1].tobytes()
    assert torch.get_num_threads() == before  # the caller's setting is left as it was
