"""S3 faults on a real loopback server (issue 14, scenario 9): the server stopped in the middle
of a run and restarted; an exception inside a writer. Afterwards no partial object lies at
any final key and every parquet file listed is readable. Servers pick free ports."""

from __future__ import annotations

import glob
import os
import tempfile
import threading

import pyarrow as pa
import pytest
import s3fs

from corpusforge.storage import Store
from tests.s3server import seaweedfs

pytestmark = [pytest.mark.scenario(9), pytest.mark.timeout(300)]


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


def test_server_stopped_mid_run_then_restarted(tmp_path):
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
