"""End to end: the build of the sample corpus, in-process (the session's ``built_sample``,
tests/conftest.py) and as a flow on real Dask clusters.

Checks what a user relies on: every input record accounted for once with the right fate,
release shards readable with ``webdataset`` and equal to the manifest's kept rows,
byte-identical outputs across runs and worker counts, and a rerun that changes nothing.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from tasks.report.files import CHANGES_MD, CHANGES_TABLE
from corpusforge.storage import Store
from flows.build_corpus import run_build
from tasks.report.receipt import OUTPUT_LIST_SKIPS
from tasks.shared.output_hashes import output_hashes
from sample_corpus.truth import related_groups
from tests.built_sample import config
from tests.old_release import assert_release_equals_old

pytestmark = [pytest.mark.timeout(900)]


def file_hashes(root: Path) -> dict[str, str]:
    """Every output's and marker's SHA-256 but the work area and the account of changes since
    the version the root held before (a rebuild writes one, a fresh build has none)."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not str(p.relative_to(root)).startswith("work/")
            and p.name not in (CHANGES_MD, CHANGES_TABLE)}


def manifest(out: Path) -> list[dict]:
    return ds.dataset(out / "manifest", format="parquet").to_table().to_pylist()


def ground_truth(sample_corpus: Path) -> dict:
    return json.loads((sample_corpus / "ground_truth.json").read_text())


def test_every_input_record_appears_once(built_sample, sample_corpus):
    out, _ = built_sample
    rows = manifest(out)
    inputs = pq.read_table(sample_corpus / "metadata.parquet").column("key").to_pylist()
    assert sorted(r["key"] for r in rows) == sorted(inputs)
    assert all(r["status"] in {"kept", "filtered", "exact_duplicate", "near_duplicate", "error"} for r in rows)
    assert all(r["reason"] for r in rows if r["status"] != "kept")


def test_planted_bad_records_get_the_right_status_and_reason(built_sample, sample_corpus):
    out, _ = built_sample
    rows = {r["key"]: r for r in manifest(out)}
    truth = ground_truth(sample_corpus)
    for bad in truth["bad_records"]:
        row = rows[bad["key"]]
        assert (row["status"], row["reason"].split(":")[0]) == (bad["expected_status"], bad["expected_reason"]), bad
    for special in truth["valid_special"]:
        row = rows[special["key"]]
        assert row["status"] == "kept", special
        assert (row["width"], row["height"], row["format"]) == (
            special["expected_width"], special["expected_height"], special["expected_format"]), special


def test_every_planted_exact_duplicate_is_caught(built_sample, sample_corpus):
    out, _ = built_sample
    rows = {r["key"]: r for r in manifest(out)}
    for dup in ground_truth(sample_corpus)["exact_duplicates"]:
        pair = [rows[dup["key"]], rows[dup["copy_of"]]]
        assert sorted(r["status"] for r in pair) == ["exact_duplicate", "kept"], dup
        loser = next(r for r in pair if r["status"] == "exact_duplicate")
        winner = next(r for r in pair if r["status"] == "kept")
        assert loser["duplicate_of"] == winner["key"] and loser["sha256"] == winner["sha256"]


def test_release_shards_read_back_with_webdataset(built_sample):
    out, result = built_sample
    rows = manifest(out)
    kept = {r["key"]: r for r in rows if r["status"] == "kept"}
    seen: dict[str, str] = {}
    for tar in sorted((out / "shards").rglob("*.tar")):
        for sample in wds.WebDataset(str(tar), shardshuffle=False):
            meta = json.loads(sample["json"])
            assert "url" not in meta and meta["key"] == sample["__key__"]
            image_ext = next(e for e in ("jpg", "png", "webp") if e in sample)
            assert kept[sample["__key__"]]["sha256"] == __import__("hashlib").sha256(sample[image_ext]).hexdigest()
            seen[sample["__key__"]] = tar.stem
    assert set(seen) == set(kept)
    assert all(kept[k]["shard"] == shard for k, shard in seen.items())
    assert sum(s["samples"] for s in result["release"].values()) == len(kept)
    splits = Counter(r["split"] for r in kept.values())
    assert splits["test"] > 0 and splits["val"] > 0 and splits["train"] > splits["test"]


def test_receipt_and_report(built_sample):
    out, _ = built_sample
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["counts"]["records"] == len(manifest(out))
    listed = pq.read_table(out / receipt["outputs"]["list"]).to_pylist()
    hashes = {r["path"]: r["sha256"] for r in listed}
    assert list(hashes) == sorted(hashes) and receipt["outputs"]["files"] == len(hashes)
    assert receipt["outputs"]["sha256"] == file_hashes(out)[receipt["outputs"]["list"]]
    receipt_files = ("receipt.json", "receipt_outputs.parquet", "report.md", "report.html")
    # The published version (versions/, current.json) is links of listed files, written after the list.
    assert hashes == {rel: digest for rel, digest in file_hashes(out).items()
                      if not rel.startswith(("_markers/", "versions/")) and rel not in (*receipt_files, "current.json")}
    report = (out / "report.md").read_text()
    assert "## Release shards" in report and "RANDOM-INIT" in report
    model_id = receipt["stats"]["model_id"]
    for split in ("test", "val"):
        sidecar = json.loads((out / "stats" / f"{split}-{model_id}.json").read_text())
        assert sidecar["n"] == receipt["release"]["splits"][split]["samples"]
        assert "random" in json.dumps(sidecar).lower()


def test_the_receipt_reads_no_output_a_marker_records(built_sample, opened_files):
    """The output list comes from the markers: no file a marker records is opened (a no-op
    rerun's receipt re-reads no shard, feature, graph or manifest file); only the per-build
    summaries every run rewrites outside the unit protocol are hashed."""
    out, _ = built_sample
    recorded = {rel for p in (out / "_markers").rglob("*.json") for rel in json.loads(p.read_text())["outputs"]}
    opened_files.clear()
    hashes = output_hashes(Store(str(out)), skip=OUTPUT_LIST_SKIPS, recorded=True)
    opened = list(opened_files)
    assert opened and not set(opened) & recorded
    assert set(opened) == {rel for rel in hashes if rel not in recorded}
    summaries = ("shards/README.md", "eval_captions.parquet", "graph/nodes.json", "graph/summary.json",
                 "graph/recall.json", "graph/components_report.json", "graph/collision/", "graph/calibration/",
                 "stats/")
    assert all(rel.startswith(summaries) for rel in opened), sorted(opened)


def test_release_equals_the_old_implementation(built_sample, sample_corpus, tmp_path):
    """Release tars, late facts (so the manifest) and the receipt's release summary equal the
    per-record-dict planner's and the index-reading writers' byte for byte."""
    out, _ = built_sample
    staged = sorted(p.stem for p in (out / "staging" / "records").glob("*.parquet"))
    near_dedup = (out / "graph" / "decisions").is_dir()
    assert near_dedup
    assert_release_equals_old(out, staged, config(sample_corpus, out).splits, near_dedup, tmp_path)


def test_the_caption_set_and_test_50k_are_the_same_records(built_sample, tmp_path):
    """With their default seeds, the evaluation caption set (drawn from the test release assignments)
    and the reference statistics' Test-50K (drawn from the manifest) are the same test records;
    the size is half the test split, so the sampling decides which."""
    import hashlib

    from tasks.captions.files import EVAL_CAPTIONS
    from tasks.captions.eval_captions import EVAL_ASSIGNMENTS, EvalCaptionsConfig, write_eval_captions
    from tasks.stats.reference import TEST_SUBSET, scan_manifest
    from tasks.stats.stage import ReferenceStatsConfig

    out, _ = built_sample
    shutil.copytree(out, tmp_path / "corpus", symlinks=True)  # the caption set is written again
    store = Store(str(tmp_path / "corpus"), fsync=False)
    rows = ds.dataset(out / "manifest", format="parquet").to_table(columns=["key", "status", "split"]).to_pylist()
    test_keys = [r["key"] for r in rows if r["status"] == "kept" and r["split"] == "test"]
    size = len(test_keys) // 2
    assert size >= 3
    write_eval_captions(store, hashlib.sha256(store.read_bytes(EVAL_ASSIGNMENTS)).hexdigest(),
                        EvalCaptionsConfig(size=size))
    captions = set(store.read_parquet(EVAL_CAPTIONS)["key"].to_pylist())
    seed = ReferenceStatsConfig.model_fields["test_subset_seed"].default
    subset = scan_manifest(store, (TEST_SUBSET,), subset_size=size, subset_seed=seed).rule
    assert len(captions) == size and captions == {k for k in test_keys if subset.groups_of(k, "test", None)}


def computed_units(work: dict, path: str = "") -> dict[str, int | str]:
    """Every step of a build's work log that computed something (units computed, or an
    action ``computed``), by its path in the log."""
    found: dict[str, int | str] = {}
    for name, value in work.items():
        where = f"{path}/{name}"
        if isinstance(value, dict):
            found.update(computed_units(value, where))
        elif (name == "computed" and value) or value == "computed":
            found[where] = value
    return found


@pytest.mark.slow
def test_rerun_changes_no_byte_and_redoes_no_shard(built_sample, sample_corpus, tmp_path, prefect_server):
    """The build flow on a 2-process cluster over (a copy of) the built corpus: no unit is
    redone and no output byte changes."""
    first = built_sample[1]
    out = tmp_path / "corpus"
    shutil.copytree(built_sample[0], out)  # (copy2: the files keep their modification times)
    assert {"/ingest/computed", "/staging/computed", "/features/wfd/computed", "/graph/queries/computed",
            "/publish/release_shards/computed"} <= set(computed_units(first["work"]))
    before = file_hashes(out)
    tars = {p: p.stat().st_mtime_ns for p in out.rglob("*.tar")}
    markers = {p: p.read_bytes() for p in (out / "_markers").rglob("*.json")}
    receipt = json.loads((out / "receipt.json").read_text())
    again = run_build(config(sample_corpus, out))
    after = file_hashes(out)
    before.pop("receipt.json"), after.pop("receipt.json")
    assert after == before
    rerun = json.loads((out / "receipt.json").read_text())
    assert rerun["config"].pop("out") == str(out)  # the receipt names the copy's root...
    receipt["config"].pop("out")
    assert rerun == receipt  # ...and nothing else differs
    assert {p: p.read_bytes() for p in (out / "_markers").rglob("*.json")} == markers  # no unit was redone
    assert pq.read_table(out / CHANGES_TABLE).num_rows == 0
    assert "Records: 0 added, 0 removed, 0 changed" in (out / CHANGES_MD).read_text()
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.tar")} == tars
    assert computed_units(again["work"]) == {} and again["work"]["images_embedded"] == 0


@pytest.mark.slow
@pytest.mark.long
def test_same_bytes_on_an_existing_scheduler_with_another_worker_count(built_sample, sample_corpus, tmp_path,
                                                                       prefect_server, local_cluster):
    """A build on an external scheduler (one worker process) writes the in-process build's bytes."""
    out, _ = built_sample
    other = tmp_path / "again"
    cluster = local_cluster(n_workers=1, threads_per_worker=2)
    run_build(config(sample_corpus, other, dask={"address": cluster.scheduler_address}))
    a, b = file_hashes(out), file_hashes(other)
    a.pop("receipt.json"), b.pop("receipt.json")
    assert a == b
    ra, rb = (json.loads((p / "receipt.json").read_text()) for p in (out, other))
    for r in (ra, rb):
        r["config"].pop("out"), r["config"].pop("dask")
    assert ra == rb


# Recall of the default (weight-free) descriptor on the sample corpus's planted
# near-duplicate copies: measured 14 of 18 = 0.778 on 2026-11-30 with GPIC's rule alone,
# 17 of 18 = 0.944 with mode gpic_verified (review of each image's best band partners,
# geometric verification). Raise it when the descriptor improves; never lower it to make a
# change pass.
RECALL_FLOOR = 0.9


@pytest.mark.scenario("e2e")
def test_planted_near_duplicates_are_removed_or_explained(built_sample, sample_corpus):
    """Precision and recall of near-duplicate removal against the planted ground truth.

    A planted copy that stays is "explained" when GPIC's rule says it should stay: its best
    similarity inside its planted group was measured, is at most the pair threshold, and its
    component is smaller than the component rule's size. A copy with no similarity at all
    (the graph never linked it) is a miss, not an explanation.
    """
    out, _ = built_sample
    rows = {r["key"]: r for r in manifest(out)}
    truth = ground_truth(sample_corpus)
    group_of = related_groups(list(rows), truth)
    removed = [r for r in rows.values() if r["status"] == "near_duplicate"]
    false_removals = [r["key"] for r in removed if group_of[r["duplicate_of"]] != group_of[r["key"]]]
    planted_groups: dict[str, list[str]] = {}
    for k, g in group_of.items():
        if rows[k]["status"] in ("kept", "near_duplicate"):
            planted_groups.setdefault(g, []).append(k)
    planted_groups = {g: ks for g, ks in planted_groups.items() if len(ks) > 1}
    found = unexplained = 0
    total = sum(len(v) - 1 for v in planted_groups.values())
    for members in planted_groups.values():
        statuses = [rows[k]["status"] for k in members]
        found += statuses.count("near_duplicate")
        for k in members:
            r = rows[k]
            if r["status"] == "kept" and statuses.count("kept") > 1:
                explained = r["max_similarity"] is not None and r["max_similarity"] <= 0.9625 \
                    and (r["component_size"] or 1) < 5
                unexplained += not explained
    precision = 1 - len(false_removals) / max(1, len(removed))
    recall = found / max(1, total)
    print(f"near-duplicates: removed {len(removed)}, planted {total}, found {found}, unexplained {unexplained}, "
          f"precision {precision:.3f}, recall {recall:.3f}, false removals {false_removals}")
    assert false_removals == []
    assert unexplained == 0
    assert recall >= RECALL_FLOOR, f"recall {recall:.3f} on the planted pairs is below the floor {RECALL_FLOOR}"


@pytest.mark.slow
def test_near_dedup_pass_writes_a_new_version_and_never_touches_the_old(built_sample, tmp_path, prefect_server):
    from flows.near_dedup import NearDedupFlowParams, run_near_dedup

    out, _ = built_sample
    before = file_hashes(out)
    v2 = tmp_path / "v2"
    config = NearDedupFlowParams.model_validate({
        "source": str(out), "out": str(v2), "dask": {"n_workers": 2},
        "near_dedup": {"pair_removal_above": 0.93, "min_component_size": 3}})
    run_near_dedup(config)
    assert file_hashes(out) == before
    old_rows, new_rows = manifest(out), manifest(v2)
    assert sorted(r["key"] for r in new_rows) == sorted(r["key"] for r in old_rows)
    removed = {r["key"] for r in new_rows if r["status"] == "near_duplicate"}
    assert len(removed) >= sum(r["status"] == "near_duplicate" for r in old_rows)
    released = {s["__key__"] for tar in (v2 / "shards").rglob("*.tar") for s in wds.WebDataset(str(tar), shardshuffle=False)}
    assert released == {r["key"] for r in new_rows if r["status"] == "kept"} and not released & removed
    receipt = json.loads((v2 / "receipt.json").read_text())
    assert receipt["lineage"]["derived_from"] == str(out) and receipt["counts"]["records"] == len(new_rows)
    assert not (v2 / "staging").exists()
