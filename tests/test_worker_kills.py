"""Killed Dask workers (issue 14, scenarios 1–3) on a real LocalCluster with 2 worker processes.

A worker process — not the build — sends itself SIGKILL at a chosen point
(:mod:`corpusforge.faults`, driven by ``CORPUSFORGE_FAULT``): while writing a staging
tar, when a shard's feature extraction starts, while writing a release tar, and right
after a shard's features were marked done. The nanny restarts the worker, Dask
reschedules the task, and the build must complete with outputs byte-equal to a build
without the fault and no temporary file left anywhere. With no retries left
(``distributed.scheduler.allowed-failures=0``) the Prefect run must end Failed or
Crashed within a bounded time, never hang or stay Running.
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import dask
import numpy as np
import pytest
from PIL import Image

from corpusforge.faults import ENV, ONCE_ENV
from flows.build_corpus import BuildConfig, build, run_build
from tests.output_tree import tree

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.kill, pytest.mark.timeout(480)]


def config(src: Path, out: Path, processes: bool = True) -> BuildConfig:
    return BuildConfig.model_validate({
        "source": str(src), "out": str(out), "input": {"partition_size": 8},
        "staging": {"shard_size": 8}, "splits": {"shard_size": 8, "val": 0.1, "test": 0.1},
        "near_dedup": {"collision": {"enabled": False}, "calibration": {"enabled": False}},
        "dask": {"n_workers": 2, "processes": True} if processes else {"n_workers": 1, "processes": False},
        "licenses": None})  # bare test images carry no licence (the allow-list: test_licenses.py)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """24 distinct smooth pictures in a folder."""
    src = tmp_path_factory.mktemp("kill-source")
    for i in range(24):
        coarse = np.random.default_rng(i).integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(coarse).resize((300, 260), Image.Resampling.BICUBIC).save(buf, "PNG")
        (src / f"{i:02d}.png").write_bytes(buf.getvalue())
    return src


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory, prefect_server) -> dict[str, str]:
    """The same build without any fault (in-process: the bytes do not depend on the workers)."""
    out = tmp_path_factory.mktemp("kill-reference") / "out"
    build(config(source, out, processes=False))
    return tree(out, drop=("out", "dask"))


POINTS = ("staging.write", "features.start", "features.done", "release.write")


@pytest.mark.scenario(1)
@pytest.mark.scenario(2)
def test_workers_killed_mid_stage_and_after_a_shard_then_the_flow_completes_with_fault_free_bytes(
        source, reference, tmp_path, monkeypatch):
    """One build, four kills: a worker dies while writing a staging tar, when a shard's
    feature extraction starts, right after a shard's features were marked done (scenario 2:
    the recomputation must be harmless) and while writing a release tar."""
    fired = tmp_path / "fired"
    fired.mkdir()
    monkeypatch.setenv(ENV, ",".join(f"{p}@*" for p in POINTS))
    monkeypatch.setenv(ONCE_ENV, str(fired))
    out = tmp_path / "out"
    run_build(config(source, out))
    assert sorted(p.name for p in fired.iterdir()) == sorted(POINTS), "a fault was not injected"
    assert tree(out, drop=("out", "dask")) == reference
    assert not [p for p in out.rglob("*.part")], "a killed writer's temp file stayed in the finished build"


def flow_runs(api_url: str, names: set[str], since: float) -> list[tuple[str, str]]:
    """(flow name, state type) of the runs of flows ``names`` created after ``since`` (epoch
    seconds). Filtered by flow name on the server and newest first: the session's Prefect
    server holds the runs of every other test too, and a run that crashed before it started
    has no start time."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    async def read():
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=sorted(names))),
                                               sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200)
            flows = {f.id: f.name for f in await client.read_flows(
                flow_filter=FlowFilter(name=FlowFilterName(any_=sorted(names))))}
            return [(flows[r.flow_id], r.state_type.value) for r in runs
                    if r.created is not None and r.created.timestamp() >= since]

    return asyncio.run(read())


@pytest.mark.scenario(3)
def test_with_no_retries_left_the_run_ends_failed_in_bounded_time(source, tmp_path, monkeypatch, prefect_server):
    monkeypatch.setenv(ENV, "features.start@*")  # every attempt dies: no ONCE file
    started = time.time()
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), pytest.raises(Exception) as failure:
        run_build(config(source, tmp_path / "out"))
    elapsed = time.time() - started
    assert elapsed < 180, f"the failed run took {elapsed:.0f} s to end"
    assert "KilledWorker" in repr(failure.value) or "killed" in str(failure.value).lower(), repr(failure.value)
    runs = flow_runs(prefect_server, {"build-corpus", "build-corpus-on-dask"}, started - 1)
    assert {name for name, _ in runs} == {"build-corpus", "build-corpus-on-dask"}, runs
    assert all(state in ("FAILED", "CRASHED") for _, state in runs), runs
    assert not (tmp_path / "out" / "receipt.json").exists()
