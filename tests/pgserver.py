"""A real PostgreSQL server on loopback for the tests (Debian's ``postgresql`` package:
``initdb`` and ``pg_ctl``; ``.ci/run`` installs it on a fresh machine).

PostgreSQL refuses to run as root: as root (CI), the cluster belongs to ``nobody`` and
its commands run through ``runuser``."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operate import free_port


def postgres_bin_or_skip() -> Path:
    """The folder of ``initdb`` and ``pg_ctl``, or a skip that says what is missing."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.skip("PostgreSQL not installed (apt-get install -y postgresql; .ci/run does this)")
    return Path(found[-1]).parent


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A fresh PostgreSQL cluster in a temporary folder; yields the Prefect database URL
    (``postgresql+asyncpg://postgres@127.0.0.1:PORT/postgres``, trusted local access)."""
    bindir = postgres_bin_or_skip()
    as_root = os.geteuid() == 0
    home = Path(tempfile.mkdtemp(prefix="corpusforge-pg-"))  # under /tmp: reachable by nobody
    data = home / "data"
    if as_root:
        shutil.chown(home, "nobody", "nogroup")
    run_as = ["runuser", "-u", "nobody", "--"] if as_root else []
    port = free_port()
    subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                    "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={home} -c fsync=off"
    subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(home / "server.log"),
                    "-o", options, "-w", "-t", "120", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
