"""Scale-out on an existing Dask scheduler: a separately started ``dask scheduler`` and two
``dask worker`` processes on loopback, one declaring ``--resources GPU=1``. With
``dask.model_task_resources: {GPU: 1}`` the feature tasks run only on that worker; every
other task runs anywhere. Also: adaptive bounds and resources of the embedded cluster."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpusforge.cluster import DaskConfig, cluster_choice, task_runner
from tests.operate import clean_env, free_port, stop


def test_adaptive_bounds_and_resources_of_the_embedded_cluster():
    cfg = DaskConfig(gpu="off", adapt_minimum=1, adapt_maximum=4, model_task_resources={"GPU": 1},
                     other_task_resources={"CPU": 1})
    assert task_runner(cfg).adapt_kwargs == {"minimum": 1, "maximum": 4}
    # the embedded workers declare what the tasks ask for, so no task waits forever
    assert cluster_choice(cfg)[1]["resources"] == {"GPU": 1, "CPU": 1}
    assert DaskConfig(model_task_resources={"GPU": 1}).task_resources("extract-shard-features") == {"GPU": 1}
    assert DaskConfig(model_task_resources={"GPU": 1}).task_resources("ingest-partition") == {}


@pytest.mark.parametrize("bad", [dict(adapt_minimum=2), dict(adapt_minimum=5, adapt_maximum=2),
                                 dict(address="tcp://127.0.0.1:8786", adapt_minimum=1, adapt_maximum=2)])
def test_adaptive_bounds_are_checked(bad):
    with pytest.raises(ValueError):
        DaskConfig(**bad)


def _wait_for_workers(address: str, n: int, timeout: float = 120) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        client.wait_for_workers(n, timeout=timeout)


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory, prefect_server):
    """``dask scheduler`` + a CPU worker + a worker declaring GPU=1, all separate processes."""
    logs = tmp_path_factory.mktemp("dask-logs")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask_cli = str(Path(sys.executable).parent / "dask")
    env = clean_env(PREFECT_API_URL=prefect_server, PREFECT_LOGGING_LEVEL="WARNING")
    procs = []

    def start(name: str, *args: str) -> None:
        log = open(logs / f"{name}.log", "wb")
        procs.append(subprocess.Popen([dask_cli, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))

    start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")
    common = ["--nthreads", "1", "--nworkers", "1", "--no-dashboard", "--host", "127.0.0.1",
              "--memory-limit", "4GB"]
    start("cpu-worker", "worker", address, "--name", "cpu-worker", *common)
    start("gpu-worker", "worker", address, "--name", "gpu-worker", "--resources", "GPU=1", *common)
    try:
        _wait_for_workers(address, 2)
        yield address
    finally:
        for proc in reversed(procs):
            stop(proc)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_feature_tasks_run_only_on_the_gpu_worker(dask_cluster, tmp_path):
    from distributed import Client

    from flows.build_corpus import BuildConfig, run_build
    from sample_corpus import write_sample_corpus

    write_sample_corpus(str(tmp_path / "source"), n=40, seed=0)
    config = BuildConfig.model_validate({
        "source": str(tmp_path / "source"), "out": str(tmp_path / "corpus"),
        "input": {"partition_size": 10}, "staging": {"shard_size": 10},
        "splits": {"shard_size": 10, "val": 0.1, "test": 0.15},
        "dask": {"address": dask_cluster, "model_task_resources": {"GPU": 1}}})
    started = time.monotonic()
    result = run_build(config)
    assert result["counts"]["records"] == 40
    assert result["work"]["features"]["wfd"]["computed"] >= 2, "several feature tasks to place"

    def loaded_models() -> int:
        from tasks.shared.features import registry

        return len(registry._cache)

    def executed(dask_worker) -> int:
        return dask_worker.state.executed_count

    with Client(dask_cluster) as client:
        names = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        models = client.run(loaded_models)
        tasks = client.run(executed)
    assert models[names["gpu-worker"]] >= 1, "the feature model was loaded on the GPU worker"
    assert models[names["cpu-worker"]] == 0, "no feature task ran on the CPU worker"
    assert tasks[names["cpu-worker"]] > 0, "the other tasks ran anywhere, the CPU worker included"
    assert time.monotonic() - started < 500
