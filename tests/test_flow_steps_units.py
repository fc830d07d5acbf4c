"""The build's steps that read data run as units on the engine (issue 31), with bounded
memory, and give the bytes the flow-process versions gave: the evaluation caption set,
the reference statistics' manifest scan, the receipt's hashes, the sweep, the reports and
the previous-version copy and diff.

Fast tier: small corpora written with the benchmark's real writers (staging shards,
release assignments), no server."""

from __future__ import annotations

import heapq
import random
import tracemalloc

import pyarrow as pa
import pytest

from bench.scale import Scale, write_staging
from corpusforge.contract import SWEEP_TEMP_FILES, in_process, sweep_temp_files
from corpusforge.hashing import stable_uniform
from corpusforge.layout import staging_index, staging_tar
from tasks.release.files import release_assignment_path
from tasks.report.files import RECEIPT, REPORT
from tasks.captions.files import EVAL_CAPTIONS, EVAL_CAPTIONS_SCHEMA
from corpusforge.storage import Store
from tasks.captions.eval_captions import WRITE_EVAL_CAPTIONS, EvalCaptionsConfig, write_eval_captions, write_test_assignment_list
from tasks.release.shards import assign_release_files, write_staged_list
from tasks.release.splits import SplitConfig
from tasks.shared.sampling import SmallestKeys

SPLITS = SplitConfig(test=0.3, val=0.1, shard_size=40)


def _corpus(tmp_path, n: int = 600, shards: int = 4) -> tuple[Store, dict]:
    store = Store(str(tmp_path / "out"), fsync=False)
    sc = Scale(n, 1, shards, 1)
    write_staging(store, sc)
    staged = write_staged_list(store, [f"{s:06d}" for s in range(shards)])
    return store, assign_release_files(store, staged, SPLITS, near_dedup=False)


def _old_eval_captions(store: Store, release: dict, cfg: EvalCaptionsConfig) -> pa.Table:
    """The set as the flow process built it before issue 31: every test row in a list, a
    sort-based sample, captions through each staging shard's index."""
    entries = []
    for name, shard in release["shards"].items():
        if shard["split"] == "test":
            entries += [{**e, "shard": name} for e in store.read_parquet(release_assignment_path(name)).to_pylist()]
    chosen = set(heapq.nsmallest(cfg.size, {e["key"] for e in entries}, key=lambda k: (stable_uniform(cfg.seed, k), k)))
    rows = sorted((e for e in entries if e["key"] in chosen), key=lambda e: e["key"])
    for r in rows:
        index = {m["key"]: m for m in store.read_parquet(staging_index(r["staging_shard"])).to_pylist()
                 if m["ext"] == "txt"}
        span = index[r["key"]]
        r["caption"] = store.read_range(staging_tar(r["staging_shard"]), span["offset"], span["size"]).decode()
    return pa.Table.from_pylist([{c: r[c] for c in EVAL_CAPTIONS_SCHEMA.names} for r in rows],
                                schema=EVAL_CAPTIONS_SCHEMA)


@pytest.mark.parametrize("size", [7, 100, 10_000])  # fewer, more than an assignment file, more than the split
def test_the_eval_caption_unit_writes_the_bytes_the_flow_process_wrote(tmp_path, size):
    store, release = _corpus(tmp_path)
    cfg = EvalCaptionsConfig(size=size, seed=3)
    tests = [n for n, s in release["shards"].items() if s["split"] == "test"]
    assert len(tests) >= 3  # several assignment files: the running threshold crosses files
    result = in_process(WRITE_EVAL_CAPTIONS, [dict(store=store, assignments=write_test_assignment_list(store, release),
                                                   cfg=cfg)])[0]
    expected = _old_eval_captions(store, release, cfg)
    written = store.read_parquet(EVAL_CAPTIONS)
    assert written.equals(expected) and result["captions"] == expected.num_rows == min(size, result["test_records"])
    assert result["test_records"] == sum(release["shards"][n]["count"] for n in tests)
    assert result["sha256"] == Store(str(tmp_path / "ref"), fsync=False).write_parquet("e.parquet", expected)
    # a rerun writes the same bytes
    again = write_eval_captions(store, write_test_assignment_list(store, release), cfg)
    assert again == result


def test_the_eval_caption_unit_refuses_a_plan_list_rewritten_since(tmp_path):
    store, release = _corpus(tmp_path, n=200, shards=2)
    digest = write_test_assignment_list(store, release)
    write_test_assignment_list(store, {"shards": {}})
    with pytest.raises(ValueError, match="changed while the evaluation caption set ran"):
        write_eval_captions(store, digest, EvalCaptionsConfig(size=5))


def test_streamed_sample_equals_the_sort_in_any_order_and_chunking():
    rng = random.Random(0)
    keys = [f"k{i:05d}" for i in range(3000)] + [f"k{i:05d}" for i in range(0, 3000, 7)]  # some twice
    for size in (0, 1, 50, 2999, 5000):
        expected = set(heapq.nsmallest(size, set(keys), key=lambda k: (stable_uniform(9, k), k)))
        rng.shuffle(keys)
        sample, start = SmallestKeys(size, 9), 0
        while start < len(keys):  # batches of any size
            step = rng.randint(1, 700)
            sample.add(keys[start:start + step])
            start += step
        assert sample.keys() == expected
        assert sample.threshold() == max((stable_uniform(9, k) for k in expected), default=-1.0)


def test_the_eval_caption_unit_holds_memory_by_the_set_not_the_split(tmp_path):
    """The task's peak Python allocation does not follow the test split: 4× the records, same
    set size, at most an assignment file's worth more (the old code held every test row: ~1.9 KB each)."""
    peaks = []
    for n in (500, 2000):
        store, release = _corpus(tmp_path / str(n), n=n, shards=4)
        assignments = write_test_assignment_list(store, release)
        tracemalloc.start()
        write_eval_captions(store, assignments, EvalCaptionsConfig(size=20))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    test_rows = 0.3 * 1500
    assert peaks[1] - peaks[0] < 1900 * test_rows / 4, peaks


def test_sweep_is_a_unit_that_removes_only_temporary_files(tmp_path):
    store = Store(str(tmp_path / "out"), fsync=False)
    store.write_bytes("a/b/keep.parquet", b"x")
    store.write_bytes("a/.keep.parquet.1.part.done", b"y")
    (tmp_path / "out" / "a" / "b" / ".half.tar.12.part").write_bytes(b"z")
    for i in range(6):
        (tmp_path / "out" / "a" / f".w{i}.parquet.{i}.part").write_bytes(b"z")
    assert in_process(SWEEP_TEMP_FILES, [dict(store=store)])[0] == {  # counts all, names the first 5
        "removed": 7, "first": ["a/.w0.parquet.0.part", "a/.w1.parquet.1.part", "a/.w2.parquet.2.part",
                                "a/.w3.parquet.3.part", "a/.w4.parquet.4.part"]}
    assert sweep_temp_files(store) == {"removed": 0, "first": []} and store.exists("a/b/keep.parquet")


def test_the_reports_unit_renders_the_receipt_as_written_and_refuses_another(tmp_path, built_sample):
    import shutil

    from tasks.report.write import write_receipt, write_reports

    out, _ = built_sample
    copy = tmp_path / "corpus"
    shutil.copytree(out, copy, symlinks=True)
    store = Store(str(copy))
    before = {rel: store.read_bytes(rel) for rel in (RECEIPT, REPORT, "report.html")}
    receipt = store.read_json(RECEIPT)
    for rel in (REPORT, "report.html"):
        store.remove(rel)
    calls = []

    class Recording:
        def __call__(self, unit, kwargs_list):
            calls.append((unit.name, kwargs_list))
            return in_process(unit, kwargs_list)

    written, report = write_receipt(store, receipt, fan_out=Recording())
    assert written == receipt and report.encode() == before[REPORT]
    assert {rel: store.read_bytes(rel) for rel in before} == before
    assert [name for name, _ in calls] == ["write-reports"]
    assert list(calls[0][1][0]["kwargs"]) == ["store", "receipt_sha256"]  # a keyed step (contract.step_call)
    with pytest.raises(ValueError, match="changed while the reports ran"):
        write_reports(store, "0" * 64)


@pytest.mark.s3
@pytest.mark.timeout(180)
def test_the_eval_caption_set_reads_input_captions_from_s3_as_from_a_disk(tmp_path, s3):
    """Captions on an object store come in one batch of ranged reads per staging shard, with
    the bytes of the local reads."""
    import s3fs

    store, release = _corpus(tmp_path, n=300, shards=3)
    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    fs.mkdir("corpusforge-eval")
    remote = Store("s3://corpusforge-eval/corpus", s3)
    for s in range(3):
        remote.write_bytes(staging_tar(f"{s:06d}"), store.read_bytes(staging_tar(f"{s:06d}")))
    cfg = EvalCaptionsConfig(size=25)
    local = write_eval_captions(store, write_test_assignment_list(store, release), cfg)
    from_s3 = write_eval_captions(store, write_test_assignment_list(store, release), cfg, source=remote)
    assert from_s3 == local and local["captions"] == 25
    # an empty caption is an empty span: no range request (S3 refuses an empty range)
    from tasks.captions.eval_captions import _read_spans

    assert _read_spans(remote, staging_tar("000000"), [(0, 0), (512, 4), (100, 0)]) == \
        [b"", store.read_bytes(staging_tar("000000"))[512:516], b""]
