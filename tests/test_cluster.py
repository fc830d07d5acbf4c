"""Where the work runs: embedded LocalCluster, an existing scheduler, or one worker per GPU."""

from __future__ import annotations

import importlib.util

import pytest

from corpusforge.cluster import DaskConfig, task_runner, visible_gpus


def test_embedded_local_cluster_by_default_on_a_cpu_machine():
    if visible_gpus():
        pytest.skip("this machine has GPUs")
    runner = task_runner(DaskConfig(n_workers=3, threads_per_worker=2))
    assert runner.cluster_class.endswith("LocalCluster") and "CUDA" not in runner.cluster_class
    assert runner.cluster_kwargs["n_workers"] == 3 and runner.cluster_kwargs["threads_per_worker"] == 2


def test_existing_scheduler_address_wins():
    runner = task_runner(DaskConfig(address="tcp://10.0.0.1:8786", gpu="on"))
    assert runner.address == "tcp://10.0.0.1:8786"


def test_gpu_on_asks_for_one_worker_per_gpu():
    if importlib.util.find_spec("dask_cuda") is None:
        with pytest.raises(RuntimeError, match="corpusforge\\[gpu\\]"):
            task_runner(DaskConfig(gpu="on"))
        return
    runner = task_runner(DaskConfig(gpu="on"))
    assert runner.cluster_class == "dask_cuda.LocalCUDACluster"
    assert "n_workers" not in runner.cluster_kwargs  # one per visible GPU, decided by dask-cuda


def test_unknown_keys_are_rejected():
    with pytest.raises(ValueError):
        DaskConfig(workers=4)


@pytest.mark.gpu
def test_gpu_auto_detects_devices():
    assert visible_gpus() > 0
    assert task_runner(DaskConfig()).cluster_class == "dask_cuda.LocalCUDACluster"
