"""The two flows end to end on a tiny corpus, with a real (random-init, tiny) DINOv2.

Reference statistics are checked against np.cov of the features the feature stage
stored, evaluation against an independent embedding + scipy FD; reruns on another
worker count must give byte-identical statistics files.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pyarrow as pa
import pytest
import scipy.linalg
from PIL import Image

from corpusforge.cluster import DaskConfig
from corpusforge.feature_files import read_shard_features
from corpusforge.layout import MANIFEST_SCHEMA, manifest_path
from corpusforge.storage import Store
from corpusforge.tarshard import Sample
from flows.evaluate import EvaluateConfig, evaluate_flow
from flows.reference_stats import ReferenceStatsFlowParams, reference_stats_flow
from tasks.shared.features.config import ModelSpec, RuntimeConfig
from tasks.shared.features.decode import decode_rgb
from tasks.shared.features import registry
from tasks.shared.features.registry import load_model
from tasks.stats.config import MetricsConfig, SampleConfig
from tasks.stats.evaluate import ProtocolMismatch
from tasks.stats.reference import stats_path
from tasks.stats.stage import STATS_SUBSET, reference_stats_stage
from tests.staging_files import write_staging_shard

pytestmark = pytest.mark.timeout(300)

SPEC = ModelSpec(name="dinov2", arch="vit_small_patch14_dinov2", random_init=True, image_size=28)
MODEL_ID = SPEC.model_id
METRICS = MetricsConfig(k=2, mmd_subsets=3, mmd_subset_size=5, prdc_max_samples=None)


def picture(seed: int, size=(48, 36)) -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def build_corpus(root) -> Store:
    """3 staging shards of 10 images in one manifest part: test, val and tiered train records."""
    store = Store(str(root))
    splits = ["test", "test", "val", "train", "train", "test", "train", "val", "test", "train"]
    manifest = []
    for s in range(3):
        shard = f"{s:06d}"
        samples, recs = [], []
        for j in range(10):
            i = s * 10 + j
            key = f"img{i:04d}"
            data = picture(i)
            samples.append(Sample(key, {"png": data, "txt": b"a caption", "json": b"{}"}))
            recs.append({"key": key, "part": 0, "row": i, "sha256": hashlib.sha256(data).hexdigest(), "width": 48,
                         "height": 36, "ext": "png", "bytes": len(data)})
            split = splits[(i * 7) % 10]
            manifest.append({"key": key, "part": 0, "row": i, "status": "kept", "staging_shard": shard,
                             "split": split, "tier": ("nano", "lite", "full")[i % 3] if split == "train" else None})
        write_staging_shard(store, shard, recs, samples)
    store.write_parquet(manifest_path(0), pa.Table.from_pylist(manifest, schema=MANIFEST_SCHEMA))
    return store


def ref_config(store: Store, dask: DaskConfig) -> ReferenceStatsFlowParams:
    return ReferenceStatsFlowParams(corpus=store.root, splits=["test"], oracle=True, test_subset=5, model=SPEC,
                                runtime=RuntimeConfig(batch_size=8), sample=SampleConfig(max_rows=50),
                                metrics=METRICS, dask=dask)


@pytest.fixture(scope="module")
def built(tmp_path_factory, prefect_server) -> tuple[Store, dict]:
    store = build_corpus(tmp_path_factory.mktemp("corpus"))
    result = reference_stats_flow(ref_config(store, DaskConfig(n_workers=2, processes=True)))
    return store, result


def test_reference_stats_equal_numpy_on_the_stored_features(built):
    store, result = built
    rows = {}
    for shard in ("000000", "000001", "000002"):  # the groups' records only (the oracle's: all of them)
        keys, feats = read_shard_features(store, MODEL_ID, shard, STATS_SUBSET)
        rows.update(zip(keys, feats.astype(np.float64), strict=True))
    manifest = store.read_parquet(manifest_path(0)).to_pylist()
    test = np.stack([rows[r["key"]] for r in manifest if r["split"] == "test"])
    with np.load(io.BytesIO(store.read_bytes(stats_path("test", MODEL_ID) + ".npz"))) as npz:
        np.testing.assert_allclose(npz["mu"], test.mean(0), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(npz["sigma"], np.cov(test, rowvar=False), rtol=1e-8, atol=1e-10)
        assert int(npz["n"]) == len(test) == result["n"]["test"]
    side = store.read_json(stats_path("test", MODEL_ID) + ".json")
    assert side["model"]["arch"] == "vit_small_patch14_dinov2" and side["random_init"] is True
    assert side["feature_dtype"] == "float32" and side["preprocessing"] == "gpic_eval"
    assert side["n"] == len(test) and side["subsample"]["rows"] == len(test)
    assert any("RANDOM-INIT" in d for d in side["protocol_deviations"])
    oracle = store.read_json("stats/oracle.json")
    assert set(oracle["pairs"]) == {"val", "train_nano", "train_lite", "train_full", "test_subset"}
    assert oracle["pairs"]["test_subset"]["n"] == 5
    for pair in oracle["pairs"].values():
        assert pair["fd"] == pytest.approx(pair["fd_mu"] + pair["fd_sigma"])


def test_rerun_on_one_threaded_worker_gives_identical_files(built):
    store, _ = built
    names = [stats_path(g, MODEL_ID) + ext for g in ("test", "val", "train_nano", "test_subset")
             for ext in (".npz", ".features.npy", ".json")] + ["stats/oracle.json"]
    before = {n: store.read_bytes(n) for n in names}
    result = reference_stats_flow(ref_config(store, DaskConfig(n_workers=1, processes=False)))
    assert result["extraction"]["models"][MODEL_ID]["skipped"] == 3
    assert before == {n: store.read_bytes(n) for n in names}


def test_statistics_of_one_split_embed_only_its_records_and_reuse_full_features(tmp_path):
    """Test-split statistics embed the test records alone (ranged reads into the stats
    subset); with features of every image already there (same fingerprint) they embed
    nothing, and both ways give the same statistics."""
    store = build_corpus(tmp_path / "subset")
    manifest = store.read_parquet(manifest_path(0)).to_pylist()
    test_keys = {r["key"] for r in manifest if r["split"] == "test"}
    config = ref_config(store, DaskConfig()).model_copy(update={"oracle": False})
    result = reference_stats_stage(store, config)
    assert result["extraction"]["images"] == len(test_keys) < len(manifest)
    assert result["extraction"]["models"][MODEL_ID]["computed"] == 3
    embedded = {k for s in ("000000", "000001", "000002")
                for k in read_shard_features(store, MODEL_ID, s, STATS_SUBSET)[0]}
    assert embedded == test_keys
    assert not store.exists(f"features/{MODEL_ID}/vectors/000000.npy")
    again = reference_stats_stage(store, config)
    assert again["extraction"]["models"][MODEL_ID]["skipped"] == 3
    subset_npz = store.read_bytes(stats_path("test", MODEL_ID) + ".npz")

    from tasks.shared.features.extract import extract_features
    extract_features(store, ["000000", "000001", "000002"], config.features())  # every image, same settings
    reused = reference_stats_stage(store, config)
    assert reused["extraction"]["models"][MODEL_ID]["skipped"] == 3 and reused["extraction"]["images"] == len(test_keys)
    assert not store.exists(f"features/{MODEL_ID}/subsets/{STATS_SUBSET}/vectors/000000.npy")  # pruned: unused
    with np.load(io.BytesIO(subset_npz)) as a, np.load(io.BytesIO(store.read_bytes(stats_path("test", MODEL_ID)
                                                                                    + ".npz"))) as b:
        assert int(a["n"]) == int(b["n"]) == len(test_keys)
        np.testing.assert_allclose(a["mu"], b["mu"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a["sigma"], b["sigma"], rtol=1e-4, atol=1e-6)


def write_generated(folder) -> list[bytes]:
    """8 PNG files, and a tar with 4 more plus one broken image."""
    folder.mkdir()
    images = [picture(1000 + i, size=(32, 32)) for i in range(12)]
    for i, data in enumerate(images[:8]):
        (folder / f"g{i:02d}.png").write_bytes(data)
    with tarfile.open(folder / "more.tar", "w") as tar:
        for i, data in enumerate([*images[8:], b"not an image"]):
            info = tarfile.TarInfo(f"s{i}.png")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return images


def test_evaluate_against_an_independent_computation(built, tmp_path):
    store, _ = built
    images = write_generated(tmp_path / "gen")
    cfg = EvaluateConfig(generated=[str(tmp_path / "gen")], reference=store.path(stats_path("test", MODEL_ID) + ".npz"),
                         out=str(tmp_path / "eval"), model=SPEC, runtime=RuntimeConfig(batch_size=8),
                         metrics=METRICS, chunk_size=3,
                         dask=DaskConfig(n_workers=1, threads_per_worker=2, processes=False))
    result = evaluate_flow(cfg)
    model = load_model(SPEC, RuntimeConfig())
    gen = model.embed(np.stack([model.preprocess(decode_rgb(b)) for b in images])).astype(np.float64)
    with np.load(io.BytesIO(store.read_bytes(stats_path("test", MODEL_ID) + ".npz"))) as npz:
        mu, sigma = npz["mu"], npz["sigma"]
    s_gen = np.cov(gen, rowvar=False)
    covmean = scipy.linalg.sqrtm(s_gen @ sigma).real
    diff = gen.mean(0) - mu
    fd = diff @ diff + np.trace(s_gen) + np.trace(sigma) - 2 * np.trace(covmean)
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["metrics"]["fd"] == result["metrics"]["fd"]
    # FD is a difference of terms as large as S = |Δµ|² + tr Σg + tr Σr that cancel to a value
    # near zero here, so a relative tolerance is the wrong test. The flow embeds the images in
    # other batches than this test, so its features differ in their last float32 bits (a few
    # units of 2⁻²⁴ through the network), and sqrtm of these rank-deficient covariances (12
    # images) is accurate to about √ε64 of S: the tolerance is that error bound on S.
    scale = diff @ diff + np.trace(s_gen) + np.trace(sigma)
    atol = scale * (64 * 2.0 ** -24 + 4 * np.sqrt(np.finfo(np.float64).eps))
    assert atol < fd / 10  # still a test: a 10 % error would fail it
    assert saved["metrics"]["fd"] == pytest.approx(fd, rel=0, abs=atol)
    assert saved["generated"]["embedded"] == 12 and saved["generated"]["errors"] == 1
    devs = " | ".join(saved["protocol"]["deviations"])
    assert "only 12 generated images" in devs and "could not be embedded" in devs and "RANDOM-INIT" in devs
    assert {"precision", "recall", "density", "coverage", "mmd2"} <= set(saved["metrics"])
    assert "| fd |" in (tmp_path / "eval" / "report.md").read_text()


def test_evaluate_refuses_another_preprocessing_unless_allowed(built, tmp_path):
    store, _ = built
    write_generated(tmp_path / "gen")
    other = SPEC.model_copy(update={"preprocessing": "dinov2_eval"})
    cfg = EvaluateConfig(generated=[str(tmp_path / "gen")], reference=store.path(stats_path("test", MODEL_ID) + ".npz"),
                         out=str(tmp_path / "eval"), model=other, metrics=METRICS,
                         dask=DaskConfig(n_workers=1, processes=False))
    with pytest.raises(ProtocolMismatch, match="preprocessing"):
        evaluate_flow(cfg)
    assert not (tmp_path / "eval" / "metrics.json").exists()
    result = evaluate_flow(cfg.model_copy(update={"allow_mismatch": True}))
    assert any(d.startswith("MODEL MISMATCH") and "preprocessing" in d for d in result["protocol"]["deviations"])


def test_evaluating_the_same_images_again_embeds_nothing(built, tmp_path):
    """Stage contract of the generated side: a rerun reads every chunk's features back from
    the feature store and writes the same metrics.json; another reference embeds nothing;
    a replaced file re-embeds only its chunk, and the result equals a fresh run's."""
    store, _ = built
    write_generated(tmp_path / "gen")
    cfg = EvaluateConfig(generated=[str(tmp_path / "gen")], reference=store.path(stats_path("test", MODEL_ID) + ".npz"),
                         out=str(tmp_path / "eval"), feature_store=str(tmp_path / "features"), model=SPEC,
                         runtime=RuntimeConfig(batch_size=8), metrics=METRICS, chunk_size=3,
                         dask=DaskConfig(n_workers=1, processes=False))
    first = evaluate_flow(cfg)
    assert first["work"] == {"chunks_embedded": 4, "chunks_reused": 0}  # 3 chunks of files, 1 tar
    metrics = (tmp_path / "eval" / "metrics.json").read_bytes()
    again = evaluate_flow(cfg)
    assert again["work"] == {"chunks_embedded": 0, "chunks_reused": 4}
    assert (tmp_path / "eval" / "metrics.json").read_bytes() == metrics
    val = evaluate_flow(cfg.model_copy(update={"out": str(tmp_path / "vs-val"),
                                               "reference": store.path(stats_path("val", MODEL_ID) + ".npz")}))
    assert val["work"] == {"chunks_embedded": 0, "chunks_reused": 4}
    assert val["reference"]["path"].endswith(stats_path("val", MODEL_ID) + ".npz")

    # touched, not changed: the stamps differ, the contents do not; nothing is embedded and
    # no model is even built (the tasks run in this process: its registry is the workers')
    for name in ("g04.png", "more.tar"):
        os.utime(tmp_path / "gen" / name, (1_000_000_000, 1_000_000_000))
    registry.clear_cache()
    touched = evaluate_flow(cfg)
    assert touched["work"] == {"chunks_embedded": 0, "chunks_reused": 4}
    assert registry.cached_models() == []
    assert (tmp_path / "eval" / "metrics.json").read_bytes() == metrics

    (tmp_path / "gen" / "g04.png").write_bytes(picture(7, size=(40, 30)))  # chunk 2 of the files changes
    changed = evaluate_flow(cfg)
    assert changed["work"] == {"chunks_embedded": 1, "chunks_reused": 3}
    assert changed["metrics"]["fd"] != first["metrics"]["fd"]
    fresh = evaluate_flow(cfg.model_copy(update={"out": str(tmp_path / "fresh"), "feature_store": None}))
    assert fresh["work"]["chunks_reused"] == 0 and (tmp_path / "fresh" / "features" / MODEL_ID).is_dir()
    assert (tmp_path / "eval" / "metrics.json").read_bytes() == (tmp_path / "fresh" / "metrics.json").read_bytes()


def test_evaluate_preflight_refuses_a_feature_store_it_cannot_write(tmp_path):
    from flows.evaluate import preflight
    from flows.preflight import UserError

    write_generated(tmp_path / "gen")
    (tmp_path / "ref.npz").write_bytes(b"")
    (tmp_path / "a-file").write_bytes(b"")
    cfg = EvaluateConfig(generated=[str(tmp_path / "gen")], reference=str(tmp_path / "ref.npz"),
                         out=str(tmp_path / "eval"), feature_store=str(tmp_path / "a-file" / "features"), model=SPEC)
    with pytest.raises(UserError, match="feature store"):
        preflight(cfg)
    preflight(cfg.model_copy(update={"feature_store": str(tmp_path / "features")}))
