"""Shared fixtures: hermetic Prefect settings, the two test tiers (fast, and integration
marked from the fixtures that start servers), one Prefect server, a loopback S3 server."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Hermetic settings before anything imports prefect or a model hub client.
# Each pytest-xdist worker gets its own home: it inherits the main process's environment, and
# two session servers on one home share one SQLite database (each sees the other's runs).
if "PREFECT_HOME" not in os.environ or os.environ.get("CORPUSFORGE_TEST_PREFECT_HOME") == os.environ["PREFECT_HOME"]:
    os.environ["PREFECT_HOME"] = os.environ["CORPUSFORGE_TEST_PREFECT_HOME"] = tempfile.mkdtemp(
        prefix="corpusforge-prefect-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


# ---- the two tiers: the fast tier (no servers) and the integration tests --------------------------
#
# A fixture below that starts a server, worker processes, a browser or the CLI in a subprocess
# is listed here; a test using one, directly or through other fixtures, is marked
# ``integration`` at collection, so nobody has to remember the marker. The fast tier is
# ``-m "not integration and not slow and not gpu"`` (``make test-fast``); a test outside it that
# starts a server anyway fails (``_no_servers_in_the_fast_tier``), naming these fixtures.
INTEGRATION_FIXTURES = frozenset({
    "prefect_server",  # a Prefect API server (subprocess); flows and Dask workers report to it
    "s3",  # SeaweedFS on loopback, for the session
    "seaweedfs",  # SeaweedFS servers the test starts and stops itself
    "local_cluster",  # Dask LocalClusters with worker processes
    "cli",  # the corpusforge command line in a subprocess
    "chromium",  # headless Chromium through Playwright
    "prefect_server_with_ui",  # `prefect server start` with its UI, started by the test
    "postgres",  # a PostgreSQL cluster started by the test
    "http_hosts",  # the loopback image hosts (sample_corpus/http_hosts.py), a server process
})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests using an integration fixture are marked ``integration`` (before ``-m`` selects);
    GPU tests are skipped where CUDA is absent."""
    for item in items:
        if INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """One real Prefect server for the session; flows and Dask workers report to it."""
    from corpusforge.cluster import prefect_api

    with prefect_api() as url:
        yield url


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> Iterator[dict]:
    """A real S3-compatible server (SeaweedFS) on loopback; yields fsspec storage options."""
    from tests.s3server import seaweedfs

    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as options:
        yield options


@pytest.fixture(scope="session")
def seaweedfs() -> Callable[..., Any]:
    """For tests that start and stop SeaweedFS themselves: ``with seaweedfs(folder) as options``."""
    from tests.s3server import seaweedfs as start

    return start


@pytest.fixture
def local_cluster() -> Iterator[Callable[..., Any]]:
    """Dask LocalClusters with real worker processes, ``local_cluster(n_workers=2)``, closed
    after the test."""
    from distributed import LocalCluster

    started: list[LocalCluster] = []

    def start(**kwargs: Any) -> LocalCluster:
        started.append(LocalCluster(**{"processes": True, "dashboard_address": None, **kwargs}))
        return started[-1]

    yield start
    for cluster in started:
        cluster.close()


@pytest.fixture(scope="session")
def cli() -> list[str]:
    """The ``corpusforge`` command line as a subprocess's argv prefix (a user's process:
    its own imports, environment and exit code)."""
    return [sys.executable, "-m", "flows.cli"]


@pytest.fixture
def http_hosts() -> Callable[..., Any]:
    """For tests that fetch from loopback image hosts: ``with http_hosts(folder, hosts, images) as h``
    (``tests.http_hosts.serving``: a real server process; each 127.0.0.x address a host)."""
    from tests.http_hosts import serving

    return serving


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium for tests that drive it headless (``tests.operate.browser``), or a
    skip naming what is missing."""
    from tests.operate import chromium_or_skip

    return chromium_or_skip()


@pytest.fixture(scope="session")
def prefect_server_with_ui() -> Callable[..., Any]:
    """For tests that start ``prefect server start`` (UI included) themselves."""
    from tests.operate import prefect_server_with_ui as start

    return start


@pytest.fixture(scope="session")
def postgres() -> Callable[..., Any]:
    """For tests that start a PostgreSQL cluster themselves: ``with postgres() as url``."""
    from tests.pgserver import postgres as start

    return start


# Programs (argv[0]'s name) and ``python -m`` modules that are servers, browsers or the CLI.
_SERVER_PROGRAMS = frozenset({"prefect", "weed", "dask", "corpusforge", "node", "chromium", "initdb", "pg_ctl",
                              "runuser"})
_SERVER_MODULES = frozenset({"uvicorn", "flows.cli", "prefect"})


@pytest.fixture(autouse=True)
def _no_servers_in_the_fast_tier(request, monkeypatch) -> None:
    """A test not marked ``integration`` may start no server, no worker process and no CLI
    subprocess: it fails, naming the fixtures that would mark it. (A flow run without a
    Prefect API starts a temporary server; a Dask cluster with ``processes=True`` starts
    worker processes.)"""
    if request.node.get_closest_marker("integration"):
        return

    def refuse(what: str) -> None:
        raise RuntimeError(f"{request.node.nodeid} starts {what} but uses none of the fixtures that mark an "
                           f"integration test: request one of {sorted(INTEGRATION_FIXTURES)} (tests/conftest.py)")

    real_popen = subprocess.Popen.__init__

    def popen(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
        module = argv[2] if len(argv) > 2 and argv[1] == "-m" else None
        if Path(argv[0]).name in _SERVER_PROGRAMS or module in _SERVER_MODULES:
            refuse(f"`{' '.join(argv[:3])}`")
        real_popen(self, args, *rest, **kwargs)

    def start(self: multiprocessing.process.BaseProcess) -> None:
        refuse(f"a worker process ({self.name})")

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory) -> Path:
    """A small deterministic sample corpus with planted duplicates and bad records."""
    from sample_corpus import write_sample_corpus

    out = tmp_path_factory.mktemp("sample")
    write_sample_corpus(str(out), n=160, seed=0)
    return out


@pytest.fixture(scope="session")
def built_sample(sample_corpus, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """The sample corpus built once for the session, in-process by the build flow's own
    function (``tests/built_sample.py``'s settings): (output root, the build's result). The
    end-to-end tests read it; a test that changes it works on a copy. Its bytes are those of
    a build on any Dask cluster (test_build_e2e.py checks that)."""
    from flows.build_corpus import build
    from tests.built_sample import config

    out = tmp_path_factory.mktemp("built-sample") / "corpus"
    return out, build(config(sample_corpus, out))


@pytest.fixture
def opened_files(monkeypatch) -> list[str]:
    """The paths (relative to their root) every :class:`corpusforge.storage.Store` opens
    from now on, in order: what a step reads, counted."""
    from corpusforge.storage import Store

    opened: list[str] = []
    real_open = Store.open

    def counting_open(self: Store, rel: str, mode: str = "rb"):
        opened.append(rel)
        return real_open(self, rel, mode)

    monkeypatch.setattr(Store, "open", counting_open)
    return opened


# ---- the fault and hostile-input matrix (issue 14): a summary table at the end of the run ----------

_MATRIX: dict[str, tuple[list[str], str]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test marked ``@pytest.mark.scenario(n)`` carries its scenarios on its reports, which
    reach the process that prints the table (the main one, also under pytest-xdist)."""
    outcome = yield
    scenarios = {str(m.args[0]) for m in item.iter_markers("scenario")}
    if scenarios:
        outcome.get_result().user_properties.append(("scenarios", sorted(scenarios, key=_scenario_order)))


def pytest_runtest_logreport(report) -> None:
    """Remember the outcome of every scenario test."""
    scenarios = dict(report.user_properties).get("scenarios")
    if scenarios and (report.when == "call" or report.outcome != "passed"):
        if report.when != "teardown" or report.nodeid not in _MATRIX:
            _MATRIX[report.nodeid] = (scenarios, report.outcome)


def _scenario_order(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1000, label)


_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session) -> None:
    session.config.stash[_STARTED] = time.perf_counter()


_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def pytest_terminal_summary(terminalreporter, config):
    """The fast tier's time, and the fault and hostile-input matrix."""
    _fast_tier_time(terminalreporter, config)
    _matrix_table(terminalreporter)


def _fast_tier_time(terminalreporter, config) -> None:
    """A run that leaves out the integration and slow tests is the fast tier: its wall time,
    collection included. Any other run: the not-integration tests' own time (setup, call,
    teardown)."""
    reports = [r for k in (*_OUTCOMES, "") for r in terminalreporter.stats.get(k, [])]  # "": passed setups
    fast = [r for r in reports if isinstance(r, pytest.TestReport) and "integration" not in r.keywords]
    tests = len({r.nodeid for r in fast if r.when == "call" or r.outcome != "passed"})
    if not tests:
        return
    wall = time.perf_counter() - config.stash[_STARTED]
    markexpr = config.getoption("markexpr") or ""
    if "not integration" in markexpr and "not slow" in markexpr:
        terminalreporter.write_line(f"fast tier: {tests} tests in {wall:.0f} s (wall time, collection included)")
    else:
        own = sum(r.duration for r in fast)
        terminalreporter.write_line(f"fast tier: {tests} not-integration tests took {own:.0f} s of this "
                                    f"{wall:.0f} s run (their setup, call and teardown)")


def _matrix_table(terminalreporter) -> None:
    """Print scenario → test → outcome for the matrix tests that ran (see docs/faults.md)."""
    if not _MATRIX:
        return
    rows = sorted(((s, nodeid, outcome) for nodeid, (scenarios, outcome) in _MATRIX.items() for s in scenarios),
                  key=lambda r: (_scenario_order(r[0]), r[1]))
    terminalreporter.section("fault and hostile-input matrix (issue 14)")
    for scenario, nodeid, outcome in rows:
        terminalreporter.write_line(f"{scenario:>8}  {outcome:<8}  {nodeid}")
    counts = {o: sum(1 for r in rows if r[2] == o) for o in sorted({r[2] for r in rows})}
    terminalreporter.write_line(f"scenarios covered: {len({r[0] for r in rows})}; " +
                                ", ".join(f"{n} {o}" for o, n in counts.items()))
