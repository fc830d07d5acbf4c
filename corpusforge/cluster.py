"""Where the work runs: the Dask cluster behind Prefect's task runner, and the Prefect API.

By default a flow gets an embedded ``LocalCluster``; set ``dask.address`` to use an
existing scheduler (a bigger machine, GPU workers, Kubernetes). Prefect task runs on
Dask worker processes must report to one Prefect API: when none is configured,
:func:`prefect_api` starts one temporary local server for the run, so users need no
Prefect server for the embedded defaults.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import itertools
import logging
import math
import os
import queue
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from pydantic import Field, model_validator

from corpusforge import logs
from corpusforge.config import StrictModel
from corpusforge.contract import MARKER_WINDOW, Sink, Unit, in_process, probe, tree_reduce
from corpusforge.progress import in_flow_run, task_progress

log = logging.getLogger(__name__)
T = TypeVar("T")

# Prefect tasks that run a model: they ask for ``DaskConfig.model_task_resources``
# (e.g. GPU=1) while every other task asks for ``other_task_resources``.
MODEL_TASKS = frozenset({"extract-shard-features", "embed-generated-chunk"})


class DaskConfig(StrictModel):
    """Which Dask cluster runs the tasks."""

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
    adapt_minimum: int | None = Field(
        None, ge=0, title="Adaptive: fewest workers",
        description="With adapt_maximum, the embedded cluster scales between these bounds with the load. An "
                    "existing scheduler scales with its own cluster manager (Kubernetes: the DaskAutoscaler).")
    adapt_maximum: int | None = Field(None, ge=1, title="Adaptive: most workers")
    model_task_resources: dict[str, float] = Field(
        default_factory=dict, title="Resources of model tasks",
        description="Dask worker resources every feature-extraction or embedding task needs, e.g. {GPU: 1}: those "
                    "tasks then run only on workers started with --resources GPU=1. Empty: any worker.")
    other_task_resources: dict[str, float] = Field(
        default_factory=dict, title="Resources of other tasks",
        description="Dask worker resources every other task needs, e.g. {CPU: 1} to keep ingest, staging and "
                    "release on workers started with --resources CPU=N. Empty: any worker.")

    @model_validator(mode="after")
    def _adaptive_bounds(self) -> DaskConfig:
        bounds = (self.adapt_minimum, self.adapt_maximum)
        if bounds != (None, None):
            if None in bounds:
                raise ValueError("dask.adapt_minimum and dask.adapt_maximum go together")
            if self.adapt_minimum > self.adapt_maximum:
                raise ValueError("dask.adapt_minimum is larger than dask.adapt_maximum")
            if self.address:
                raise ValueError("adaptive bounds apply to a cluster corpusforge starts; an existing scheduler "
                                 "(dask.address) scales with its own cluster manager (infra/dask/: DaskAutoscaler)")
        return self

    def worker_resources(self) -> dict[str, float]:
        """What the workers of an embedded cluster declare: everything the tasks ask for."""
        merged = dict(self.other_task_resources)
        for name, amount in self.model_task_resources.items():
            merged[name] = max(amount, merged.get(name, 0))
        return merged

    def task_resources(self, task_name: str) -> dict[str, float]:
        return self.model_task_resources if task_name in MODEL_TASKS else self.other_task_resources


def visible_gpus() -> int:
    """CUDA devices this process can see (0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA runtime means no GPU workers
        return 0


def task_runner(cfg: DaskConfig):
    """A ``DaskTaskRunner`` for ``cfg``: an existing scheduler, or an embedded cluster that
    prefect-dask starts when the first task run is submitted (:func:`start_embedded_cluster`),
    so a rerun whose units are all current starts no worker process."""
    from prefect_dask import DaskTaskRunner

    if cfg.address:
        return DaskTaskRunner(address=cfg.address)
    adapt = None if cfg.adapt_minimum is None else {"minimum": cfg.adapt_minimum, "maximum": cfg.adapt_maximum}
    return DaskTaskRunner(cluster_class=start_embedded_cluster, cluster_kwargs=cfg.model_dump(), adapt_kwargs=adapt)


def start_embedded_cluster(**dask: Any) -> Any:
    """The embedded cluster of the config ``dask`` (a :class:`DaskConfig`'s fields), started."""
    name, kwargs = cluster_choice(DaskConfig(**dask))
    module, _, cls = name.rpartition(".")
    return getattr(importlib.import_module(module), cls)(**kwargs)


def cluster_choice(cfg: DaskConfig) -> tuple[str, dict[str, Any]]:
    """The embedded cluster's class (qualified name) and arguments: one worker per GPU, or a
    LocalCluster. Looking for GPUs imports torch (4.2 s of a 20.5 s no-op rerun, measured), so
    this runs only when a cluster is started."""
    cluster_class = "distributed.LocalCluster"
    kwargs: dict[str, Any] = {"n_workers": cfg.n_workers, "processes": cfg.processes}
    if cfg.gpu == "on" or (cfg.gpu == "auto" and visible_gpus() > 0):
        if importlib.util.find_spec("dask_cuda") is not None:
            # Each worker owns one GPU (CUDA_VISIBLE_DEVICES set per worker by dask-cuda),
            # so a model loaded once per worker lives on its own device.
            cluster_class, kwargs = "dask_cuda.LocalCUDACluster", {}
        elif cfg.gpu == "on":
            raise RuntimeError("dask.gpu=on needs dask-cuda: pip install 'corpusforge[gpu]'")
        else:
            log.warning("GPUs visible but dask-cuda is not installed: a CPU LocalCluster runs, and its "
                        "workers share the first GPU (pip install 'corpusforge[gpu]' for one worker per GPU)")
    kwargs.update(threads_per_worker=cfg.threads_per_worker, memory_limit=cfg.memory_limit, dashboard_address=None)
    if cfg.worker_resources():
        kwargs["resources"] = cfg.worker_resources()
    return cluster_class, kwargs


# Exceptions worth a retry: the network, an object store or a worker hiccuped. Anything
# else (a corrupt input, a bad config, refused weights, a bug) fails at once: retrying
# would only repeat it.
_TRANSIENT_ERRNOS = {4, 11, 32, 103, 104, 110, 111, 112, 113}  # EINTR EAGAIN EPIPE ECONNABORTED ECONNRESET ETIMEDOUT ECONNREFUSED EHOSTDOWN EHOSTUNREACH
_TRANSIENT_NAMES = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                    "ServerDisconnectedError", "ClientConnectionError", "ClientOSError", "ClientPayloadError",
                    "CommClosedError", "StreamClosedError", "SlowDown", "ServiceUnavailable", "RequestTimeout",
                    "ThrottlingException", "InternalError"}


def is_transient(exc: BaseException | None) -> bool:
    """True when ``exc`` (or what caused it) is a network or service hiccup."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if type(exc).__name__ in _TRANSIENT_NAMES:
            return True
        if isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                                                             NotADirectoryError)) \
                and exc.errno in _TRANSIENT_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a failed task run only for a transient error."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception as error:  # noqa: BLE001 - the result itself could not be read
        exc = error
    return isinstance(exc, BaseException) and is_transient(exc)


def as_task(fn: Callable[..., Any], name: str, *, probe: bool = False, **options: Any):
    """A thin Prefect task around a plain stage function (results stay in memory), with its batch
    form ``.batch`` (one task run for a list of units, same name, retry rule and resources).

    ``probe``: the flow probes each unit first and submits only those that would compute; only for
    units whose check reads nothing but markers and small tables (the flow process does those reads
    itself, for every unit, on every run). Only transient errors are retried, twice with backoff
    (every unit is idempotent under the stage contract)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE
    from prefect.tasks import exponential_backoff

    defaults: dict[str, Any] = {"retries": 2, "retry_delay_seconds": exponential_backoff(backoff_factor=2),
                                "retry_jitter_factor": 0.5, "retry_condition_fn": retry_transient}
    settings = {"cache_policy": NO_CACHE, "persist_result": False, **defaults, **options}

    @functools.wraps(fn)
    def one(*args: Any, **kwargs: Any) -> Any:
        logs.install(run_logger)  # a task run's start on its worker: the stage's lines reach the run's log
        return fn(*args, **kwargs)

    unit = task(one, name=name, **settings)

    def units(calls: list[dict[str, Any]], part: int, parts: int) -> list[Any]:
        # a retried batch calls every unit again: the finished ones skip by their markers
        return [one(**kwargs) for kwargs in calls]

    units.__qualname__ = units.__name__ = f"{fn.__name__}_batch"
    unit.batch = task(units, name=name, task_run_name=f"{name} {{part}}/{{parts}}", **settings)
    unit.probe = probe
    return unit


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task run, else this module's logger
    (stages also run as plain functions: tests, benchmarks, notebooks)."""
    from prefect import get_run_logger
    from prefect.context import FlowRunContext, TaskRunContext

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return logging.getLogger("corpusforge")
    return get_run_logger()


_RESOURCES: contextvars.ContextVar[DaskConfig | None] = contextvars.ContextVar("corpusforge_dask", default=None)


@contextlib.contextmanager
def annotated(task_name: str) -> Iterator[None]:
    """Dask annotations (worker resources) for tasks named ``task_name`` submitted here."""
    cfg = _RESOURCES.get()
    resources = cfg.task_resources(task_name) if cfg is not None else {}
    if not resources:
        yield
        return
    import dask

    with dask.annotate(resources=dict(resources)):
        yield


@contextlib.contextmanager
def dask_config(cfg: DaskConfig) -> Iterator[None]:
    """The ``dask`` config of the flow run in this context (read by :func:`annotated`)."""
    token = _RESOURCES.set(cfg)
    try:
        yield
    finally:
        _RESOURCES.reset(token)


# Units are batched into task runs (:func:`batch_count`): a task run costs ~0.1 s of
# Prefect bookkeeping whatever it does, which one task run per unit paid ~10⁶ times at 10⁸
# images. Four batches per worker thread balance the load; a batch holds at most
# UNITS_PER_BATCH units (finer progress, cheaper retries) until a fan-out would pass
# MAX_BATCHES task runs, the bound that keeps a whole build under 20,000 task runs.
UNITS_PER_BATCH = 64
MAX_BATCHES = 500
BATCHES_PER_SLOT = 4


# Probing reads markers, one small object each: I/O-bound, so many at once (on S3 each
# read is a round trip of tens of ms).
PROBE_THREADS = 16


def batch_count(n_units: int, slots: int) -> int:
    """Task runs for a fan-out of ``n_units`` on ``slots`` worker threads."""
    return min(n_units, MAX_BATCHES, max(BATCHES_PER_SLOT * slots, math.ceil(n_units / UNITS_PER_BATCH)))


def batches(items: list[T], n: int) -> list[list[T]]:
    """``items`` cut into ``n`` consecutive batches whose sizes differ by at most one (consecutive:
    neighbouring shards stay together, and results keep their order)."""
    size, extra = divmod(len(items), n)
    cuts = [i * size + min(i, extra) for i in range(n + 1)]
    return [items[a:b] for a, b in itertools.pairwise(cuts) if b > a]


def _slots(runner: Any) -> int:
    """Worker threads of the flow run's task runner: the Dask cluster's now, or the most
    an adaptive embedded cluster may have (it scales up as the batches queue)."""
    cfg = _RESOURCES.get()
    planned = cfg.adapt_maximum * cfg.threads_per_worker if cfg is not None and cfg.adapt_maximum else 0
    client = getattr(runner, "client", None)
    if client is not None:
        return max(planned, sum(client.nthreads().values()), 1)
    return max(planned, getattr(runner, "_max_workers", None) or 1, 1)


def run_tasks(t, calls: list[dict[str, Any]]) -> list[Any]:
    """The results of :func:`stream_tasks` in the order of ``calls``: for fan-outs of a few units (a
    fan-out over every partition or shard streams its results to a ledger instead)."""
    results: list[Any] = [None] * len(calls)
    stream_tasks(t, calls, results.__setitem__)
    return results


def stream_tasks(t, calls: list[dict[str, Any]], sink: Sink) -> None:
    """Run the units ``calls`` of task ``t`` in batches of task runs (:func:`_run_batches`), or here
    one after the other outside a flow run; each result goes to ``sink(i, result)`` and to the run's
    progress, and this process keeps none of them.

    A task made with ``probe=True`` probes every unit here first: the current ones go to ``sink``
    and only the others become task runs, so a rerun that changes nothing spends no task run on them."""
    from prefect.context import FlowRunContext

    progress = task_progress()
    if progress is not None:
        progress.add(t.name, len(calls))
    flow_run = FlowRunContext.get()
    if flow_run is None:
        for i, kwargs in enumerate(calls):
            result = t.fn(**kwargs)
            sink(i, result)
            if progress is not None:
                progress.advance(t.name, results=[result])
        return
    todo: list[int] = []
    if getattr(t, "probe", False):
        probes = _probes(t, calls)
        for i, (current, result) in enumerate(probes):  # at most a window of probes (and results) held
            if current:
                sink(i, result)
            else:
                todo.append(i)
        if progress is not None and len(todo) < len(calls):
            progress.advance(t.name, len(calls) - len(todo))
    else:
        todo = list(range(len(calls)))
    _run_batches(t, calls, todo, flow_run, progress, sink)


@functools.cache
def _probe_pool() -> ThreadPoolExecutor:
    """One pool of :data:`PROBE_THREADS` threads for the probes of every fan-out of this process."""
    return ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="probe")


def _probes(t, calls: list[dict[str, Any]]) -> Iterator[tuple[bool, Any]]:
    """:func:`~corpusforge.contract.probe` of each call, in order, a window of
    :data:`MARKER_WINDOW` at a time, on the shared :func:`_probe_pool`: a pool per fan-out
    started its threads again each time (243 thread starts, 3.8 s of a 20.5 s settled no-op
    rerun at load ~8, cProfile)."""
    pending = iter(calls)
    while window := list(itertools.islice(pending, MARKER_WINDOW)):
        yield from _probe_pool().map(lambda kwargs: probe(t.fn, kwargs), window)


@functools.cache
def task_for(unit: Unit) -> Any:
    """The Prefect task of a stage's :class:`~corpusforge.contract.Unit` (one per kind)."""
    return as_task(unit.fn, unit.name, probe=unit.probe)


class FlowFanOut:
    """The fan-out every flow hands its stages: units become Prefect task runs on the flow
    run's task runner (:func:`run_tasks`); outside a flow run they run here, in order."""

    def __call__(self, unit: Unit, calls: list[dict[str, Any]]) -> list[Any]:
        return run_tasks(task_for(unit), calls)

    def stream(self, unit: Unit, calls: list[dict[str, Any]], sink: Sink) -> None:
        stream_tasks(task_for(unit), calls, sink)

    def each(self, units: list[tuple[Unit, dict[str, Any]]]) -> list[Any]:
        """A task run each, side by side, except the units of probed kinds that are current."""
        if not in_flow_run():
            return in_process.each(units)
        probed = [probe(u.fn, kw) if u.probe else (False, None) for u, kw in units]
        futures = {i: task_for(u).submit(**kw)
                   for i, ((u, kw), (current, _)) in enumerate(zip(units, probed, strict=True)) if not current}
        return [futures[i].result() if i in futures else result for i, (_, result) in enumerate(probed)]

    def reduce(self, unit: Unit, merge: Unit, calls: list[dict[str, Any]]) -> Any:
        """A task run per call, merged by task runs in the fixed tree of
        :func:`~corpusforge.contract.tree_reduce`: partial results stay on the workers (as
        futures) until the root's result comes back here."""
        if not in_flow_run():
            return in_process.reduce(unit, merge, calls)
        part, join = task_for(unit), task_for(merge)
        with annotated(unit.name):
            futures = [part.submit(**kwargs) for kwargs in calls]
        return tree_reduce(futures, join.submit).result()


fan_out = FlowFanOut()


def _run_batches(t, calls: list[dict[str, Any]], todo: list[int], flow_run: Any, progress: Any,
                 sink: Sink) -> None:
    """The units ``calls[i]`` for ``i`` in ``todo``, in batches of task runs; each batch's results go
    to ``sink`` when it completes and its future is dropped then (Prefect's ``as_completed`` would
    keep every result until the last batch is done). The first batch that fails for good cancels
    those not yet started: with an S3 server down, each spending its own retries would keep a
    doomed run going for minutes."""
    if not todo:
        return
    parts = batches(todo, batch_count(len(todo), _slots(flow_run.task_runner)))
    done: queue.SimpleQueue[int] = queue.SimpleQueue()
    pending: dict[int, tuple[Any, list[int]]] = {}
    with annotated(t.name):
        for k, indexes in enumerate(parts):
            future = t.batch.submit(calls=[calls[i] for i in indexes], part=k + 1, parts=len(parts))
            pending[k] = (future, indexes)
            future.add_done_callback(lambda _, k=k: done.put(k))
    try:
        while pending:
            future, indexes = pending.pop(done.get())
            results = future.result()  # a batch failed for good fails the stage now, not after every other batch
            for i, result in zip(indexes, results, strict=True):
                sink(i, result)
            if progress is not None:
                progress.advance(t.name, len(indexes), results)
            del future, results
    except BaseException:
        for other, _ in pending.values():  # batches not started yet never start (a running one ends by itself)
            wrapped = getattr(other, "wrapped_future", None)
            if wrapped is not None:
                wrapped.cancel()
        raise


def root_flow_run() -> str | None:
    """``{name} ({id})`` of the flow run this code runs under (the outermost one, which the UI
    lists), or None outside a flow run: how an output's lease names its build."""
    from prefect.context import FlowRunContext
    from prefect.runtime import flow_run

    ctx = FlowRunContext.get()
    if ctx is None:
        return None
    root = flow_run.get_root_flow_run_id()
    parent = ctx.flow_run.name if ctx.flow_run is not None else None
    name = parent.removesuffix(" on dask") if parent else None
    return f"{name} ({root})" if name else str(root)


@contextlib.contextmanager
def output_concurrency(out: str) -> Iterator[None]:
    """Inside a flow run, hold the slot of the Prefect global concurrency limit ``output:{out}``
    (limit 1), so runs of deployments into one output queue in Prefect instead of meeting at the
    output's lease."""
    if not in_flow_run():
        yield
        return
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency

    name = output_concurrency_name(out)
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, 1)
    with concurrency(name, occupy=1, strict=True):
        yield


def output_concurrency_name(out: str) -> str:
    """The name of the global concurrency limit of an output root (Prefect names allow no ``/``)."""
    return "output:" + out.rstrip("/").replace("/", "|")


def subflow_run_name() -> str:
    """The work subflow's run is named after the run it belongs to (the flow run of this
    context): ``{run} on dask``, so the UI shows one build as one run and its part."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    parent = ctx.flow_run.name if ctx is not None and ctx.flow_run is not None else None
    return f"{parent} on dask" if parent else "on dask"


def cluster_flow(fn: Callable[[Any], Any], name: str) -> tuple[Any, Callable[[Any], Any]]:
    """A Prefect flow ``name`` running ``fn(config)`` on the Dask cluster of ``config.dask``, and a
    function that runs it with a Prefect API for the workers. The task runner is chosen per run
    from the config: the flow runs ``fn`` as a subflow (``{name}-on-dask``) on that cluster."""
    from prefect import flow

    from corpusforge.secrets import held_secrets, refuse_inline_secrets, split_secrets, with_secrets

    def on_dask(config: Any) -> Any:
        # (module-level helpers only: Prefect pickles this function with the run context)
        logs.install(run_logger)  # the flow run's start: the stages' lines reach its log
        with dask_config(config.dask):
            return fn(with_secrets(config))  # credentials in memory only, never a parameter

    def outer(config: Any) -> Any:
        refuse_inline_secrets(config)
        return inner.with_options(task_runner=task_runner(config.dask), flow_run_name=subflow_run_name())(config)

    # both flows' parameter schema (the deployment form) is the config model of ``fn``
    for wrapper in (on_dask, outer):
        wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        wrapper.__module__, wrapper.__annotations__ = fn.__module__, typing.get_type_hints(fn)
    inner = flow(name=f"{name}-on-dask",
                 description=f"The {name} work itself, as a subflow of {name} with the Dask cluster of its "
                             "config as task runner.")(on_dask)
    outer_flow = flow(name=name)(outer)

    def run(config: Any) -> Any:
        public, secrets = split_secrets(config)
        with prefect_api(), held_secrets(secrets):
            return outer_flow(public)

    run.__doc__ = f"Run the {name} flow from Python or the CLI, with a Prefect API available to Dask workers."
    return outer_flow, run


def command_logging(log_file: str) -> str | None:
    """Logging for a command-line run, set up before Prefect is imported: Prefect's configuration
    with tracebacks left off the console (a failure is one line there) and every record written to
    ``log_file``, by this process and the Dask workers (they inherit ``PREFECT_LOGGING_SETTINGS_PATH``).
    Returns the configuration written, for the caller to remove; None when the user set one."""
    import yaml

    if os.environ.get("PREFECT_LOGGING_SETTINGS_PATH"):
        return None
    spec = importlib.util.find_spec("prefect")
    assert spec is not None and spec.submodule_search_locations
    with open(os.path.join(spec.submodule_search_locations[0], "logging", "logging.yml")) as f:
        config = yaml.safe_load(f)
    config["formatters"]["detailed"] = dict(config["formatters"]["standard"])
    config["formatters"]["standard"]["()"] = f"{__name__}.console_formatter"
    config["handlers"]["file"] = {"class": "logging.FileHandler", "filename": log_file, "delay": True,
                                  "formatter": "detailed", "level": 0}
    config["root"]["handlers"] = [*config["root"]["handlers"], "file"]
    path = f"{log_file}.logging.yml"
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = path
    return path


def console_formatter(**kwargs: Any) -> logging.Formatter:
    """Prefect's console format without tracebacks (``logging.config`` factory; see
    :func:`command_logging`): the record keeps its traceback for the log file and the run log."""
    from prefect.logging.formatters import PrefectFormatter

    class OneLine(PrefectFormatter):
        def format(self, record: logging.LogRecord) -> str:
            saved = record.exc_info, record.exc_text, record.stack_info
            record.exc_info = record.exc_text = record.stack_info = None
            try:
                return super().format(record)
            finally:
                record.exc_info, record.exc_text, record.stack_info = saved

    return OneLine(**kwargs)


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """Make sure one Prefect API serves this process and the Dask workers it spawns.

    Unless ``PREFECT_API_URL`` is set, start Prefect's local server in a subprocess and export its
    URL, so workers report to it instead of each starting a temporary server of their own on one
    SQLite file (slow, and it locks)."""
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
