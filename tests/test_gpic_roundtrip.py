"""GPIC release tars as input, and GPIC's fixed numbers (issue 13, items 3, 4).

A synthetic GPIC-format release made here is read → built → written in the ``gpic``
layout with ``preset: gpic``: member order, names and JSON follow GPIC's conventions,
the source tiers and caption types reach the manifest, and the new tiers are train-shard
prefixes of the stated sizes."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest
from pydantic import ValidationError

from tasks.release.files import GPIC_JSON_FIELDS
from flows.build_corpus import BuildConfig, run_build
from tasks.release.splits import (
    GPIC_TEST,
    GPIC_TOTAL,
    GPIC_VAL,
    SplitConfig,
    held_out_sizes,
    tier_counts,
)
from tests.gpic_data import gpic_release, read_tar

pytestmark = [pytest.mark.timeout(600)]

TIERS = {"nano": 1, "lite": 2, "full": 8000}


@pytest.fixture(scope="module")
def roundtrip(tmp_path_factory, prefect_server):
    root = tmp_path_factory.mktemp("gpic_roundtrip")
    source = gpic_release(root / "gpic", train_shards=3, per_shard=4)
    out = root / "out"
    result = run_build(BuildConfig.model_validate({
        "source": str(source), "out": str(out), "features": {"models": []}, "near_dedup": None,
        "validation": {"min_side": 16}, "staging": {"shard_size": 8},
        "splits": {"layout": "gpic", "preset": "gpic", "shard_size": 4, "tiers": TIERS},
        "dask": {"n_workers": 1, "processes": False}}))
    inputs = {}
    for tar in sorted(source.rglob("*.tar")):
        members = read_tar(tar)
        for (json_name, raw), (image_name, image) in zip(members[::2], members[1::2]):
            meta = json.loads(raw)
            inputs[meta["key"]] = (tar.parent.name, meta, image_name.split(".")[1], image)
    return out, result, inputs


def test_gpic_tars_are_read_with_tiers_and_caption_types(roundtrip):
    out, _, inputs = roundtrip
    rows = {r["key"]: r for r in ds.dataset(out / "manifest", format="parquet").to_table().to_pylist()}
    assert set(rows) == set(inputs) and all(r["status"] == "kept" for r in rows.values())
    for key, (split, meta, ext, _) in inputs.items():
        row = rows[key]
        assert row["source_split"] == split and row["caption_type"] == meta["caption_type"]
        assert row["source_tiers"] == ",".join(meta["split"])
        assert row["source_path"].endswith(f"/{split}/{row['source_path'].split('/')[-1]}")
        assert row["license"] == meta["license"]


def test_written_in_gpic_layout_equals_gpic_conventions(roundtrip):
    out, _, inputs = roundtrip
    seen = set()
    for tar in sorted((out / "shards").rglob("*.tar")):
        split = tar.parent.name
        assert tar.name == f"gpic_{split}_{int(tar.stem.rsplit('_', 1)[1]):05d}.tar"
        members = read_tar(tar)
        for (json_name, raw), (image_name, image) in zip(members[::2], members[1::2]):
            key = json_name[:-len(".json")]
            _, source_meta, source_ext, source_image = inputs[key]
            assert image_name == f"{key}.{source_ext}" and image == source_image  # jpg/png copied as they are
            meta = json.loads(raw)
            assert list(meta) == list(GPIC_JSON_FIELDS)
            assert {f: meta[f] for f in GPIC_JSON_FIELDS if f != "split"} == \
                {f: source_meta[f] for f in GPIC_JSON_FIELDS if f != "split"}
            seen.add(key)
    assert seen == set(inputs)


def test_tiers_are_shard_prefixes_of_the_stated_sizes(roundtrip):
    out, _, _ = roundtrip
    receipt = json.loads((out / "receipt.json").read_text())
    release = receipt["release"]
    n_train = release["splits"]["train"]["shards"]
    assert n_train == 5  # 18 train samples / 4 per shard
    assert release["tiers"] == [["nano", 1], ["lite", 2], ["full", n_train]]  # fixed counts, not proportions
    for tar in sorted((out / "shards" / "train").glob("*.tar")):
        index = int(tar.stem.rsplit("_", 1)[1])
        for _, raw in read_tar(tar)[::2]:
            assert json.loads(raw)["split"] == [t for t, n in (("nano", 1), ("lite", 2), ("full", n_train))
                                                if index < n]
    for split in ("val", "test"):
        assert release["splits"][split]["samples"] == 1
    assert release["split_rule"].startswith("gpic: val 1, test 1 of 20") and "scaled" in release["split_rule"]
    assert "Split rule: gpic" in (out / "report.md").read_text()


def test_gpic_preset_numbers():
    cfg = SplitConfig(preset="gpic")
    assert held_out_sizes(GPIC_TOTAL, cfg)[:2] == (GPIC_VAL, GPIC_TEST)
    assert held_out_sizes(3 * GPIC_TOTAL, cfg)[:2] == (GPIC_VAL, GPIC_TEST)  # capped at GPIC's counts
    val, test, rule = held_out_sizes(GPIC_TOTAL // 10, cfg)
    assert (val, test) == (20_000, 100_000) and "scaled" in rule
    assert held_out_sizes(10, cfg)[:2] == (1, 1)
    assert tier_counts(8000, cfg.tiers, fixed=True) == [("nano", 80), ("lite", 800), ("full", 8000)]
    assert tier_counts(100, cfg.tiers, fixed=True) == [("nano", 80), ("lite", 100), ("full", 100)]
    assert tier_counts(100, cfg.tiers) == [("nano", 1), ("lite", 10), ("full", 100)]  # default unchanged
    assert held_out_sizes(1000, SplitConfig())[:2] == (50, 100)
    assert held_out_sizes(1000, SplitConfig())[2].startswith("default:")
    with pytest.raises(ValidationError, match="preset 'gpic' fixes val and test"):
        SplitConfig(preset="gpic", val=0.1)


@pytest.mark.s3
def test_gpic_release_read_from_s3_streaming(tmp_path, s3):
    """A GPIC release root on an object store: detected, split folders in GPIC's order,
    every sample streamed with its tiers, caption and caption type."""
    import s3fs

    from corpusforge.storage import Store
    from tasks.ingest.partition import ingest_partition
    from tasks.ingest.sources import SourceConfig, cut_partitions
    from tasks.shared.validate import ValidationConfig

    local = gpic_release(tmp_path / "gpic", train_shards=2, per_shard=3)
    fs = s3fs.S3FileSystem(**s3)
    fs.mkdir("gpic-input")
    fs.put(str(local), "gpic-input/release", recursive=True)
    cfg = SourceConfig(storage_options=s3)
    kind, parts = cut_partitions("s3://gpic-input/release", Store(str(tmp_path / "out")), cfg)
    assert kind == "tars"
    assert [p.uri.split("release/", 1)[1] for p in parts] == [
        "train/gpic_train_00000.tar", "train/gpic_train_00001.tar", "val/gpic_val_00000.tar",
        "test/gpic_test_00000.tar"]
    store = Store(str(tmp_path / "out"))
    rows = []
    for p in parts:
        ingest_partition(store, p, cfg, ValidationConfig(min_side=16), n_buckets=1)
        rows += store.read_parquet(f"work/ingest/{p.index:06d}.parquet").to_pylist()
    assert len(rows) == 12 and all(r["status"] == "kept" for r in rows)
    by_key = {r["key"]: r for r in rows}
    assert by_key["g00000"]["source_tiers"] == "nano,lite,full" and by_key["g00003"]["source_tiers"] == "lite,full"
    assert by_key["g00006"]["source_split"] == "val" and by_key["g00006"]["source_tiers"] == ""
    assert by_key["g00001"]["caption"] == "gpic caption 1" and by_key["g00001"]["caption_type"] == "short"
