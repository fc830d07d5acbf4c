"""``near_dedup.calibrate: auto``: the stage fits its thresholds on its own pictures before the graph,
records the calibration, and a rerun reuses it (byte-identical, nothing embedded again).

Real pieces: staging shards of real photographs (tests/data/real_photos and scikit-image's),
wfd features from the feature stage itself, the near-duplicate stage in-process.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import skimage.data
from PIL import Image

from corpusforge.storage import Store
from tasks.graph.config import CalibrationConfig, CollisionConfig, IndexConfig, NearDedupConfig
from tasks.graph.self_calibration_unit import FOLDER, RECORD_PATH, REPORT_PATH
from tasks.graph.stage import near_duplicate_stage
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.extract import extract_features
from tests.staging_files import stage_images

PHOTOS = Path(__file__).parent / "data" / "real_photos"
SKIMAGE = ("astronaut", "camera", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
           "retina", "brick", "grass", "gravel", "coins", "moon")


def _png(name: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("RGB").save(buf, "PNG")
    return buf.getvalue()


def corpus(root: Path) -> tuple[Store, list[str]]:
    images = [(p.stem, p.read_bytes(), "jpg") for p in sorted(PHOTOS.glob("*.jpg"))]
    images += [(n, _png(n), "png") for n in SKIMAGE]
    store = Store(str(root))
    shards = ["shard-a", "shard-b"]
    stage_images(store, shards[0], images[:11])
    stage_images(store, shards[1], images[11:])
    extract_features(store, shards, FeaturesConfig())
    return store, shards


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def cfg(calibrate: str) -> NearDedupConfig:
    return NearDedupConfig(calibrate=calibrate, index=IndexConfig(kind="flat", search="range"),
                           collision=CollisionConfig(enabled=False), calibration=CalibrationConfig(pairs_per_bin=1))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("a")
    store, shards = corpus(root)
    summary, work = near_duplicate_stage(store, cfg("auto"), shards)
    return root, store, shards, summary, work


def test_the_stage_runs_on_calibrated_thresholds_and_records_them(built):
    root, store, _, summary, work = built
    assert work["self_calibration"] == "computed"
    record = summary["self_calibration"]
    t = record["thresholds"]
    assert t["fitted"], t
    assert record == store.read_json(RECORD_PATH)
    assert record["sample"]["pictures"] == 21 and len(record["sample"]["sha256"]) == 64
    assert {"seed", "model_id", "digest", "closest_unrelated", "margin"} <= set(record)
    # wfd verifies: the calibrated link is pair removal, zero false links on the sample plus the margin
    assert t["pair_removal_above"] >= record["closest_unrelated"] + record["margin"]
    assert t["pair_removal_above"] != NearDedupConfig().pair_removal_above
    # the graph was searched and decided with them
    assert summary["graph"]["threshold"] == t["edge_min_similarity"]
    assert summary["verification"]["review_low"] == t["review_min_similarity"]
    page = (root / REPORT_PATH).read_text()
    assert "Unrelated pairs closest to the threshold" in page and page.count("data:image/jpeg;base64,") >= 24


def test_a_rerun_reuses_the_calibration_and_equals_a_fresh_build(built, tmp_path):
    root, store, shards, summary, _ = built
    first = tree(root / "graph")
    again, work = near_duplicate_stage(store, cfg("auto"), shards)
    assert work["self_calibration"] == "skipped" and work["decisions"] == "skipped"
    assert again == summary and tree(root / "graph") == first
    fresh_store, _ = corpus(tmp_path / "b")
    near_duplicate_stage(fresh_store, cfg("auto"), shards)
    assert tree(tmp_path / "b" / "graph") == first
    # switched off: the configured thresholds, and no calibration left behind (as a fresh build)
    off, work = near_duplicate_stage(store, cfg("off"), shards)
    assert "self_calibration" not in off and off["graph"]["threshold"] == NearDedupConfig().edge_min_similarity
    assert not (root / FOLDER).exists() and not (root / "_markers" / FOLDER).exists()
