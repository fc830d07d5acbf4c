"""GPIC's release layout and the loaders people use (issue 13, items 1, 2).

One small mixed-format corpus (JPEG, PNG, WebP) built in both layouts; Hugging Face
``datasets`` (webdataset builder) and the ``webdataset`` library read the shards as they
are, every sample with its image, caption and JSON."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image

from tasks.release.files import GPIC_JSON_FIELDS
from flows.build_corpus import BuildConfig, run_build
from tasks.release.splits import SplitConfig
from tests.gpic_data import mixed_folder, read_tar
from tests.old_release import assert_release_equals_old

pytestmark = [pytest.mark.timeout(600)]

N = 24


def build(source: Path, out: Path, **splits) -> dict:
    return run_build(BuildConfig.model_validate({
        "source": str(source), "out": str(out), "input": {"partition_size": 12}, "staging": {"shard_size": 8},
        "features": {"models": []}, "near_dedup": None, "validation": {"min_side": 16},
        "splits": {"shard_size": 4, "val": 4, "test": 4, **splits}, "dask": {"n_workers": 1, "processes": False}}))


def manifest(out: Path) -> dict[str, dict]:
    return {r["key"]: r for r in ds.dataset(out / "manifest", format="parquet").to_table().to_pylist()}


def source_image(src: Path, key: str) -> Path:
    return next(p for p in src.glob(f"{key}.*") if p.suffix in (".jpg", ".png", ".webp"))


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, prefect_server):
    root = tmp_path_factory.mktemp("gpic_layout")
    src = mixed_folder(root / "src", N)
    built = {}
    for name, splits in {"gpic": {"layout": "gpic", "image_format": "auto"},
                         "default": {"image_format": "auto"},
                         "gpic_source": {"layout": "gpic"},
                         "default_source": {}}.items():
        result = build(src, root / name, **splits)
        built[name] = (root / name, result)
    return src, built


def test_gpic_layout_names_order_and_json(corpora):
    src, built = corpora
    out, _ = built["gpic_source"]
    files = sorted(p.relative_to(out / "shards").as_posix() for p in (out / "shards").rglob("*") if p.is_file())
    tars = [f for f in files if f != "README.md"]  # the dataset card (tasks/release/release_card.py)
    assert tars and all(t.endswith(".tar") for t in tars), files  # markers live under _markers/, not here
    assert {t.split("/")[0] for t in tars} == {"train", "val", "test"}
    for t in tars:
        split, name = t.split("/")
        assert name.startswith(f"gpic_{split}_") and len(name) == len(f"gpic_{split}_00000.tar")
    assert "train/gpic_train_00000.tar" in tars
    assert (out / "_markers" / "shards" / "train" / "gpic_train_00000.tar.json").exists()
    rows = manifest(out)
    seen = set()
    for t in tars:
        split = t.split("/")[0]
        names = read_tar(out / "shards" / t)
        assert len(names) % 2 == 0
        for (json_name, raw), (image_name, image) in zip(names[::2], names[1::2]):
            key, ext = image_name.split(".")
            assert json_name == f"{key}.json" and ext in ("jpg", "png")  # JSON first, GPIC's two formats
            meta = json.loads(raw)
            assert list(meta) == list(GPIC_JSON_FIELDS)
            assert all(isinstance(meta[f], str) for f in GPIC_JSON_FIELDS if f not in ("img_width", "img_height",
                                                                                        "split"))
            assert isinstance(meta["img_width"], int) and isinstance(meta["img_height"], int)
            assert isinstance(meta["split"], list) and all(isinstance(x, str) for x in meta["split"])
            row = rows[key]
            assert meta["key"] == key and row["split"] == split and row["shard"] == t.split("/")[1][:-4]
            assert (meta["img_width"], meta["img_height"]) == (row["width"], row["height"])
            assert meta["caption"] == (src / f"{key}.txt").read_text()
            assert meta["caption_type"] and meta["license"] == "cc-by-4.0"
            if split == "train":
                assert "full" in meta["split"] and (row["tier"] in meta["split"])
            else:
                assert meta["split"] == []
            original = source_image(src, key)
            if original.suffix == ".webp":  # GPIC has no WebP: lossless PNG, recorded
                assert ext == "png" and row["image_encoding"] == "png_lossless" and row["release_ext"] == "png"
                assert np.array_equal(np.asarray(Image.open(io.BytesIO(image))),
                                      np.asarray(Image.open(original).convert("RGB")))
            else:  # JPEG and PNG are copied byte for byte
                assert image == original.read_bytes() and row["image_encoding"] == "copied"
            seen.add(key)
    assert seen == {k for k, r in rows.items() if r["status"] == "kept"} and len(seen) == N
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["release"]["layout"] == "gpic"
    assert receipt["release"]["images"]["encodings"] == {"copied": 16, "png_lossless": 8}
    assert "mix jpg, png" in receipt["release"]["loaders"]
    assert "Layout `gpic`" in (out / "report.md").read_text()


def test_tiers_in_gpic_json_are_shard_prefixes(corpora):
    _, built = corpora
    out, _ = built["gpic"]
    receipt = json.loads((out / "receipt.json").read_text())
    counts = dict(receipt["release"]["tiers"])
    for tar in sorted((out / "shards" / "train").glob("*.tar")):
        index = int(tar.stem.rsplit("_", 1)[1])
        for name, raw in read_tar(tar)[::2]:
            tiers = json.loads(raw)["split"]
            assert tiers == [t for t, n in receipt["release"]["tiers"] if index < n], (tar.name, tiers)
    assert counts["full"] == receipt["release"]["splits"]["train"]["shards"]


@pytest.mark.parametrize("layout", ["gpic", "default"])
def test_huggingface_datasets_loads_every_split(corpora, layout):
    from datasets import load_dataset

    src, built = corpora
    out, _ = built[layout]
    keys = set()
    for split in ("train", "val", "test"):
        files = sorted(str(p) for p in (out / "shards" / split).glob("*.tar"))
        data = load_dataset("webdataset", data_files={split: files}, split=split,
                            cache_dir=str(out.parent / "hf_cache" / layout))
        for sample in data:
            image_field = "png" if "png" in sample else "jpg"
            assert isinstance(sample[image_field], Image.Image), sample.keys()
            meta = sample["json"]
            caption = meta["caption"] if layout == "gpic" else sample["txt"]
            assert caption == (src / f"{sample['__key__']}.txt").read_text()
            keys.add(sample["__key__"])
    assert len(keys) == N


@pytest.mark.parametrize("layout", ["gpic", "default", "gpic_source", "default_source"])
def test_huggingface_loads_the_shards_folder_with_its_card(corpora, layout):
    """``load_dataset("OUT/shards")``: the dataset card names the splits and the features,
    so every layout loads, mixed image formats included (one column per extension)."""
    from datasets import load_dataset

    src, built = corpora
    out, _ = built[layout]
    data = load_dataset(str(out / "shards"), cache_dir=str(out.parent / "hf_cache_all" / layout))
    assert set(data) == {"train", "validation", "test"}
    exts = [e for e in ("jpg", "png", "webp") if e in data["train"].features]
    keys = set()
    for split in data.values():
        for s in split:
            assert s["json"]["key"] == s["__key__"]
            images = [s[e] for e in exts if s[e] is not None]
            assert len(images) == 1 and isinstance(images[0], Image.Image)
            caption = s["json"]["caption"] if layout.startswith("gpic") else s["txt"]
            assert caption == (src / f"{s['__key__']}.txt").read_text()
            keys.add(s["__key__"])
    assert len(keys) == N
    assert (len(exts) > 1) == layout.endswith("source")


@pytest.mark.parametrize("layout", ["gpic", "default"])
def test_webdataset_library_decodes_every_sample(corpora, layout):
    src, built = corpora
    out, _ = built[layout]
    tars = sorted(str(p) for p in (out / "shards").rglob("*.tar"))
    keys = set()
    for sample in wds.WebDataset(tars, shardshuffle=False).decode("pil"):
        image = sample.get("png", sample.get("jpg"))
        assert isinstance(image, Image.Image)
        meta = sample["json"]
        caption = meta["caption"] if layout == "gpic" else sample["txt"]
        assert caption == (src / f"{sample['__key__']}.txt").read_text()
        keys.add(sample["__key__"])
    assert len(keys) == N


def test_auto_gives_one_image_extension_losslessly(corpora):
    src, built = corpora
    for name in ("gpic", "default"):
        out, _ = built[name]
        rows = [r for r in manifest(out).values() if r["status"] == "kept"]
        assert {r["release_ext"] for r in rows} == {"png"}
        receipt = json.loads((out / "receipt.json").read_text())
        assert receipt["release"]["images"]["rule"] == "png" and "loadable" in receipt["release"]["loaders"]
        tar = min((out / "shards" / "test").glob("*.tar"))
        for member, data in read_tar(tar):
            if member.endswith(".png"):
                original = source_image(src, member.split(".")[0])
                assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))),
                                      np.asarray(Image.open(original).convert("RGB")))


def test_default_source_keeps_bytes_and_says_loaders_refuse(corpora):
    _, built = corpora
    out, _ = built["default_source"]
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["release"]["images"]["encodings"] == {"copied": N}
    assert "refuses" in receipt["release"]["loaders"]
    names = [m for tar in (out / "shards").rglob("*.tar") for m, _ in read_tar(tar)]
    assert names[0].endswith((".jpg", ".png", ".webp")) and names[2].endswith(".json")  # default order kept


@pytest.mark.parametrize("name", ["gpic", "default", "gpic_source", "default_source"])
def test_release_equals_the_old_implementation(corpora, tmp_path, name):
    """Both layouts and image rules: the columnar planner and the span-reading writers
    write the old code's release tars, late facts and summary byte for byte."""
    _, built = corpora
    out, _ = built[name]
    staged = sorted(p.stem for p in (out / "staging" / "records").glob("*.parquet"))
    splits = json.loads((out / "receipt.json").read_text())["config"]["splits"]
    assert_release_equals_old(out, staged, SplitConfig.model_validate(splits), False, tmp_path)


def test_rerun_skips_and_layout_switch_equals_fresh_build(corpora, tmp_path):
    """Stage contract: an unchanged rerun computes no release shard; switching an existing
    default-layout output to gpic equals a fresh gpic build byte for byte (old tars pruned)."""
    src, built = corpora
    fresh, _ = built["gpic_source"]
    again = build(src, fresh, layout="gpic")
    assert again["work"]["publish"]["release_shards"]["computed"] == 0
    switched = tmp_path / "switched"
    build(src, switched)
    build(src, switched, layout="gpic")
    outputs = [pq.read_table(o / json.loads((o / "receipt.json").read_text())["outputs"]["list"]).to_pylist()
               for o in (fresh, switched)]
    assert outputs[0] == outputs[1]
    assert not list((switched / "shards").rglob("train-*.tar"))
    assert not list((switched / "_markers" / "shards").rglob("train-*"))
