"""A rerun that changes nothing makes no task run, in any stage nor any one-off global step
(issue 31, item 4); a changed input runs again exactly what depends on it.

The flow probes every unit itself (``corpusforge.cluster.run_tasks``): ingest partitions by
their chunk and image stamps, staging shards by their slices' resolved digests, feature units
by their configured spec (no model is loaded), release shards and manifest parts, graph and
caption units by their markers. The one-off global steps (planning the inputs and the release,
the graph's recall check, the statistics' scan and partials, the evaluation caption set, the
input snapshot, the output list, the reports, the account of changes, the sweep) are units
keyed by their code, settings and input digests (``corpusforge.contract.step_call``), probed
the same way. So a no-op rerun is a walk over markers in the flow process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from corpusforge.contract import COMPUTED, SKIPPED, in_process, keyed, probe, run_step, step_call
from corpusforge.layout import MANIFEST_DIR
from tasks.release.files import LATE_DIR, RELEASE_DIR, RELEASE_ASSIGNMENT_DIR, late_path, release_assignment_path
from tasks.report.files import RECEIPT, RECEIPT_OUTPUTS
from tasks.captions.files import EVAL_CAPTIONS
from corpusforge.storage import Store
from flows.build_corpus import BuildConfig, build, run_build
from tests.built_sample import config
from tests.test_build_e2e import file_hashes
from tasks.report.receipt import WRITE_OUTPUT_LIST
from tests.test_cluster import build_task_runs

pytestmark = [pytest.mark.timeout(600)]

ON_DASK = {"n_workers": 1, "processes": False}


def settled_copy(built: Path, tmp_path: Path, settings: BuildConfig) -> None:
    """A copy of the built sample at ``settings.out``, rebuilt once in this process with
    ``settings``: its receipt then names this root and cluster, and the build kept that
    version when it ended (so the next rebuild compares with it and keeps nothing new)."""
    shutil.copytree(built, settings.out, symlinks=True)
    build(settings)


def task_runs(out: Path) -> Counter[str]:
    """The flow builds' task runs into ``out`` by task (batch and retry suffixes dropped)."""
    return Counter(re.sub(r"( \d+/\d+|-[0-9a-f]{3})$", "", r.name) for r in build_task_runs(str(out)))


def test_a_no_op_rerun_makes_no_task_run(built_sample, sample_corpus, tmp_path, prefect_server):
    """The session's sample corpus rebuilt as a flow on a Dask cluster with nothing changed:
    zero task runs in every stage of units and in every global step, and the same bytes."""
    built, _ = built_sample
    out = tmp_path / "corpus"
    before, receipt = file_hashes(built), json.loads((built / RECEIPT).read_text())
    settings = config(sample_corpus, out, dask=ON_DASK)
    settled_copy(built, tmp_path, settings)
    run_build(settings)
    assert task_runs(out) == Counter(), f"task runs of a no-op rerun, by task: {dict(task_runs(out))}"
    after = file_hashes(out)
    assert {p: h for p, h in after.items() if p != RECEIPT} == {p: h for p, h in before.items() if p != RECEIPT}
    rerun = json.loads((out / RECEIPT).read_text())
    for r in (receipt, rerun):  # the rebuild's own settings: where it ran (a copy) and on what cluster
        r["config"].pop("out"), r["config"].pop("dask")
    assert rerun == receipt


def test_a_changed_global_step_runs_again_with_what_depends_on_it(built_sample, sample_corpus, tmp_path,
                                                                  prefect_server):
    """A new seed of the evaluation caption set (a setting only that step reads) runs that step
    again, and what reads its result: the statistics' sidecars name the set, the receipt records
    it (so the output list, the reports and the account of changes follow, and the new version
    is kept when the build ends). Nothing upstream runs: not the plans, the recall check, the
    scan, nor any unit."""
    built, _ = built_sample
    out = tmp_path / "corpus"
    settled_copy(built, tmp_path, config(sample_corpus, out, dask=ON_DASK))
    run_build(config(sample_corpus, out, dask=ON_DASK, eval_captions={"seed": 7}))
    assert task_runs(out) == Counter({"write-eval-captions": 1, "stats-partials": 1, "write-output-list": 1,
                                      "write-reports": 1, "diff-versions": 1, "keep-previous-version": 1})
    receipt = json.loads((out / RECEIPT).read_text())
    assert receipt["eval_captions"]["seed"] == 7
    assert receipt["eval_captions"]["sha256"] == hashlib.sha256((out / EVAL_CAPTIONS).read_bytes()).hexdigest()
    sidecar = json.loads((out / receipt["stats"]["files"]["test"]["npz"]["path"].replace(".npz", ".json")).read_text())
    assert sidecar["eval_captions"]["seed"] == 7


def test_a_statistics_file_removed_by_hand_is_written_again(built_sample, sample_corpus, tmp_path):
    """The statistics' keyed step is current only while the files its result names are there:
    a sidecar removed by hand is written again, with the same bytes."""
    built, _ = built_sample
    out = tmp_path / "corpus"
    settings = config(sample_corpus, out, dask=ON_DASK)
    settled_copy(built, tmp_path, settings)
    files = json.loads((out / RECEIPT).read_text())["stats"]["files"]
    named = [f["path"] for group in files.values() for f in group.values()]
    assert "stats/test_stats.npz" in named and [p for p in named if not (out / p).exists()] == []
    npz = files["test"]["npz"]["path"]
    sidecar = out / npz.replace(".npz", ".json")
    want = sidecar.read_bytes()
    sidecar.unlink()
    build(settings)
    assert sidecar.read_bytes() == want


def test_release_assignments_removed_by_hand_are_written_again(built_sample, sample_corpus, tmp_path):
    """The release assignment's keyed step is current only while the plan and late files its result
    names are there: with them removed by hand, a rerun whose new evaluation caption seed reads
    the test plans plans again, with the same bytes, and leaves every shard and part as it was."""
    built, _ = built_sample
    out = tmp_path / "corpus"
    settled_copy(built, tmp_path, config(sample_corpus, out, dask=ON_DASK))
    name = next(n for n, s in json.loads((out / RECEIPT).read_text())["release"]["shards"].items()
                if s["split"] == "test")
    assignments = {p: p.read_bytes() for folder in (RELEASE_ASSIGNMENT_DIR,
                                                    LATE_DIR) for p in sorted((out / folder).iterdir())}
    assert out / release_assignment_path(name) in assignments and out / late_path(0) in assignments
    published = {p: h for p, h in file_hashes(out).items() if p.startswith((f"{RELEASE_DIR}/", f"{MANIFEST_DIR}/"))}
    for folder in (RELEASE_ASSIGNMENT_DIR, LATE_DIR):
        shutil.rmtree(out / folder)
    build(config(sample_corpus, out, dask=ON_DASK, eval_captions={"seed": 7}))
    assert {p: p.read_bytes() for p in assignments if p.exists()} == assignments
    assert {p: h for p, h in file_hashes(out).items() if p.startswith((f"{RELEASE_DIR}/", f"{MANIFEST_DIR}/"))} \
        == published
    assert json.loads((out / RECEIPT).read_text())["eval_captions"]["seed"] == 7


def test_a_keyed_step_is_current_only_with_the_same_key_and_its_outputs(tmp_path):
    """The flow's probe of a keyed step (what ``corpusforge.cluster`` does before submitting),
    here the output list: current after it ran, with its recorded result; not current when a
    setting or an input digest changed, nor when its output file was removed; a run of a
    current step writes nothing."""
    store = Store(str(tmp_path), fsync=False)
    store.write_bytes("shards/a.txt", b"a")

    def call(setting: int, digest: str) -> dict:
        return step_call(store, WRITE_OUTPUT_LIST, setting, [digest], dict(store=store), (RECEIPT_OUTPUTS,))

    assert probe(run_step, call(1, "a")) == (False, None)
    (done,) = in_process(keyed(WRITE_OUTPUT_LIST), [call(1, "a")])
    assert done.action == COMPUTED and done.info["files"] == 1 and done.info["sha256"] == store.sha256(RECEIPT_OUTPUTS)
    current = dataclasses.replace(done, action=SKIPPED)  # the recorded result, read back
    assert probe(run_step, call(1, "a")) == (True, current)
    written = (tmp_path / RECEIPT_OUTPUTS).stat().st_mtime_ns
    assert in_process(keyed(WRITE_OUTPUT_LIST), [call(1, "a")]) == [current]
    assert (tmp_path / RECEIPT_OUTPUTS).stat().st_mtime_ns == written  # read back, not written again
    assert probe(run_step, call(2, "a")) == (False, None)  # a setting
    assert probe(run_step, call(1, "b")) == (False, None)  # an input's digest
    store.remove(RECEIPT_OUTPUTS)
    assert probe(run_step, call(1, "a")) == (False, None)  # its output is gone


def test_a_settled_no_op_rerun_of_a_folder_starts_no_cluster(tmp_path, prefect_server, monkeypatch):
    """A bare folder of images rebuilt as a flow with nothing changed: its listing is probed in
    the flow process (``folder_stamp``), so no unit is a task run and the embedded LocalCluster,
    whose worker processes take seconds to start and stop, is never started."""
    import distributed
    import numpy as np
    from PIL import Image

    src, out = tmp_path / "src", tmp_path / "corpus"
    src.mkdir()
    for i in range(12):
        pixels = np.random.default_rng(i).integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(src / f"{i:02d}.png")
    settings = BuildConfig.model_validate({
        "source": str(src), "out": str(out), "validation": {"min_side": 32}, "input": {"partition_size": 5},
        "features": {"models": []}, "near_dedup": None, "licenses": None,
        "dask": {"n_workers": 1, "processes": True}})
    build(settings)  # a fresh build, then a root's first rebuild (it keeps the version before)
    build(settings)
    started: list[dict] = []

    class Counted(distributed.LocalCluster):  # the real cluster, counted
        def __init__(self, *args, **kwargs):
            started.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(distributed, "LocalCluster", Counted)
    run_build(settings)
    assert started == [], "a settled no-op rerun started the embedded cluster"
    assert task_runs(out) == Counter(), f"task runs of a no-op rerun, by task: {dict(task_runs(out))}"
