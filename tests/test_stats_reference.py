"""Reference statistics of a built corpus from stored features: groups, shards, files.

The corpus here is the file contract alone (staging records, manifest parts, feature
files written through corpusforge.feature_files), with synthetic features, so numbers are
checked against np.mean / np.cov of exactly the rows each group should hold.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

from corpusforge.feature_files import write_shard_features
from corpusforge.hashing import stable_uniform
from corpusforge.layout import MANIFEST_SCHEMA, STAGING_RECORDS_SCHEMA, manifest_path, staging_records
from corpusforge.storage import Store
from tasks.stats.config import SampleConfig
from tasks.stats.moments import Moments
from tasks.stats.reference import (GroupRule, ManifestScan, batch_partials, merge_partials, oracle_groups,
                                   cut_batches, scan_manifest, shard_partials, stats_path, write_group_stats)

MODEL_ID = "dinov2_vits14_gpic_eval_s28"
IDENTITY = {"model_id": MODEL_ID, "arch": "vit_small_patch14_dinov2", "weights": "random-init",
            "random_init": True, "preprocessing": "gpic_eval", "dim": 6, "normalized": False}
FEATURE_INFO = {"model": IDENTITY, "dtype": "float32", "decode_size": None, "random_init": True}
DIM = 6


def _corpus_rows() -> list[dict]:
    """60 input records in 2 ingest parts; kept ones go to 3 staging shards of 16."""
    rows, kept = [], 0
    rng = np.random.default_rng(5)
    for i in range(60):
        part, row = (0, i) if i < 35 else (1, i - 35)
        r = {"key": f"r{i:03d}", "part": part, "row": row, "status": "kept", "reason": None}
        if i % 7 == 3:
            r.update(status="filtered", reason="too_small")
        else:
            r["staging_shard"] = f"{kept // 16:06d}"
            kept += 1
            split = ("train", "train", "train", "val", "test", "test")[int(rng.integers(0, 6))]
            r["split"] = split
            if split == "train":
                r["tier"] = ("nano", "lite", "full")[i % 3]
        rows.append(r)
    return rows


BROKEN = next(r["key"] for r in _corpus_rows() if r.get("split") == "test")


def write_corpus(store: Store) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Manifest parts, staging records and feature files of the plan above; key -> feature row."""
    rows = _corpus_rows()
    for part in (0, 1):
        table = pa.Table.from_pylist([r for r in rows if r["part"] == part], schema=MANIFEST_SCHEMA)
        store.write_parquet(manifest_path(part), table)
    rng = np.random.default_rng(0)
    feats = {}
    for shard in sorted({r["staging_shard"] for r in rows if r.get("staging_shard")}):
        members = [r for r in rows if r.get("staging_shard") == shard]
        store.write_parquet(staging_records(shard), pa.Table.from_pylist(
            [{"key": r["key"], "part": r["part"], "row": r["row"], "sha256": f"sha-{r['key']}"} for r in members],
            schema=STAGING_RECORDS_SCHEMA))
        ok = [r["key"] != BROKEN for r in members]  # one undecodable test image
        x = (rng.standard_normal((sum(ok), DIM)) * 2.0 + 100.0).astype(np.float32)
        ok_keys = [r["key"] for r, o in zip(members, ok, strict=True) if o]
        feats.update({k: x[i] for i, k in enumerate(ok_keys)})
        write_shard_features(store, MODEL_ID, shard, [r["key"] for r in members],
                             [f"sha-{r['key']}" for r in members], ok,
                             [None if o else "decode: truncated" for o in ok], x, f"fp-{shard}", FEATURE_INFO)
    return rows, feats


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Store, list[dict], dict[str, np.ndarray]]:
    store = Store(str(tmp_path_factory.mktemp("corpus")))
    rows, feats = write_corpus(store)
    return store, rows, feats


def _expected_members(rows, group, rule: GroupRule) -> list[str]:
    return [r["key"] for r in rows if r["status"] == "kept" and group in rule.groups_of(r["key"], r["split"], r.get("tier"))]


GROUPS = ("test", "val", "train", *oracle_groups(("nano", "lite", "full"))[1:])


def test_scan_counts_shards_and_test_subset(corpus):
    store, rows, _ = corpus
    scan = scan_manifest(store, GROUPS, SampleConfig(max_rows=3, seed=2), subset_size=4, subset_seed=3)
    kept = [r for r in rows if r["status"] == "kept"]
    assert scan.shards == ["000000", "000001", "000002", "000003"]  # 52 kept records, 16 per shard
    assert scan.counts["test"] == sum(r["split"] == "test" for r in kept)
    assert scan.counts["train_lite"] == sum(r["split"] == "train" and r["tier"] in ("nano", "lite") for r in kept)
    assert scan.counts["train_full"] == scan.counts["train"]
    test_keys = sorted((r["key"] for r in kept if r["split"] == "test"), key=lambda k: stable_uniform(3, k))
    assert _expected_members(rows, "test_subset", scan.rule) == sorted(test_keys[:4])
    assert scan.counts["test_subset"] == 4
    for group in GROUPS:  # exactly the 3 smallest sample priorities of each group pass its threshold
        members = _expected_members(rows, group, scan.rule)
        passing = [k for k in members if stable_uniform(2, k) <= scan.rule.sample_thresholds[group]]
        assert sorted(passing) == sorted(sorted(members, key=lambda k: stable_uniform(2, k))[:3])
    assert len(scan.manifest_sha256) == 64


def test_extraction_goes_largest_shard_first(corpus):
    """The statistics' extraction is submitted by decreasing records per shard (ties by
    name), so the largest shard is not the one a worker embeds last while others idle."""
    store, rows, _ = corpus
    scan = scan_manifest(store, ("test",))
    test_rows = [r["staging_shard"] for r in rows if r["status"] == "kept" and r["split"] == "test"]
    assert scan.shard_records == {s: test_rows.count(s) for s in sorted(set(test_rows))}
    assert scan.largest_first() == sorted(scan.shards, key=lambda s: (-test_rows.count(s), s))
    assert sorted(scan.largest_first()) == scan.shards


def test_partials_equal_numpy_for_every_group_and_merge_order(corpus):
    store, rows, feats = corpus
    scan = scan_manifest(store, GROUPS, SampleConfig(max_rows=5, seed=9), subset_size=4, subset_seed=3)
    parts = [shard_partials(store, MODEL_ID, s, scan.rule) for s in scan.shards]
    forward = merge_partials(merge_partials(merge_partials(parts[0], parts[1]), parts[2]), parts[3])
    backward = merge_partials(parts[3], merge_partials(parts[2], merge_partials(parts[1], parts[0])))
    for group in GROUPS:
        members = _expected_members(rows, group, scan.rule)
        keys = [k for k in members if k in feats]
        x = np.stack([feats[k] for k in keys]).astype(np.float64)
        for total in (forward, backward):
            m = total.groups[group].moments
            assert m.n == len(keys)
            np.testing.assert_allclose(m.mean, x.mean(0), rtol=1e-12)
            np.testing.assert_allclose(m.covariance(), np.cov(x, rowvar=False), rtol=1e-9, atol=1e-12)
        # the group's 5 smallest priorities, less any record without features
        chosen = sorted(members, key=lambda k: (stable_uniform(9, k), k))[:5]
        expected_sample = tuple(k for k in chosen if k in feats)
        assert forward.groups[group].sample.keys == backward.groups[group].sample.keys == expected_sample
        np.testing.assert_array_equal(forward.groups[group].sample.features, np.stack([feats[k] for k in expected_sample]))
    assert forward.groups["test"].missing == {"decode": 1}
    (facts,) = forward.markers.values()  # every shard's features have the same facts
    assert list(forward.markers) == [facts["fingerprint"]]
    assert {k: v for k, v in facts.items() if k != "fingerprint"} == FEATURE_INFO


def test_written_files_carry_provenance_and_are_deterministic(corpus, tmp_path):
    store, _, _ = corpus
    scan: ManifestScan = scan_manifest(store, ("test",), SampleConfig(max_rows=8, seed=0))
    runs = cut_batches(scan.shards, 2)
    assert runs == [["000000", "000001"], ["000002", "000003"]]
    total = merge_partials(*[batch_partials(store, MODEL_ID, run, scan.rule) for run in runs])
    marker = next(iter(total.markers.values()))
    side = write_group_stats(store, "test", MODEL_ID, total.groups["test"], marker, scan, "cv-1")
    stem = stats_path("test", MODEL_ID)
    first = {ext: store.read_bytes(stem + ext) for ext in (".npz", ".json", ".features.npy")}
    write_group_stats(store, "test", MODEL_ID, total.groups["test"], marker, scan, "cv-1")
    assert first == {ext: store.read_bytes(stem + ext) for ext in first}
    with np.load(io.BytesIO(first[".npz"])) as npz:
        m: Moments = total.groups["test"].moments
        np.testing.assert_array_equal(npz["mu"], m.mean)
        np.testing.assert_array_equal(npz["sigma"], m.covariance())
        assert int(npz["n"]) == m.n == side["n"]
    feats = np.load(io.BytesIO(first[".features.npy"]))
    assert feats.dtype == np.float32 and feats.shape[1] == DIM and 7 <= feats.shape[0] <= 8
    assert side["subsample"]["rows"] == feats.shape[0] and side["subsample"]["max_rows"] == 8
    assert side["model"] == IDENTITY and side["random_init"] is True
    assert side["manifest_sha256"] == scan.manifest_sha256 and side["code_version"] == "cv-1"
    assert side["missing_features"] == {"decode": 1}
    devs = " | ".join(side["protocol_deviations"])
    assert "RANDOM-INIT" in devs and "vit_small_patch14_dinov2" in devs and "no features" in devs
    assert side["files"]["npz"]["sha256"] == Store.sha256(store, f"{stem}.npz")


def test_cut_batches_are_contiguous_and_balanced():
    shards = [f"{i:06d}" for i in range(10)]
    runs = cut_batches(shards, 4)
    assert [len(r) for r in runs] == [2, 3, 2, 3] and sum(runs, []) == shards
    assert cut_batches(shards, 50) == [[s] for s in shards]
    assert cut_batches(shards, 50, min_shards=4) == [shards[:5], shards[5:]]  # few shards: few tasks
    assert cut_batches(shards, 50, min_shards=16) == [shards]
    assert [len(r) for r in cut_batches(shards, 2, min_shards=3)] == [5, 5]  # max_tasks still bounds


def test_missing_features_are_reported_not_guessed(corpus, tmp_path):
    store, _, _ = corpus
    scan = scan_manifest(store, ("test",))
    with pytest.raises(FileNotFoundError, match="other_model.*is not complete"):
        shard_partials(store, "other_model", scan.shards[0], scan.rule)


def test_gpic_eval_file_beside_the_sidecar(corpus):
    """Issue 13: stats/test_stats.npz with gpic-eval's keys, the same µ, Σ and subsample,
    named by SHA-256 in the sidecar, so evaluate finds its provenance again."""
    from tasks.stats.evaluate import load_reference

    store, _, _ = corpus
    scan: ManifestScan = scan_manifest(store, ("test",), SampleConfig(max_rows=6, seed=1))
    total = merge_partials(*[batch_partials(store, MODEL_ID, run, scan.rule) for run in cut_batches(scan.shards, 2)])
    marker = next(iter(total.markers.values()))
    side = write_group_stats(store, "test", MODEL_ID, total.groups["test"], marker, scan, "cv-1")
    stem = stats_path("test", MODEL_ID)
    data = store.read_bytes("stats/test_stats.npz")
    with np.load(io.BytesIO(data), allow_pickle=False) as gpic, np.load(io.BytesIO(store.read_bytes(stem + ".npz"))) as own:
        assert sorted(gpic.files) == ["dino_embeddings", "dino_mu", "dino_sigma"]
        np.testing.assert_array_equal(gpic["dino_mu"], own["mu"])
        np.testing.assert_array_equal(gpic["dino_sigma"], own["sigma"])
        np.testing.assert_array_equal(gpic["dino_embeddings"], np.load(io.BytesIO(store.read_bytes(stem + ".features.npy"))))
    assert side["files"]["gpic_npz"]["sha256"] == Store.sha256(store, "stats/test_stats.npz")
    assert side["files"]["gpic_npz"]["embeddings"] == side["subsample"]["rows"]
    reference = load_reference(store.path("stats/test_stats.npz"))
    assert reference.provenance == side and reference.n == side["n"]
    assert any("SHA-256" in c for c in reference.checks["checked"])


def test_a_split_of_one_kept_record_is_refused_by_name():
    """One rule for the stage and its plan (``refuse_thin_splits``): statistics need 2 records."""
    from tasks.stats.stage import ReferenceStatsConfig, refuse_thin_splits

    config = ReferenceStatsConfig(splits=["val", "test"])
    refuse_thin_splits(config, {"train": 0, "val": 2, "test": 2})  # train is not asked for
    with pytest.raises(ValueError, match=r"fewer than 2 kept records in the manifest: \['test'\]$"):
        refuse_thin_splits(config, {"train": 9, "val": 2, "test": 1})
