"""Shared fixtures: hermetic Prefect settings, one Prefect server, a loopback S3 server."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Hermetic settings before anything imports prefect or a model hub client.
_PREFECT_HOME = tempfile.mkdtemp(prefix="corpusforge-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def pytest_collection_modifyitems(config, items):
    """GPU tests are skipped where CUDA is absent."""
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
def sample_corpus(tmp_path_factory) -> Path:
    """A small deterministic sample corpus with planted duplicates and bad records."""
    from sample_corpus import write_sample_corpus

    out = tmp_path_factory.mktemp("sample")
    write_sample_corpus(str(out), n=160, seed=0)
    return out


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
    """Remember the outcome of every test marked ``@pytest.mark.scenario(n)``."""
    outcome = yield
    report = outcome.get_result()
    scenarios = [str(m.args[0]) for m in item.iter_markers("scenario")]
    if scenarios and (report.when == "call" or report.outcome != "passed"):
        if report.when != "teardown" or item.nodeid not in _MATRIX:
            _MATRIX[item.nodeid] = (sorted(set(scenarios), key=_scenario_order), report.outcome)


def _scenario_order(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1000, label)


def pytest_terminal_summary(terminalreporter):
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
