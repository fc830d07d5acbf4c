"""Where the work runs: embedded LocalCluster, an existing scheduler, or one worker per GPU."""

from __future__ import annotations

import importlib.util

import pytest
from pydantic import BaseModel

from corpusforge import cluster
from corpusforge.cluster import DaskConfig, cluster_choice, task_runner, visible_gpus


def test_embedded_local_cluster_by_default_on_a_cpu_machine():
    if visible_gpus():
        pytest.skip("this machine has GPUs")
    name, kwargs = cluster_choice(DaskConfig(n_workers=3, threads_per_worker=2))
    assert name == "distributed.LocalCluster"
    assert kwargs["n_workers"] == 3 and kwargs["threads_per_worker"] == 2


def test_existing_scheduler_address_wins():
    runner = task_runner(DaskConfig(address="tcp://10.0.0.1:8786", gpu="on"))
    assert runner.address == "tcp://10.0.0.1:8786"


def test_gpu_on_asks_for_one_worker_per_gpu():
    if importlib.util.find_spec("dask_cuda") is None:
        with pytest.raises(RuntimeError, match="corpusforge\\[gpu\\]"):
            cluster_choice(DaskConfig(gpu="on"))
        return
    name, kwargs = cluster_choice(DaskConfig(gpu="on"))
    assert name == "dask_cuda.LocalCUDACluster"
    assert "n_workers" not in kwargs  # one per visible GPU, decided by dask-cuda


def test_the_task_runner_looks_for_gpus_only_when_it_starts_a_cluster(monkeypatch):
    """Looking for GPUs imports torch (seconds): a run whose units are all current never
    starts the cluster, so building its task runner must not look."""
    def looked() -> int:
        raise AssertionError("looked for GPUs")

    monkeypatch.setattr(cluster, "visible_gpus", looked)
    runner = task_runner(DaskConfig(gpu="auto"))
    assert runner.cluster_class is cluster.start_embedded_cluster and runner._cluster is None


def test_unknown_keys_are_rejected():
    with pytest.raises(ValueError):
        DaskConfig(workers=4)


@pytest.mark.gpu
def test_gpu_auto_detects_devices():
    assert visible_gpus() > 0
    assert cluster_choice(DaskConfig())[0] == "dask_cuda.LocalCUDACluster"


# ---- batches of units (issue 22): one Prefect task run per batch ---------------------------------

def test_batch_count_keeps_every_worker_busy_and_bounds_task_runs():
    from corpusforge.cluster import MAX_BATCHES, UNITS_PER_BATCH, batch_count

    assert batch_count(1, slots=8) == 1
    assert batch_count(5, slots=2) == 5  # a small fan-out: one unit per task run, as before
    assert batch_count(96, slots=2) == 8  # four batches per worker thread
    assert batch_count(100 * UNITS_PER_BATCH, slots=2) == 100  # at most UNITS_PER_BATCH units a batch...
    assert batch_count(10**5, slots=2) == batch_count(10**6, slots=1000) == MAX_BATCHES  # ...up to the cap


def test_batches_are_consecutive_balanced_and_keep_the_order():
    from corpusforge.cluster import batches

    calls = [{"i": i} for i in range(10)]
    parts = batches(calls, 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    assert [c for p in parts for c in p] == calls
    assert batches(calls[:2], 2) == [[{"i": 0}], [{"i": 1}]]


def square(x: int, folder: str, fail_once: int) -> int:
    """A unit under the stage contract: its marker makes a second call skip the work."""
    from pathlib import Path

    from corpusforge.contract import must_compute

    root = Path(folder)
    with open(root / "calls", "a") as f:
        f.write(f"{x}\n")
    marker = root / f"done-{x}"
    if marker.exists():
        return int(marker.read_text())
    must_compute()  # probed (as_task(probe=True)): a unit without its marker stops here
    if x == fail_once and not (root / "failed").exists():
        (root / "failed").touch()
        raise ConnectionResetError(104, "connection reset by peer")  # transient: the batch is retried
    if x < 0:
        raise ValueError("a bad unit")  # not transient: fails the stage at once
    with open(root / "work", "a") as f:
        f.write(f"{x}\n")
    marker.write_text(str(x * x))
    return x * x


def _fan_out(calls: list[dict], probe: bool = False) -> tuple[list[int], object]:
    """(results, flow run id) of a flow running ``calls`` of :func:`square` on a LocalCluster."""
    from prefect import flow

    from corpusforge.cluster import as_task, dask_config, run_tasks

    square_task = as_task(square, "square", retry_delay_seconds=0, probe=probe)
    config = DaskConfig(n_workers=1, processes=False, gpu="off")

    @flow(task_runner=task_runner(config))
    def fan_out() -> list[int]:
        with dask_config(config):
            return run_tasks(square_task, calls)

    state = fan_out(return_state=True)
    return state.result(), state.state_details.flow_run_id


def task_runs(flow_run_ids: list) -> list:
    """The task runs of these flow runs, from the Prefect API."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids)))

    return asyncio.run(read())


@pytest.mark.timeout(180)
def test_a_retried_batch_redoes_only_its_unfinished_units(tmp_path, prefect_server):
    """10 units on one worker thread: 4 task runs of 3, 3, 2, 2 units. Unit 4 (the second
    of batch 2) fails once with a transient error: batch 2 runs again, unit 3 skips by its
    marker, and every unit's work is done exactly once; results keep their order."""
    n = 10
    results, flow_run = _fan_out([dict(x=x, folder=str(tmp_path), fail_once=4) for x in range(n)])
    assert results == [x * x for x in range(n)]
    work = sorted(int(x) for x in (tmp_path / "work").read_text().split())
    assert work == list(range(n)), "a unit's work ran twice or never"
    calls = [int(x) for x in (tmp_path / "calls").read_text().split()]
    assert sorted(calls) == sorted([*range(n), 3, 4]), "the retry called more than its own batch's units"
    runs = {r.name: r for r in task_runs([flow_run])}
    assert sorted(runs) == [f"square {i}/4" for i in range(1, 5)]
    assert runs["square 2/4"].run_count == 2 and all(r.run_count == 1 for k, r in runs.items() if k != "square 2/4")
    assert all(r.state_type.value == "COMPLETED" for r in runs.values())


@pytest.mark.timeout(180)
def test_a_probed_fan_out_spends_task_runs_only_on_units_that_compute(tmp_path, prefect_server):
    """A rerun after 6 of 10 units finished: the flow probes every unit, returns the 6
    current ones itself, and only the other 4 become task runs (one each: 4 units on one
    worker thread); results keep their order, and no unit's work runs twice."""
    n = 10
    first, _ = _fan_out([dict(x=x, folder=str(tmp_path), fail_once=99) for x in range(6)], probe=True)
    assert first == [x * x for x in range(6)]
    results, flow_run = _fan_out([dict(x=x, folder=str(tmp_path), fail_once=99) for x in range(n)], probe=True)
    assert results == [x * x for x in range(n)]
    assert sorted(int(x) for x in (tmp_path / "work").read_text().split()) == list(range(n))
    runs = task_runs([flow_run])
    assert sorted(r.name for r in runs) == [f"square {i}/4" for i in range(1, 5)]
    again, flow_run = _fan_out([dict(x=x, folder=str(tmp_path), fail_once=99) for x in range(n)], probe=True)
    assert again == results and task_runs([flow_run]) == [], "a rerun that changes nothing made task runs"


@pytest.mark.timeout(180)
def test_a_unit_failing_for_good_fails_the_stage_without_retrying(tmp_path, prefect_server):
    calls = [dict(x=x, folder=str(tmp_path), fail_once=99) for x in (1, -1, 2, 3)]
    with pytest.raises(ValueError, match="a bad unit"):
        _fan_out(calls)[0]
    assert (tmp_path / "calls").read_text().split().count("-1") == 1, "a non-transient error was retried"


def build_task_runs(out: str) -> list:
    """The task runs of the builds of ``out`` (their work subflow runs), from the Prefect API."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    async def read():
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["build-corpus-on-dask"])))
            return [r.id for r in runs if r.parameters["config"]["out"] == out]

    return task_runs(asyncio.run(read()))


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_a_build_runs_its_units_in_batches_and_stays_under_the_task_run_bound(sample_corpus, tmp_path, prefect_server):
    """A build of 160 records into 20 partitions and 20 staging shards on 2 worker threads:
    each fan-out is at most 8 task runs (``{task} i/n``), and with at most MAX_BATCHES task
    runs per fan-out, a build of any size stays under 20,000 task runs."""
    import re
    from collections import defaultdict

    from corpusforge.cluster import MAX_BATCHES, batch_count
    from corpusforge.layout import STAGING_TARS
    from flows.build_corpus import BuildConfig, run_build

    out = str(tmp_path / "out")
    config = BuildConfig.model_validate({
        "source": str(sample_corpus), "out": out, "input": {"partition_size": 8}, "staging": {"shard_size": 8},
        "splits": {"shard_size": 8, "val": 0.1, "test": 0.15},
        "near_dedup": {"collision": {"enabled": False}, "calibration": {"enabled": False}},
        "dask": {"n_workers": 2, "processes": False}})
    run_build(config)
    fan_outs: dict[str, set[int]] = defaultdict(set)  # (task, n) -> batches seen
    calls, single = 0, []
    for run in build_task_runs(out):
        match = re.fullmatch(r"(.+) (\d+)/(\d+)", run.name)
        if not match:  # the graph stage submits its decisions task itself: one run at any size
            single.append(run.name.rsplit("-", 1)[0])
            continue
        name, i, n = match[1], int(match[2]), int(match[3])
        fan_outs[f"{name} /{n}"].add(i)
        calls += i == 1
    shards = len(list((tmp_path / "out" / STAGING_TARS).glob("*.tar")))
    assert shards >= 16
    assert fan_outs["write-staging-shard /8"] == set(range(1, 9)) == set(range(1, batch_count(shards, 2) + 1))
    assert fan_outs["ingest-partition /8"] == set(range(1, 9))
    assert single == ["graph-decisions"]
    bound = calls * MAX_BATCHES + len(single)
    print(f"{calls} fan-outs, {sum(map(len, fan_outs.values())) + len(single)} task runs; at most {bound} at any size")
    assert bound <= 20_000

    # A rerun that changes nothing, the first into this root: every unit and step is probed by
    # the flow, the version is already kept (the build kept it when it ended) and the account of
    # a version compared with itself needs no read, so no task run at all.
    first = {run.id for run in build_task_runs(out)}
    run_build(config)
    rerun = {re.sub(r"( \d+/\d+|-[0-9a-f]{3})$", "", run.name) for run in build_task_runs(out) if run.id not in first}
    assert rerun == set(), sorted(rerun)


def say(x: int, tag: str) -> int:
    """A unit that writes a line through the stage logger (as stages do)."""
    from corpusforge.logs import stage_logger

    stage_logger().warning("%s unit %d", tag, x)  # the tests log warnings and up
    return x


class _SayConfig(BaseModel):
    tag: str
    dask: DaskConfig


def _say_all(config: _SayConfig) -> int:
    from corpusforge.cluster import fan_out
    from corpusforge.contract import Unit
    from corpusforge.logs import stage_logger

    stage_logger().warning("%s flow", config.tag)
    return sum(fan_out(Unit(say, "say"), [dict(x=x, tag=config.tag) for x in range(2)]))


def test_importing_the_adapter_installs_no_logger():
    """Importing modules has no side effect: the run logger is installed where a run starts."""
    import subprocess
    import sys

    code = ("import corpusforge.cluster, corpusforge.progress, flows.build_corpus, flows.cli, corpusforge.logs as l\n"
            "print(l._provider)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "None", done.stderr[-2000:]


@pytest.mark.timeout(180)
def test_stage_lines_reach_the_run_logs_from_the_flow_and_from_worker_processes(tmp_path, prefect_server):
    """The flow's entry and each task run on a worker process install the run logger: a
    stage's lines are in the flow run's log and in each task run's log."""
    import time

    from corpusforge.cluster import cluster_flow
    from tests.operate import child_runs, run_logs

    flow, _ = cluster_flow(_say_all, "say-hello")
    tag = f"hello-{tmp_path.name}"
    state = flow(_SayConfig(tag=tag, dask=DaskConfig(n_workers=1, processes=True, gpu="off")), return_state=True)
    assert state.result() == 1
    parent = str(state.state_details.flow_run_id)
    ids = [parent, *(r["id"] for r in child_runs(prefect_server, parent))]
    for _ in range(30):  # the workers ship their logs in batches
        said = {m for m in run_logs(prefect_server, ids) if m.startswith(tag)}
        if len(said) == 3:
            break
        time.sleep(1)
    assert said == {f"{tag} flow", f"{tag} unit 0", f"{tag} unit 1"}


def test_the_probes_of_every_fan_out_share_one_pool_of_threads():
    """A pool per fan-out started up to PROBE_THREADS threads again for each one (243 thread
    starts in a settled no-op rerun of 2,400 pictures): now the same threads probe them all."""
    import threading
    import types

    from corpusforge.cluster import PROBE_THREADS, _probes

    unit = types.SimpleNamespace(fn=lambda i: (i, threading.get_ident()))
    threads = set()
    for _ in range(5):
        results = list(_probes(unit, [dict(i=i) for i in range(40)]))
        assert [r[1][0] for r in results] == list(range(40)) and all(r[0] for r in results)
        threads |= {r[1][1] for r in results}
    assert len(threads) <= PROBE_THREADS
