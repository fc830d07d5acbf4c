"""Off-centre crops of real photographs in a build: found by region (each picture's whole
frame searched among every other picture's 70 % windows, tasks/graph/crops.py), removed only
when verification passes, and never a different photograph of the same subject.
Photographs: ``tests/data/real_photos`` (Debian's opencv-doc, see its README)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from corpusforge.storage import Store
from tasks.graph.config import CalibrationConfig, CollisionConfig, IndexConfig, NearDedupConfig
from tasks.graph.crops import WINDOWS, BestPartners, best_windows, region_parts
from tasks.graph.decisions import read_decisions
from tasks.graph.planted import plant
from tasks.graph.stage import near_duplicate_stage
from tasks.shared.features.config import FeaturesConfig, RuntimeConfig
from tasks.shared.features.extract import extract_features
from tests.staging_files import stage_photo_copies

pytestmark = pytest.mark.timeout(600)

PHOTOS = Path(__file__).parent / "data" / "real_photos"
CROPPED = ("leuvenA", "aloeL", "graf1", "left01")  # left01: a greyscale chessboard
SAME_SUBJECT = {"leuvenA": "leuvenB", "aloeL": "aloeR", "graf1": "graf3", "left01": "left02"}
QUIET = dict(collision=CollisionConfig(enabled=False), calibration=CalibrationConfig(enabled=False))


def _stage(root: Path) -> tuple[Store, list[str]]:
    """Every fixture photograph in one shard, an off-centre 70 % crop of four of them in another."""
    store = Store(str(root))
    shards = stage_photo_copies(store, PHOTOS, "offcentre_crop_70", CROPPED, "crop_")
    extract_features(store, shards, FeaturesConfig(runtime=RuntimeConfig(batch_size=8)))
    return store, shards


def _tree(root: Path, *folders: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for folder in folders
            for p in sorted((root / folder).rglob("*")) if p.is_file()}


def test_off_centre_crops_are_removed_in_a_build_and_other_photos_of_the_subject_are_not(tmp_path):
    store, shards = _stage(tmp_path / "a")
    near_duplicate_stage(store, NearDedupConfig(crop_candidates=0, **QUIET), shards)
    decisions = {d["key"]: d for d in read_decisions(store, shards).to_pylist()}
    missed = [n for n in CROPPED if decisions[f"crop_{n}"]["status"] == "kept"]
    assert len(missed) >= 3, missed  # the graph and its review band alone miss most of them
    assert not store.exists("graph/crops") and not store.exists("work/graph/regions")

    summary, work = near_duplicate_stage(store, NearDedupConfig(**QUIET), shards)  # the default: crops on
    decisions = {d["key"]: d for d in read_decisions(store, shards).to_pylist()}
    for name in CROPPED:
        d = decisions[f"crop_{name}"]
        assert d["status"] == "near_duplicate" and d["duplicate_of"] == name, (name, d)
    assert {decisions[f"crop_{n}"]["reason"] for n in missed} == {"verified_crop:inliers>=10"}
    removed = {k for k, d in decisions.items() if d["status"] == "near_duplicate"}
    assert removed == {f"crop_{n}" for n in CROPPED}  # no photograph, nor another of one subject
    assert all(decisions[b]["status"] == "kept" for b in SAME_SUBJECT.values())
    crops = summary["verification"]["crop_candidates"]
    assert crops["k"] == 5 and 0 < crops["pairs"] <= crops["candidates"] <= 5 * len(decisions)
    assert work["crop_regions"] == {"computed": 2, "skipped": 0}
    rows = [r for s in shards for r in store.read_parquet(f"graph/verified/{s}.parquet").to_pylist()]
    verified_crops = {(r["key_a"], r["key_b"]) for r in rows if r["verified"] and r["region"] is not None}
    assert {(f"crop_{n}", n) for n in missed} <= verified_crops
    # the greyscale chessboard's crop scores below the colourless floor globally: its floor is
    # judged on the region score that found it
    chess = next(r for r in rows if r["key_a"] == "crop_left01" and r["key_b"] == "left01")
    assert chess["colourless"] and chess["similarity"] < 0.6 < chess["region"] and chess["verified"]

    # a rerun with nothing changed computes nothing; a fresh build writes the same bytes
    _, again = near_duplicate_stage(store, NearDedupConfig(**QUIET), shards)
    assert again["crop_regions"] == {"computed": 0, "skipped": 2} and again["verification"]["computed"] == 0
    fresh, _ = _stage(tmp_path / "b")
    near_duplicate_stage(fresh, NearDedupConfig(**QUIET), shards)
    folders = ("graph", "work/graph/regions", "_markers/graph", "_markers/work/graph/regions")
    assert _tree(tmp_path / "a", *folders) == _tree(tmp_path / "b", *folders)


def test_an_ivf_index_leaves_crop_candidates_off_and_says_so(tmp_path):
    """The search is exhaustive: above flat_max_vectors (an IVF plan) the stage does not run it."""
    store, shards = _stage(tmp_path)
    near_duplicate_stage(store, NearDedupConfig(**QUIET), shards)
    assert store.exists("graph/crops/000001.parquet")
    summary, work = near_duplicate_stage(store, NearDedupConfig(index=IndexConfig(kind="ivf"), **QUIET), shards)
    assert summary["verification"]["crop_candidates"].startswith("off: the search is exhaustive")
    assert "crop_regions" not in work
    assert not store.exists("graph/crops") and not store.exists("work/graph/regions")
    assert all(d["reason"] != "verified_crop:inliers>=10" for d in read_decisions(store, shards).to_pylist())


def test_best_partners_do_not_depend_on_the_blocks():
    rng = np.random.default_rng(0)
    parts = rng.normal(size=(40, 1 + WINDOWS, 63)).astype(np.float16)
    parts /= np.linalg.norm(parts, axis=2, keepdims=True).astype(np.float16)
    results = []
    for block, batch in ((40, 40), (7, 3)):
        best = BestPartners(np.arange(10, 30), 3, 0.0)
        for b in range(0, 40, block):
            for q in range(0, 20, batch):
                rows = slice(q, min(q + batch, 20))
                best.add(rows, np.arange(b, min(b + block, 40)), best_windows(parts[10:30][rows, 0],
                                                                              parts[b:b + block, 1:]))
        results.append(best.pairs())
    for a, b in zip(*results, strict=True):
        assert np.array_equal(a, b)
    src, dst, _ = results[0]
    assert len(src) and not np.any(src == dst)
    assert len({(min(a, b), max(a, b)) for a, b in zip(src.tolist(), dst.tolist(), strict=True)}) == len(src)


def test_a_region_scores_one_with_itself_and_a_crop_matches_a_window_not_the_frame():
    photo = Image.open(PHOTOS / "leuvenA.jpg").convert("RGB")
    parts = region_parts(photo)
    assert parts.shape == (1 + WINDOWS, 63)
    assert best_windows(parts[:1], parts[None, :1])[0, 0] == pytest.approx(1.0, abs=1e-5)
    crop = region_parts(plant(photo, "offcentre_crop_70", 0))
    whole, window = best_windows(crop[:1], parts[None, :1])[0, 0], best_windows(crop[:1], parts[None, 1:])[0, 0]
    assert window > NearDedupConfig().crop_floor > 0.2 > whole
