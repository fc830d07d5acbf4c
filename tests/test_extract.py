"""The feature stage on real staging shards: decode, extract, resume, invalidation, Dask.

Staging shards are written here with the ground floor's ``write_tar`` and index, from
tiny generated images, with their records file and staging marker (the stage contract);
features are read back only through ``corpusforge.feature_files``.
"""

from __future__ import annotations

import hashlib
import io
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

import tasks.shared.features.extract as extract_module
from corpusforge.contract import completed_units, marker_path, read_marker
from corpusforge.feature_files import read_shard_errors, read_shard_features
from corpusforge.layout import STAGING_TARS, feature_keys, feature_vectors, staging_index, staging_records, staging_tar
from corpusforge.storage import Store
from corpusforge.tarshard import Sample
from tasks.shared.features.content import model_input
from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig
from tasks.shared.features.decode import DecodeError, decode_rgb
from tasks.shared.features.extract import (decode_size, extract_shard, feature_fingerprint,
                                           load_models, receipt_section)
from tests.staging_files import write_staging_shard

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.timeout(180)

def _picture(seed: int, size: tuple[int, int] = (72, 56)) -> Image.Image:
    """A smooth random picture (low-frequency structure, like a photo at thumbnail size)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(5, 6, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)


def _encode(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
    return buf.getvalue()


FORMATS = (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"))


def _stage(store: Store, shard: str, images: list[tuple[str, str, bytes, tuple[int, int]]]) -> list[str]:
    """Write one staging shard as the staging stage does: tar, index, records file, then
    its marker (``info.images`` is what the feature stage's fingerprint reads)."""
    samples, records = [], []
    for i, (key, ext, data, (w, h)) in enumerate(images):
        samples.append(Sample(key, {ext: data, "txt": f"caption {i}".encode(), "json": b"{}"}))
        records.append({"key": key, "part": 0, "row": i, "sha256": hashlib.sha256(data).hexdigest(), "width": w,
                        "height": h, "source": "test", "caption_type": "short", "ext": ext, "bytes": len(data)})
    write_staging_shard(store, shard, records, samples)
    return [key for key, *_ in images]


def _write_staging(store: Store, shard: str, seeds: list[int], corrupt: set[int] = frozenset()) -> list[str]:
    images = []
    for seed in seeds:
        fmt, ext = FORMATS[seed % 3]
        picture = _picture(seed)
        data = _encode(picture, fmt)
        if seed in corrupt:
            data = data[: len(data) // 3]
        images.append((f"k{seed:05d}", ext, data, picture.size))
    return _stage(store, shard, images)


def two_shard_corpus(root) -> Store:
    """Two staging shards of 11 and 9 images under ``root/corpus``; image 4 is cut short."""
    store = Store(str(root / "corpus"))
    _write_staging(store, "000000", list(range(0, 11)), corrupt={4})
    _write_staging(store, "000001", list(range(11, 20)))
    return store


@pytest.fixture()
def corpus(tmp_path) -> Store:
    return two_shard_corpus(tmp_path)


def _cfg(**runtime) -> FeaturesConfig:
    return FeaturesConfig(models=[ModelSpec(name="wfd")], runtime=RuntimeConfig(**{"batch_size": 4, **runtime}))


def _files(store: Store, model_id: str, shard: str) -> tuple[bytes, bytes]:
    return store.read_bytes(feature_vectors(model_id, shard)), store.read_bytes(feature_keys(model_id, shard))


# ---- decode ----------------------------------------------------------------------------

def test_decode_formats_modes_and_orientation():
    picture = _picture(1, (40, 30))
    for fmt, _ in FORMATS:
        out = decode_rgb(_encode(picture, fmt))
        assert out.mode == "RGB" and out.size == (40, 30)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    buf = io.BytesIO()
    picture.save(buf, "JPEG", exif=exif)
    assert decode_rgb(buf.getvalue()).size == (30, 40)
    cmyk = decode_rgb(_encode(picture.convert("CMYK"), "JPEG"))
    assert cmyk.mode == "RGB" and np.abs(np.asarray(cmyk, int) - np.asarray(picture, int)).mean() < 12
    grey16 = Image.fromarray((np.arange(40 * 30, dtype=np.uint16).reshape(30, 40) * 50))
    assert decode_rgb(_encode(grey16, "PNG")).mode == "RGB"


def test_decode_composites_transparency_over_white():
    rgba = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (0, 0, 255, 255))
    out = np.asarray(decode_rgb(_encode(rgba, "PNG")))
    assert tuple(out[0, 0]) == (0, 0, 255) and tuple(out[4, 4]) == (255, 255, 255)
    palette = rgba.convert("P")
    palette.info["transparency"] = palette.getpixel((4, 4))
    assert tuple(np.asarray(decode_rgb(_encode(palette, "PNG")))[4, 4]) == (255, 255, 255)


def test_decode_errors_are_clear():
    jpeg = _encode(_picture(2), "JPEG")
    with pytest.raises(DecodeError, match="corrupt or truncated"):
        decode_rgb(jpeg[: len(jpeg) // 2])
    with pytest.raises(DecodeError, match="not a JPEG, PNG or WEBP"):
        decode_rgb(_encode(_picture(2), "GIF"))
    with pytest.raises(DecodeError, match="not a JPEG, PNG or WEBP") as first:
        decode_rgb(b"definitely not an image")
    with pytest.raises(DecodeError) as second:  # the reason goes into outputs: the same every time
        decode_rgb(b"definitely not an image")
    assert str(first.value) == str(second.value) and " at 0x" not in str(first.value)
    with pytest.raises(DecodeError, match="empty"):
        decode_rgb(b"")
    with pytest.raises(DecodeError, match="decompression bomb guard"):
        decode_rgb(jpeg, max_pixels=100)


def test_decode_bomb_is_refused_from_the_header():
    """A PNG declaring 30,000 x 30,000 pixels is refused without inflating its data."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", 30_000, 30_000, 8, 0, 0, 0, 0)
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
           + chunk(b"IEND", b""))
    with pytest.raises(DecodeError, match="decompression bomb guard"):
        decode_rgb(png)


def test_decode_draft_shrinks_jpeg_but_not_below_the_request():
    jpeg = _encode(_picture(3, (512, 384)), "JPEG")
    assert decode_rgb(jpeg).size == (512, 384)
    small = decode_rgb(jpeg, draft_size=64)
    assert small.size == (128, 96)  # JPEG scale 1/4: the largest that keeps both sides >= 64
    assert decode_rgb(jpeg, draft_size=300).size == (512, 384)


# ---- extraction --------------------------------------------------------------------------

def test_extract_shard_matches_direct_computation(corpus):
    cfg = _cfg()
    result = extract_shard(corpus, "000001", cfg)
    (model,) = load_models(cfg)
    assert result.info["models"]["wfd"] == {"action": "computed", "ok": 9, "errors": 0, "random_init": False,
                                       "dim": 1072, "fingerprint": model.fingerprint(), "subset": None}
    keys, feats = read_shard_features(corpus, "wfd", "000001")
    assert keys == [f"k{s:05d}" for s in range(11, 20)] and feats.dtype == np.float16
    draft = decode_size([model])
    index = corpus.read_parquet(staging_index("000001")).to_pylist()
    images = [decode_rgb(corpus.read_range(staging_tar("000001"), r["offset"], r["size"]), draft)
              for r in index if r["ext"] in ("jpg", "png", "webp")]
    direct = model.embed(np.stack([model_input(model, im) for im in images])).astype(np.float16)
    assert feats.tobytes() == direct.tobytes()
    marker = read_marker(corpus, feature_vectors("wfd", "000001"))
    staged = read_marker(corpus, staging_tar("000001"))
    assert marker.fingerprint == feature_fingerprint(model, "float16", draft, "fp32", staged.info["images"])
    assert marker.outputs == {p: corpus.sha256(p) for p in (feature_vectors("wfd", "000001"),
                                                              feature_keys("wfd", "000001"))}
    info = marker.info
    assert info["dtype"] == "float16" and info["count"] == 9 and info["dim"] == 1072
    assert info["model"]["preprocessing"] == model.preprocessing and info["random_init"] is False
    keys_table = corpus.read_parquet(feature_keys("wfd", "000001"))
    assert keys_table["sha256"].to_pylist() == corpus.read_parquet(staging_records("000001"))["sha256"].to_pylist()


def test_corrupt_image_is_a_record_error_and_the_shard_completes(corpus):
    result = extract_shard(corpus, "000000", _cfg())
    assert result.info["models"]["wfd"]["ok"] == 10 and result.info["models"]["wfd"]["errors"] == 1
    keys, feats = read_shard_features(corpus, "wfd", "000000")
    assert "k00004" not in keys and len(keys) == feats.shape[0] == 10
    errors = read_shard_errors(corpus, "wfd", "000000")
    assert list(errors) == ["k00004"] and errors["k00004"].startswith("decode: corrupt or truncated image")
    table = pq.read_table(corpus.path(feature_keys("wfd", "000000")))
    assert table["key"].to_pylist() == [f"k{s:05d}" for s in range(11)]


def test_prefetch_threads_do_not_change_a_bit(corpus, tmp_path):
    extract_shard(corpus, "000000", _cfg(prefetch_threads=0))
    inline = _files(corpus, "wfd", "000000")
    other = Store(str(tmp_path / "other"))
    _write_staging(other, "000000", list(range(0, 11)), corrupt={4})
    extract_shard(other, "000000", _cfg(prefetch_threads=3, batch_size=3))
    assert _files(other, "wfd", "000000") == inline


def test_resume_skips_done_shards_and_redoes_a_deleted_one(corpus):
    cfg = _cfg()
    shards = completed_units(corpus, STAGING_TARS, ".tar")
    assert shards == ["000000", "000001"]
    first = [extract_shard(corpus, s, cfg) for s in shards]
    assert {r.info["models"]["wfd"]["action"] for r in first} == {"computed"}
    before = {s: _files(corpus, "wfd", s) for s in shards}
    mtime = os.path.getmtime(corpus.path(feature_vectors("wfd", "000000")))
    corpus.remove(marker_path(feature_vectors("wfd", "000001")))
    corpus.remove(feature_vectors("wfd", "000001"))
    second = [extract_shard(corpus, s, cfg) for s in shards]
    assert [r.info["models"]["wfd"]["action"] for r in second] == ["skipped", "computed"]
    assert second[0].info["models"]["wfd"]["ok"] == 10 and second[0].info["models"]["wfd"]["errors"] == 1
    assert os.path.getmtime(corpus.path(feature_vectors("wfd", "000000"))) == mtime
    assert {s: _files(corpus, "wfd", s) for s in shards} == before


def test_changed_dtype_code_or_model_invalidates_only_that_model(corpus, monkeypatch):
    two = FeaturesConfig(models=[ModelSpec(name="wfd"), ModelSpec(name="wfd", image_size=16)],
                         runtime=RuntimeConfig(batch_size=4))
    assert set(extract_shard(corpus, "000001", two).info["models"]) == {"wfd", "wfd_s16"}
    actions = lambda r: {m: v["action"] for m, v in r.info["models"].items()}  # noqa: E731
    assert actions(extract_shard(corpus, "000001", two)) == {"wfd": "skipped", "wfd_s16": "skipped"}

    as32 = two.model_copy(update={"dtype": "float32"})
    assert actions(extract_shard(corpus, "000001", as32)) == {"wfd": "computed", "wfd_s16": "computed"}
    assert read_shard_features(corpus, "wfd", "000001")[1].dtype == np.float32
    assert actions(extract_shard(corpus, "000001", as32)) == {"wfd": "skipped", "wfd_s16": "skipped"}
    # another compute precision gives other values: both models recompute, then skip again
    bf16 = as32.model_copy(update={"runtime": RuntimeConfig(batch_size=4, precision="bf16")})
    assert actions(extract_shard(corpus, "000001", bf16)) == {"wfd": "computed", "wfd_s16": "computed"}
    assert actions(extract_shard(corpus, "000001", as32)) == {"wfd": "computed", "wfd_s16": "computed"}
    # a code change (another hash of the stage's import closure) recomputes both models
    real_code = extract_module.code_version
    monkeypatch.setattr(extract_module, "code_version", lambda *m, **kw: real_code(*m, **kw) + "-edited")
    assert actions(extract_shard(corpus, "000001", as32)) == {"wfd": "computed", "wfd_s16": "computed"}

    # a changed descriptor (new frequency weighting) changes only the models whose fingerprint moves;
    # its edit also moves the configured spec's key, so the markers alone no longer vouch for the
    # units and the loaded models' fingerprints decide
    (model_16,) = [m for m in load_models(two) if m.model_id == "wfd_s16"]
    real = type(model_16).fingerprint
    monkeypatch.setattr(type(model_16), "fingerprint",
                        lambda self: {**real(self), "alpha": 0.75} if self.model_id == "wfd_s16" else real(self))
    real_spec = extract_module.spec_key
    monkeypatch.setattr(extract_module, "spec_key", lambda *a: real_spec(*a) + "-edited")
    assert actions(extract_shard(corpus, "000001", as32)) == {"wfd": "skipped", "wfd_s16": "computed"}


def test_a_current_unit_is_probed_from_its_markers_without_loading_a_model(corpus):
    """The flow's probe of a current shard returns what the unit would, and loads no model;
    a shard whose features another dtype would change stops the probe before any load."""
    from corpusforge.contract import probe
    from tasks.shared.features.registry import cached_models, clear_cache

    cfg = _cfg()
    extract_shard(corpus, "000001", cfg)
    skipped = extract_shard(corpus, "000001", cfg)
    clear_cache()
    assert probe(extract_shard, dict(store=corpus, shard="000001", cfg=cfg)) == (True, skipped)
    assert probe(extract_shard, dict(store=corpus, shard="000001", cfg=cfg.model_copy(update={"dtype": "float32"}))
                 ) == (False, None)
    assert cached_models() == [], "a probe loaded a model"


def test_two_dask_worker_processes_equal_one_process(corpus, tmp_path, local_cluster):
    from distributed import Client

    cfg = _cfg()
    local = [extract_shard(corpus, s, cfg) for s in completed_units(corpus, STAGING_TARS, ".tar")]
    other = Store(str(tmp_path / "dask"))
    _write_staging(other, "000000", list(range(0, 11)), corrupt={4})
    _write_staging(other, "000001", list(range(11, 20)))
    with Client(local_cluster(n_workers=2, threads_per_worker=1)) as client:
        shards = completed_units(other, STAGING_TARS, ".tar")
        remote = client.gather(client.map(extract_shard, [other] * len(shards), shards, [cfg] * len(shards),
                                          pure=False))
        workers = {w["name"] for w in client.scheduler_info()["workers"].values()}
    assert len(workers) == 2
    assert remote == local
    for shard in ("000000", "000001"):
        assert _files(other, "wfd", shard) == _files(corpus, "wfd", shard)
        assert read_marker(other, feature_vectors("wfd", shard)) == read_marker(corpus, feature_vectors("wfd", shard))
    assert receipt_section(remote)["models"]["wfd"]["ok"] == 19


def test_truncated_tar_marks_the_missing_keys(tmp_path):
    store = Store(str(tmp_path / "trunc"))
    keys = _write_staging(store, "000000", list(range(6)))
    data = store.read_bytes(staging_tar("000000"))
    index = store.read_parquet(staging_index("000000")).to_pylist()
    cut = [r for r in index if r["key"] == keys[3]][0]["offset"] - 512
    store.write_bytes(staging_tar("000000"), data[:cut])
    cfg = _cfg().model_copy(update={"max_error_share": 1.0})  # past the error-rate guard
    result = extract_shard(store, "000000", cfg)
    # the sample in progress at a cut may miss members, so it is not embedded either
    assert result.info["models"]["wfd"]["ok"] == 2
    errors = read_shard_errors(store, "wfd", "000000")
    assert sorted(errors) == keys[2:] and all("missing from staging tar" in e for e in errors.values())


def test_tiny_random_init_learned_model_beside_wfd(corpus):
    dino = ModelSpec(name="dinov2", arch="vit_small_patch14_dinov2", preprocessing="dinov2_eval",
                     image_size=28, random_init=True)
    cfg = FeaturesConfig(models=[ModelSpec(name="wfd"), dino], runtime=RuntimeConfig(batch_size=4))
    result = extract_shard(corpus, "000001", cfg)
    assert result.info["models"][dino.model_id]["random_init"] is True
    assert result.info["models"]["wfd"]["random_init"] is False
    models = load_models(cfg)
    draft = decode_size(models)
    assert draft == max(32, 28) * 2
    index = corpus.read_parquet(staging_index("000001")).to_pylist()
    images = [decode_rgb(corpus.read_range(staging_tar("000001"), r["offset"], r["size"]), draft)
              for r in index if r["ext"] in ("jpg", "png", "webp")]
    for model in models:
        keys, feats = read_shard_features(corpus, model.model_id, "000001")
        direct = model.embed(np.stack([model_input(model, im) for im in images]))
        np.testing.assert_allclose(feats.astype(np.float32), direct, atol=2e-3)
        assert len(keys) == 9 and feats.shape == (9, model.dim)
    info = read_marker(corpus, feature_vectors(dino.model_id, "000001")).info
    assert info["random_init"] is True and "random-init" in str(info["model"])
    summary = receipt_section([result])
    assert summary["random_init_models"] == [dino.model_id] and "RANDOM-INIT" in summary["warning"]


def test_flow_runs_on_every_completed_staging_shard(corpus, tmp_path, prefect_server):
    """The flow reports to the session's Prefect server (a fresh temporary server per test
    would migrate a new database and can time out on a busy machine)."""
    from flows.extract_features import ExtractFeaturesConfig, extract_features_flow

    corpus.remove(marker_path(staging_tar("000001")))  # an unfinished staging shard is not touched
    yaml_file = tmp_path / "extract.yaml"
    yaml_file.write_text("features:\n  dtype: float32\n  runtime: {batch_size: 4}\n"
                         "dask: {processes: false, n_workers: 1, threads_per_worker: 2}\n")
    config = ExtractFeaturesConfig.from_yaml(yaml_file, corpus=corpus.root)
    with pytest.raises(ValueError):
        ExtractFeaturesConfig.model_validate({"corpus": corpus.root, "unknown": 1})
    summary = extract_features_flow(config)
    assert summary["shards"] == 1 and summary["random_init_models"] == [] and "warning" not in summary
    fingerprint = load_models(config.features)[0].fingerprint()
    assert summary["models"]["wfd"] == {"shards": 1, "computed": 1, "skipped": 0, "ok": 10, "errors": 1,
                                        "random_init": False, "dim": 1072, "fingerprint": fingerprint}
    assert read_shard_features(corpus, "wfd", "000000")[1].dtype == np.float32
    assert not corpus.exists(feature_vectors("wfd", "000001"))


def test_variable_size_inputs_are_embedded_one_by_one(tmp_path):
    """sscd_short288 keeps the aspect ratio, so its inputs cannot be stacked into batches."""
    store = Store(str(tmp_path / "corpus"))
    sizes = [(80, 60), (60, 90), (120, 50), (70, 70)]
    _stage(store, "000000", [(f"v{i}", "png", _encode(_picture(i, size), "PNG"), size) for i, size in enumerate(sizes)])
    spec = ModelSpec(name="sscd_disc_mixup", preprocessing="sscd_short288", random_init=True)
    cfg = FeaturesConfig(models=[spec], runtime=RuntimeConfig(batch_size=4))
    assert load_models(cfg)[0].fixed_input is False
    result = extract_shard(store, "000000", cfg)
    keys, feats = read_shard_features(store, spec.model_id, "000000")
    assert result.info["models"][spec.model_id]["ok"] == len(keys) == feats.shape[0] == len(sizes)
    np.testing.assert_allclose(np.linalg.norm(feats.astype(np.float32), axis=1), 1.0, atol=2e-3)


def test_the_gpic_protocol_decodes_at_full_resolution():
    """Reduced JPEG decoding would change the pixels the evaluation protocol is defined on."""
    dino = ModelSpec(name="dinov2", arch="vit_small_patch14_dinov2", preprocessing="gpic_eval",
                     image_size=28, random_init=True)
    wfd = ModelSpec(name="wfd")
    assert decode_size(load_models(FeaturesConfig(models=[wfd, dino]))) is None
    assert decode_size(load_models(FeaturesConfig(models=[wfd]))) is not None
