"""Geometric verification of review-band pairs (mode gpic_verified) against GPIC's exact rule.

Copies made here from the sample corpus's photographs with the edits the weight-free
descriptor scores below its graph threshold (greyscale, rotation, caption bar, crop), and
unrelated images of the same corpus.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageDraw

from corpusforge.storage import Store
from tasks.shared.features.config import FeaturesConfig, RuntimeConfig
from tasks.shared.features.decode import decode_rgb
from tasks.shared.features.extract import extract_features
from tasks.graph import verify as verify_module
from tasks.graph.config import CalibrationConfig, CollisionConfig, IndexConfig, NearDedupConfig, VerificationConfig
from tasks.graph.decisions import read_decisions
from tasks.graph.stage import near_duplicate_stage
from tasks.graph.verify import local_features, verify_pair
from tests.staging_files import stage_images

pytestmark = pytest.mark.timeout(300)


def _jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def edits(image: Image.Image) -> dict[str, Image.Image]:
    w, h = image.size
    bar = image.copy()
    draw = ImageDraw.Draw(bar)
    draw.rectangle((0, int(h * 0.82), w, h), fill=(0, 0, 0))
    draw.text((10, int(h * 0.86)), "SALE  -  caption bar over the picture", fill=(255, 255, 255))
    return {"greyscale": image.convert("L").convert("RGB"),
            "rotate": image.rotate(8, resample=Image.Resampling.BICUBIC, expand=False),
            "caption_bar": bar,
            "crop25": image.crop((int(w * 0.125), int(h * 0.125), int(w * 0.875), int(h * 0.875)))}


@pytest.fixture(scope="module")
def photos(sample_corpus: Path) -> list[Image.Image]:
    """Decodable sample images that are no planted copy of anything."""
    truth = json.loads((sample_corpus / "ground_truth.json").read_text())
    related = {k for c in truth["clusters"] for k in c["keys"]}
    for group in ("near_duplicates", "exact_duplicates"):
        related |= {e["key"] for e in truth[group]} | {e["copy_of"] for e in truth[group]}
    related |= {b["key"] for b in truth["bad_records"]}
    rows = pq.read_table(sample_corpus / "metadata.parquet", columns=["key", "path"]).to_pylist()
    out = []
    for r in rows:
        if r["key"] not in related and len(out) < 14:
            out.append(decode_rgb((sample_corpus / r["path"]).read_bytes()))
    return out


def test_edited_copies_verify_and_unrelated_pairs_do_not(photos):
    cfg = VerificationConfig()
    feats = [local_features(p) for p in photos]
    for original, f in zip(photos[:4], feats[:4], strict=True):
        for kind, copy in edits(original).items():
            r = verify_pair(local_features(copy), f, cfg, 1.0)
            assert r["verified"], (kind, r)
            if kind == "rotate":
                assert r["angle"] == pytest.approx(8, abs=1.5)  # the transform RANSAC found
    for i in range(len(photos)):
        for j in range(i + 1, len(photos)):
            r = verify_pair(feats[i], feats[j], cfg, 1.0)
            assert not r["verified"] and r["inliers"] < cfg.min_inliers, (i, j, r)


def test_a_pair_gives_the_same_result_whatever_ran_before(photos):
    cfg = VerificationConfig()
    a, b = local_features(edits(photos[0])["rotate"]), local_features(photos[0])
    first = verify_pair(a, b, cfg, 0.7)
    for p in photos[1:6]:  # other pairs draw from OpenCV's RNG in between
        verify_pair(local_features(p), b, cfg, 0.7)
    assert verify_pair(a, b, cfg, 0.7) == first


def _build(root: Path, photos: list[Image.Image], mode: str = "auto", extra: bool = False,
           **verification) -> tuple[Store, list[str]]:
    """Staged: an original, its four edited copies and nine unrelated photos (and, with
    ``extra``, a second shard of another photo's copies and a crop of the original, whose
    band pairs reach the first shard's images); wfd features; the graph stage.
    The review band starts at 0.4 here: these edits are harsher than the sample's (the
    copies but the greyscale one score 0.47-0.87 with wfd), and more unrelated pairs then
    reach verification."""
    store = Store(str(root))
    images = [("orig", _jpeg(photos[1]), "jpg")]
    images += [(f"c_{kind}", _jpeg(copy), "jpg") for kind, copy in edits(photos[1]).items()]
    images += [(f"p{i:02d}", _jpeg(p), "jpg") for i, p in enumerate([photos[0], *photos[3:11]])]
    stage_images(store, "000000", images)
    shards = ["000000"]
    if extra:  # a later shard: copies of another photo, and another crop of the original
        w, h = photos[1].size
        later = [(f"d_{k}", _jpeg(c), "jpg") for k, c in edits(photos[2]).items()]
        later.append(("d_orig_crop", _jpeg(photos[1].crop((0, 0, int(w * 0.8), int(h * 0.8)))), "jpg"))
        stage_images(store, "000001", later)
        shards.append("000001")
    extract_features(store, shards, FeaturesConfig(runtime=RuntimeConfig(batch_size=8)))
    cfg = NearDedupConfig(index=IndexConfig(kind="flat", search="range"), collision=CollisionConfig(enabled=False),
                          calibration=CalibrationConfig(enabled=False),
                          verification=VerificationConfig(mode=mode, **{"review_min_similarity": 0.4, **verification}))
    near_duplicate_stage(store, cfg, shards)
    return store, shards


def _tree(root: Path, folder: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / folder).rglob("*")) if p.is_file()}


def test_verified_pairs_are_removed_only_in_gpic_verified_mode(photos, tmp_path):
    store, shards = _build(tmp_path / "v", photos)
    decisions = {d["key"]: d for d in read_decisions(store, shards).to_pylist()}
    evidence = store.read_parquet("graph/verified/000000.parquet").to_pylist()
    assert all(0.4 <= e["similarity"] <= 0.9625 for e in evidence)  # the band reaches the pair threshold
    assert len(evidence) >= 4
    verified = {(e["key_a"], e["key_b"]) for e in evidence if e["verified"]}
    copies = {"orig", *(f"c_{k}" for k in edits(photos[1]))}
    assert all({a, b} <= copies for a, b in verified)  # no false pair
    by_verification = {k for k, d in decisions.items() if d["reason"] == "verified_pair:inliers>=10"}
    assert by_verification, "no copy came through verification"
    gone = {k for k, d in decisions.items() if d["status"] == "near_duplicate"}
    assert by_verification <= gone <= copies and all(decisions[k]["duplicate_of"] in copies for k in gone)
    # the copies connect through verified pairs: one is kept, the highest resolution (ties: smallest key)
    assert copies - gone == {"c_caption_bar"}
    assert all(d["status"] == "kept" for k, d in decisions.items() if k.startswith("p"))
    summary = store.read_json("graph/summary.json")
    assert summary["rule"] == "gpic_verified" and summary["verification"]["verified"] == len(verified)

    exact, _ = _build(tmp_path / "e", photos, mode="gpic_exact")
    exact_decisions = {d["key"]: d for d in read_decisions(exact, shards).to_pylist()}
    assert not exact.exists("graph/verified/000000.parquet")
    assert exact.read_json("graph/summary.json")["rule"] == "gpic_exact"
    # the paper's rule: the greyscale copy scores like its original (wfd's pair rule), so one
    # of the two goes by similarity alone; the other copies (0.47-0.87 with wfd) stay
    grey_pair = {"orig", "c_greyscale"}
    assert sorted(exact_decisions[k]["status"] for k in grey_pair) == ["kept", "near_duplicate"]
    for key, d in exact_decisions.items():
        assert d == decisions[key] if key not in copies else (key in grey_pair or d["status"] == "kept")
    _build(tmp_path / "v", photos, mode="gpic_exact")  # switched back: the same files as a fresh exact build
    for folder in ("graph", "_markers/graph"):
        assert _tree(tmp_path / "v", folder) == _tree(tmp_path / "e", folder)


def test_a_unit_keeping_one_staging_index_writes_the_same_bytes(photos, tmp_path, monkeypatch):
    """The second shard's unit reaches images of both shards: with room for one staging
    index (and one image's features) it reads an index again whenever it switches shard."""
    _build(tmp_path / "a", photos, extra=True)
    reads = []
    real = verify_module.staging_index
    with monkeypatch.context() as m:
        m.setattr(verify_module, "CACHED_INDEXES", 1)
        m.setattr(verify_module, "CACHED_IMAGES", 1)
        m.setattr(verify_module, "staging_index", lambda shard: reads.append(shard) or real(shard))
        _build(tmp_path / "b", photos, extra=True)
    assert len(reads) > len(set(reads))  # an index evicted and read again: the bound was exercised
    for folder in ("graph/review", "graph/verified", "graph/decisions"):
        assert _tree(tmp_path / "a", folder) == _tree(tmp_path / "b", folder)


def test_verification_is_byte_identical_and_incremental(photos, tmp_path, monkeypatch):
    """review_k=2: the new shard's copies displace an old pair from an old image's two best.
    A unit that keeps one image's local features at a time writes the same bytes."""
    a, shards = _build(tmp_path / "a", photos, review_k=2)
    with monkeypatch.context() as m:  # b decodes an image again whenever another pair needs it
        m.setattr(verify_module, "CACHED_IMAGES", 1)
        b, _ = _build(tmp_path / "b", photos, review_k=2)
    for folder in ("graph/review", "graph/verified", "graph/decisions"):
        assert _tree(tmp_path / "a", folder) == _tree(tmp_path / "b", folder)
    calls = []
    real = verify_module.verify_pair
    monkeypatch.setattr(verify_module, "verify_pair", lambda *x: calls.append(1) or real(*x))
    _build(tmp_path / "a", photos, review_k=2)  # rerun: nothing changed, the unit is skipped
    assert calls == []
    before = {(r["key_a"], r["key_b"]) for r in a.read_parquet("graph/verified/000000.parquet").to_pylist()}
    _build(tmp_path / "a", photos, extra=True, review_k=2)  # a new shard: only pairs with a new image are verified
    rows = [r for s in ("000000", "000001") for r in a.read_parquet(f"graph/verified/{s}.parquet").to_pylist()]
    new = [r for r in rows if r["key_a"].startswith("d_") or r["key_b"].startswith("d_")]
    old = {(r["key_a"], r["key_b"]) for r in rows} - {(r["key_a"], r["key_b"]) for r in new}
    assert len(calls) == len(new)
    # a new image became a closer band partner of an old one: an old pair left the review (never one joins)
    assert old < before
    fresh, _ = _build(tmp_path / "c", photos, extra=True, review_k=2)
    for folder in ("graph/review", "graph/verified", "graph/decisions"):  # the review choice is global
        assert _tree(tmp_path / "a", folder) == _tree(tmp_path / "c", folder)
    calls.clear()
    _build(tmp_path / "a", photos, extra=True, review_k=2, min_inliers=16)  # a verification setting: every pair again
    assert len(calls) == len(rows)
    assert np.all([r["inliers"] >= 16 for r in a.read_parquet("graph/verified/000000.parquet").to_pylist()
                   if r["verified"]])


def test_an_image_too_small_for_orb_has_no_local_features():
    """An undecodable image stands in as 1x1 px; ORB's pyramid used to fail on it."""
    from PIL import Image

    for side in (1, 8, 62):
        xy, desc, pixels, _ = local_features(Image.new("RGB", (side, side)))
        assert len(xy) == 0 and desc is None and pixels.shape == (side, side)


def test_mode_auto_verifies_for_wfd_and_for_a_self_calibrated_learned_model():
    """A self-calibrated threshold alone finds about half of a learned model's copies on real
    photographs at zero false links (bench/near_dup_build.py): calibrate auto verifies."""
    from tasks.graph.config import NearDedupConfig

    assert NearDedupConfig().verifying
    assert not NearDedupConfig(model_id="sscd_onnx_s224").verifying
    assert NearDedupConfig(model_id="sscd_onnx_s224", calibrate="auto").verifying
    assert not NearDedupConfig(model_id="sscd_onnx_s224", calibrate="auto",
                               verification={"mode": "gpic_exact"}).verifying


def test_a_pair_whose_floor_similarity_moved_is_verified_again(photos, tmp_path, monkeypatch):
    """A verdict depends on the images, the settings and the similarity its colourless floor is
    judged on: a reused row must have all three unchanged (a crop's region or a model's scores
    can move while the bytes stay)."""
    from tasks.graph.nodes import NodeTable

    store, _ = _build(tmp_path / "a", photos)
    cfg = NearDedupConfig(verification=VerificationConfig(review_min_similarity=0.4))
    nodes = NodeTable.from_json(store.read_json("graph/nodes.json"))
    review = store.read_parquet("graph/review/000000.parquet").to_pydict()
    assert len(review["src"]) > 1
    calls = []
    real = verify_module.verify_pair
    monkeypatch.setattr(verify_module, "verify_pair", lambda *x: calls.append(x[3]) or real(*x))
    verify_module._verify(store, store, cfg, nodes, "000000", False)
    assert calls == []  # every pair's images, settings and similarity as before: all reused
    review["similarity"][0] = min(0.99, review["similarity"][0] + 0.05)
    schema = store.read_parquet("graph/review/000000.parquet").schema
    store.write_parquet("graph/review/000000.parquet", pa.Table.from_pydict(review, schema=schema))
    verify_module._verify(store, store, cfg, nodes, "000000", False)
    assert calls == [pytest.approx(review["similarity"][0], abs=1e-6)]
