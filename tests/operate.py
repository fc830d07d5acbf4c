"""Helpers for the tests that operate corpusforge as its users do: a real Prefect server
with its UI on loopback, a process worker, headless Chromium (Debian's, driven by
Playwright; never a downloaded browser), and where test artifacts (screenshots) go."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CORPUSFORGE_CHROMIUM", "/usr/bin/chromium")
# As root in a container with no network: no sandbox, no GPU, no background connections.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def artifacts_dir() -> Path:
    """Where tests keep what a person may want to look at (screenshots): test-artifacts/."""
    path = Path(os.environ.get("CORPUSFORGE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium_or_skip() -> str:
    """Debian's Chromium for Playwright, or a skip that says exactly what is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium; .ci/run does this)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright (Python) not installed: pip install -e '.[test]'")
    return CHROMIUM


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    path = chromium_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child process talking to one given server: no Prefect or
    Dask setting leaks in from this test session."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DASK_"))}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               PREFECT_LOGGING_LEVEL="INFO")
    env.update(extra)
    return env


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    """End a process group this test started, politely first."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def prefect_server_with_ui(home: Path, timeout: float = 180, database: str | None = None) -> Iterator[str]:
    """``prefect server start`` on a free loopback port, UI included, on SQLite under
    ``home`` or on the ``database`` URL (PostgreSQL: ``postgresql+asyncpg://…``); yields
    the API URL."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = clean_env(PREFECT_HOME=str(home), PREFECT_UI_API_URL=api, PREFECT_SERVER_API_PORT=str(port),
                    PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_LOGGING_LEVEL="WARNING")
    if database:
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not start: {(home / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
        yield api
    finally:
        stop(proc)
        log.close()


def prefect_cli() -> str:
    return shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"


def wait_for_run(api: str, run_id: str, timeout: float = 420) -> dict[str, Any]:
    """Poll a flow run until it is final; return it."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        run = httpx.get(f"{api}/flow_runs/{run_id}", timeout=10).json()
        if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"flow run {run_id} still {run['state_type']} after {timeout}s")
        time.sleep(2)


def child_runs(api: str, parent_id: str) -> list[dict[str, Any]]:
    import httpx

    return httpx.post(f"{api}/flow_runs/filter", timeout=10,
                      json={"flow_runs": {"parent_flow_run_id": {"any_": [parent_id]}}}).json()


def run_logs(api: str, run_ids: list[str]) -> list[str]:
    import httpx

    rows = httpx.post(f"{api}/logs/filter", timeout=10,
                      json={"logs": {"flow_run_id": {"any_": run_ids}}, "limit": 200, "sort": "TIMESTAMP_ASC"}).json()
    return [r["message"] for r in rows]
