"""S3 faults on a real loopback server (issue 14, scenario 9): the server stopped in the middle
of a run and restarted; an exception inside a writer. Afterwards no partial object lies at
any final key and every parquet file listed is readable. Servers pick free ports."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import s3fs

from corpusforge.storage import Store
from tests.output_tree import compared_hashes

pytestmark = [pytest.mark.scenario(9), pytest.mark.timeout(600)]


def _fs(options: dict) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**options, skip_instance_cache=True)


def _local_parts() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "corpusforge-*.part")))


def test_exception_inside_a_writer_leaves_no_object_and_no_temp_file(s3):
    _fs(s3).mkdir("cf-faults-writer")
    store = Store("s3://cf-faults-writer/out", storage_options=s3)
    before = _local_parts()
    with pytest.raises(RuntimeError, match="boom"):
        with store.atomic_write("staging/000000.tar") as f:
            f.write(b"x" * (6 << 20))  # past a multipart chunk
            raise RuntimeError("boom")
    assert not _fs(s3).exists("cf-faults-writer/out/staging/000000.tar")
    assert _fs(s3).find("cf-faults-writer") == []
    assert _local_parts() == before


def test_server_stopped_mid_run_then_restarted(tmp_path, seaweedfs):
    data = tmp_path / "weed"
    data.mkdir()
    table = pa.table({"x": list(range(100))})
    with seaweedfs(data) as options:
        port = int(options["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
        _fs(options).mkdir("cf-faults-restart")
        store = Store("s3://cf-faults-restart/out", storage_options=options)
        store.write_parquet("a/000.parquet", table)
    # the server is down: a write fails with a clear error within bounded time, nothing hangs
    failed: list[BaseException] = []

    def write_while_down() -> None:
        try:
            Store("s3://cf-faults-restart/out", storage_options=options).write_parquet("a/001.parquet", table)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            failed.append(exc)

    worker = threading.Thread(target=write_while_down, daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "a write to a stopped server hung"
    assert failed, "a write to a stopped server did not fail"
    with seaweedfs(data, s3_port=port) as options:
        fs = _fs(options)
        listed = sorted(fs.find("cf-faults-restart"))
        assert listed == ["cf-faults-restart/out/a/000.parquet"]  # no partial object at the failed key
        store = Store("s3://cf-faults-restart/out", storage_options=options)
        store.write_parquet("a/001.parquet", table)  # the rerun completes the run
        for key in fs.find("cf-faults-restart"):
            assert store.read_parquet(key.split("/out/", 1)[1]).equals(table)


def _pictures(folder) -> None:
    """16 distinct smooth pictures."""
    import io

    import numpy as np
    from PIL import Image

    folder.mkdir()
    for i in range(16):
        coarse = np.random.default_rng(i).integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(coarse).resize((300, 260), Image.Resampling.BICUBIC).save(buf, "PNG")
        (folder / f"{i:02d}.png").write_bytes(buf.getvalue())



def _outputs(fs: s3fs.S3FileSystem, root: str) -> dict[str, str]:
    """The compared hashes of an output root on S3."""
    return compared_hashes([key[len(root) + 1:] for key in fs.find(root)], lambda rel: fs.cat_file(f"{root}/{rel}"))


@pytest.mark.slow
@pytest.mark.long
def test_whole_build_with_the_server_stopped_mid_run_then_rerun(tmp_path, prefect_server, seaweedfs):
    """The S3 server stops once the first staging shard is marked done: the build fails in
    bounded time (no hang, Failed in Prefect); after a restart the rerun completes and equals
    an uninterrupted build byte for byte, with only whole, readable objects."""
    import pyarrow.parquet as pq

    from flows.build_corpus import BuildConfig, run_build
    from tests.test_worker_kills import flow_runs

    source = tmp_path / "src"
    _pictures(source)
    data = tmp_path / "weed"
    data.mkdir()

    def config(out: str, options: dict) -> BuildConfig:
        return BuildConfig.model_validate({
            "source": str(source), "out": out, "storage_options": options, "input": {"partition_size": 4},
            "staging": {"shard_size": 2}, "splits": {"shard_size": 8, "val": 0.1, "test": 0.1},
            "near_dedup": {"collision": {"enabled": False}, "calibration": {"enabled": False}},
            "dask": {"n_workers": 1, "processes": False},
            "licenses": None})  # bare test images carry no licence (the allow-list: test_licenses.py)

    failed: list[BaseException] = []
    with seaweedfs(data) as options:
        port = int(options["client_kwargs"]["endpoint_url"].rsplit(":", 1)[1])
        fs = _fs(options)
        fs.mkdir("cf-faults-build")

        def build_in_thread() -> None:
            try:
                run_build(config("s3://cf-faults-build/out", options))
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                failed.append(exc)

        started = time.time()
        runner = threading.Thread(target=build_in_thread, daemon=True)
        runner.start()
        deadline = time.monotonic() + 120
        while runner.is_alive() and time.monotonic() < deadline \
                and not fs.find("cf-faults-build/out/_markers/staging"):
            time.sleep(0.2)
            fs.invalidate_cache()
        assert runner.is_alive(), "the build ended before the first staging shard: cannot stop the server there"
    stopped = time.monotonic()  # the server is down from here
    runner.join(180)
    assert not runner.is_alive(), "the build hung with the S3 server down"
    assert failed, "the build did not fail with the S3 server down"
    print(f"failed {time.monotonic() - stopped:.1f} s after the server stopped: {failed[0]!r:.200}")
    states = flow_runs(prefect_server, {"build-corpus"}, started - 1)
    assert states and all(state in ("FAILED", "CRASHED") for _, state in states), states

    with seaweedfs(data, s3_port=port) as options:
        fs = _fs(options)
        assert not fs.exists("cf-faults-build/out/receipt.json")
        run_build(config("s3://cf-faults-build/out", options))  # the rerun completes
        run_build(config("s3://cf-faults-build/fresh", options))  # an uninterrupted build
        fs.invalidate_cache()
        rerun, fresh = _outputs(fs, "cf-faults-build/out"), _outputs(fs, "cf-faults-build/fresh")
        assert rerun == fresh
        assert any(rel.endswith(".tar") for rel in rerun) and "receipt.json" in rerun
        for key in fs.find("cf-faults-build/out"):
            assert not key.endswith(".part")
            if key.endswith(".parquet"):
                with fs.open(key) as f:
                    pq.read_table(f)  # every parquet file listed is readable


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A real 2 MiB file system (tmpfs), so a build runs out of space as on a full disk."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {exc}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _one_line(proc: subprocess.CompletedProcess, pattern: str) -> str:
    """The run failed (exit 1) with ``pattern`` as its last stderr line, no traceback printed,
    and the log the line names holds the detail; returns the line."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    match = re.fullmatch(rf"{pattern}; details in (\S+\.log)", last)
    assert match, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and '  File "' not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.startswith("corpusforge build:")] == [last]
    log = Path(match.group(1))
    assert "Traceback (most recent call last)" in log.read_text()
    log.unlink()
    return last


@pytest.mark.scenario(14)
@pytest.mark.slow
def test_full_disk_is_one_line_naming_the_path(small_disk, sample_corpus, tmp_path, prefect_server, cli):
    """A build whose output disk fills ends with one line naming the file it was writing and
    a hint, exit code 1, instead of ~345 lines of tracebacks ending in ``[Errno 28]``; the
    tracebacks go to the log the line names (and the run's log in Prefect)."""
    out = small_disk / "corpus"
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"dask": {"n_workers": 1, "processes": False}, "near_dedup": None,
                                  "features": {"models": []}, "reference_stats": None}))
    proc = subprocess.run([*cli, "build", "--source", str(sample_corpus),
                           "--out", str(out), "--config", str(config)], capture_output=True, text=True,
                          timeout=500, env={**os.environ, "PREFECT_API_URL": prefect_server,
                                            "PREFECT_LOGGING_LEVEL": "INFO"})
    _one_line(proc, rf"corpusforge build: error: no space left on device writing {re.escape(str(out))}/\S+: "
                    "free space there or choose another --out")


@pytest.mark.scenario(9)
@pytest.mark.slow
@pytest.mark.long
def test_s3_outage_mid_build_is_one_line_naming_the_endpoint_and_object(tmp_path, seaweedfs, sample_corpus,
                                                                         prefect_server):
    """`corpusforge build` into S3, the server stopped once the first staging shard is marked
    done: one line naming the cause, the endpoint and the object being read or written, exit
    code 1, instead of ~460 lines of tracebacks."""
    from tests.cli_s3 import corpusforge, s3_env

    data = tmp_path / "weed"
    data.mkdir()
    config = tmp_path / "config.json"  # one attempt per request: the run fails in seconds, not a minute
    config.write_text(json.dumps({"dask": {"n_workers": 1, "processes": True}, "near_dedup": None,
                                  "features": {"models": []}, "reference_stats": None,
                                  "storage_options": {"config_kwargs": {"retries": {"total_max_attempts": 1}}}}))
    with seaweedfs(data) as options:
        endpoint = options["client_kwargs"]["endpoint_url"]
        fs = _fs(options)
        fs.mkdir("cf-outage")
        proc = subprocess.Popen([corpusforge(), "build", "--source", str(sample_corpus), "--out", "s3://cf-outage/out",
                                 "--config", str(config)], env=s3_env(options, prefect_server), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and not fs.find("cf-outage/out/_markers/staging"):
            time.sleep(0.2)
        assert proc.poll() is None, "the build ended before its first staging shard: cannot stop the server there"
    stdout, stderr = proc.communicate(timeout=300)  # the server is down from here
    _one_line(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
              rf"corpusforge build: error: storage unreachable \(cannot connect to {re.escape(endpoint)}\) at "
              r"s3://cf-outage/out\S*: rerun once it answers \(finished units are kept\)")
