"""Where the work runs: the Dask cluster behind Prefect's task runner, and the Prefect API.

By default a flow gets an embedded ``LocalCluster``; set ``dask.address`` to use an
existing scheduler (a bigger machine, GPU workers, Kubernetes). Prefect task runs on
Dask worker processes must report to one Prefect API: when none is configured,
:func:`prefect_api` starts one temporary local server for the run, so users need no
Prefect server for the embedded defaults.
"""

from __future__ import annotations

import contextlib
import typing
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class DaskConfig(BaseModel):
    """Which Dask cluster runs the tasks."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(None, title="Scheduler address",
                                description="tcp://host:8786 of an existing scheduler; empty for an embedded LocalCluster.")
    n_workers: int = Field(2, ge=1, title="Local workers", description="Worker processes of the embedded LocalCluster.")
    threads_per_worker: int = Field(1, ge=1, title="Threads per worker")
    processes: bool = Field(True, description="Separate worker processes (True) or threads in this process.")
    memory_limit: str = Field("auto", description="Per-worker memory limit of the embedded LocalCluster.")
    gpu: Literal["auto", "on", "off"] = Field(
        "auto", title="One worker per GPU",
        description="auto: when CUDA devices are visible, the embedded cluster is dask-cuda's LocalCUDACluster "
                    "(one worker process pinned to each GPU; install the 'gpu' extra); off: always a CPU LocalCluster.")


def visible_gpus() -> int:
    """CUDA devices this process can see (0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA runtime means no GPU workers
        return 0


def task_runner(cfg: DaskConfig):
    """A ``DaskTaskRunner`` for ``cfg``: an existing scheduler, one worker per GPU, or a LocalCluster."""
    from prefect_dask import DaskTaskRunner

    if cfg.address:
        return DaskTaskRunner(address=cfg.address)
    if cfg.gpu == "on" or (cfg.gpu == "auto" and visible_gpus() > 0):
        if importlib.util.find_spec("dask_cuda") is None:
            if cfg.gpu == "on":
                raise RuntimeError("dask.gpu=on needs dask-cuda: pip install 'corpusforge[gpu]'")
            log.warning("GPUs visible but dask-cuda is not installed: a CPU LocalCluster runs, and its "
                        "workers share the first GPU (pip install 'corpusforge[gpu]' for one worker per GPU)")
            return _local_cluster(cfg)
        # Each worker owns one GPU (CUDA_VISIBLE_DEVICES set per worker by dask-cuda),
        # so a model loaded once per worker lives on its own device.
        kwargs = {"threads_per_worker": cfg.threads_per_worker, "memory_limit": cfg.memory_limit,
                  "dashboard_address": None}
        return DaskTaskRunner(cluster_class="dask_cuda.LocalCUDACluster", cluster_kwargs=kwargs)
    return _local_cluster(cfg)


def _local_cluster(cfg: DaskConfig):
    from prefect_dask import DaskTaskRunner

    kwargs: dict[str, Any] = {
        "n_workers": cfg.n_workers,
        "threads_per_worker": cfg.threads_per_worker,
        "processes": cfg.processes,
        "memory_limit": cfg.memory_limit,
        "dashboard_address": None,
    }
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)


def as_task(fn: Callable[..., Any], name: str, **options: Any):
    """A thin Prefect task around a plain stage function (results stay in memory)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    return task(fn, name=name, cache_policy=NO_CACHE, persist_result=False, **options)


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task run, else this module's logger
    (stages also run as plain functions: tests, benchmarks, notebooks)."""
    from prefect import get_run_logger
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return logging.getLogger("corpusforge")
    return get_run_logger()


def run_tasks(t, calls: list[dict[str, Any]]) -> list[Any]:
    """One task run per call, fanned out by the flow run's task runner; outside a flow
    run, the plain functions run here one after the other."""
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return [t.fn(**kwargs) for kwargs in calls]
    futures = [t.submit(**kwargs) for kwargs in calls]
    return [f.result() for f in futures]


def cluster_flow(fn: Callable[[Any], Any], name: str) -> tuple[Any, Callable[[Any], Any]]:
    """A Prefect flow ``name`` running ``fn(config)`` on the Dask cluster of ``config.dask``,
    and a function that runs it from Python or the CLI with a Prefect API for the workers.

    The task runner comes from the config, so it is chosen per run: the flow itself runs
    ``fn`` as a subflow (``{name}-on-dask``) whose task runner is that cluster.
    """
    from prefect import flow

    inner = flow(name=f"{name}-on-dask")(fn)

    def outer(config: Any) -> Any:
        return inner.with_options(task_runner=task_runner(config.dask))(config)

    # the flow's parameter schema (the deployment form) is the config model of ``fn``
    outer.__name__, outer.__qualname__, outer.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    outer.__module__ = fn.__module__
    outer.__annotations__ = typing.get_type_hints(fn)
    outer_flow = flow(name=name)(outer)

    def run(config: Any) -> Any:
        with prefect_api():
            return outer_flow(config)

    run.__doc__ = f"Run the {name} flow from Python or the CLI, with a Prefect API available to Dask workers."
    return outer_flow, run


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """Make sure one Prefect API serves this process and the Dask workers it spawns.

    With ``PREFECT_API_URL`` already set (a real server, a deployment's worker), this does
    nothing. Otherwise it starts Prefect's local server in a subprocess and exports its
    URL, so worker processes started afterwards report to it instead of each starting a
    temporary server of their own on one SQLite file (slow, and it locks).
    """
    url = os.environ.get("PREFECT_API_URL")
    if url:
        yield url
        return
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start(timeout=120)
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        yield server.api_url
    finally:
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()  # send queued run logs while the server still listens
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()
