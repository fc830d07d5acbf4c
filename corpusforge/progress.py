"""Progress of a flow run's long stages, for the people watching it.

A flow declares its stages up front (:func:`run_progress`) and opens each one with
:meth:`RunProgress.stage`, naming the Prefect task whose completions count as its units
(``ingest-partition``, ``write-staging-shard``, …). :func:`corpusforge.cluster.run_tasks`
reports every finished unit of that task to the open stage, which then shows it:

* in a flow run, one Prefect **progress artifact** per run (``{flow}-progress``), updated
  at most every ``interval`` seconds: overall percent (the stages' mean), the current
  stage's units, and an estimate of the time it has left;
* on a terminal, a ``rich`` progress bar on stderr (the CLI runs the flow in-process);
* otherwise (a worker, CI, a pipe), one log line through the run logger every
  ``log_every`` seconds and when a stage ends.

Nothing here touches the stages' outputs: progress is for people, never an input.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from corpusforge.logs import stage_logger

# What a stage measures of each finished unit's result (e.g. the fetch: URLs and bytes), shown
# with its units as totals and, for bytes, a rate.
Measure = Callable[[Any], dict[str, float]]

log = logging.getLogger("corpusforge")

_ACTIVE: contextvars.ContextVar[RunProgress | None] = contextvars.ContextVar("corpusforge_progress", default=None)


def in_flow_run() -> bool:
    """True inside a Prefect flow run (outside one, tests and notebooks get no artifact)."""
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def _fmt_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Stage:
    """Units of one stage: a total that grows as tasks are submitted, and those done."""

    def __init__(self, name: str, unit: str, measure: Measure | None = None):
        self.name, self.unit, self.measure = name, unit, measure
        self.total = 0
        self.done = 0
        self.work: Counter[str] = Counter()
        self.started = time.monotonic()
        self.bar: Any = None  # the rich progress task, on a terminal

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0

    def eta(self) -> float | None:
        """Seconds left at the rate so far (None before the first unit finishes)."""
        if not self.done or self.done >= self.total:
            return None
        return (time.monotonic() - self.started) / self.done * (self.total - self.done)

    def line(self) -> str:
        pct = 100 * self.fraction
        text = f"{self.name}: {self.done}/{self.total} {self.unit} ({pct:.0f}%)"
        for what, n in self.work.items():
            if what == "bytes":
                rate = n / max(time.monotonic() - self.started, 1e-9)
                text += f", {n / 1e6:.1f} MB ({rate / 1e6:.2f} MB/s)"
            else:
                text += f", {n:g} {what}"
        eta = self.eta()
        return text + (f", about {_fmt_seconds(eta)} left" if eta is not None else "")


class RunProgress:
    """Progress of one run over its declared stages; see the module docstring."""

    def __init__(self, flow: str, stages: Sequence[str], *, interval: float = 2.0, log_every: float = 15.0,
                 console: Any | None = None):
        self.flow = flow
        self.stages = list(stages)
        self.finished: set[str] = set()
        self.open: dict[str, Stage] = {}  # by task name; stages may nest (release and manifest)
        self.interval, self.log_every = interval, log_every
        self._artifact = None
        self._last_push = 0.0
        self._last_log = 0.0
        self._bar = None
        self._console = console

    # ---- reporting -------------------------------------------------------------------
    @property
    def percent(self) -> float:
        if not self.stages:
            return 100.0
        done = sum(1.0 for s in self.stages if s in self.finished)
        done += sum(s.fraction for s in self.open.values() if s.name not in self.finished and s.name in self.stages)
        return round(min(100.0, 100.0 * done / len(self.stages)), 1)

    @property
    def current(self) -> Stage | None:
        """The open stage with work under way (the latest one with units), if any."""
        busy = [s for s in self.open.values() if s.total]
        return busy[-1] if busy else (list(self.open.values())[-1] if self.open else None)

    def describe(self) -> str:
        current = self.current
        if current is None:
            return f"{self.flow}: starting"
        done = [s for s in self.stages if s in self.finished]
        return current.line() + (f"; finished: {', '.join(done)}" if done else "")

    def _push(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._bar is not None:
            for stage in self.open.values():
                self._bar.update(stage.bar, total=max(stage.total, 1), completed=stage.done)
        if in_flow_run() and (force or now - self._last_push >= self.interval):
            self._last_push = now
            self._publish(self.percent, self.describe())
        if self._bar is None and (force or now - self._last_log >= self.log_every):
            self._last_log = now
            stage_logger().info("progress %.0f%%: %s", self.percent, self.describe())

    def _publish(self, progress: float, description: str) -> None:
        """The run's progress artifact, created on the first call and updated after."""
        try:
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            if self._artifact is None:
                self._artifact = create_progress_artifact(progress=progress, key=f"{self.flow}-progress",
                                                          description=description)
            else:
                update_progress_artifact(self._artifact, progress=progress, description=description)
        except Exception as exc:  # noqa: BLE001 - progress must never fail a build
            log.debug("progress artifact not updated: %s", exc)

    # ---- stages ----------------------------------------------------------------------
    @contextlib.contextmanager
    def stage(self, name: str, task: str, unit: str = "units", measure: Measure | None = None) -> Iterator[Stage]:
        """Open stage ``name``; finished runs of Prefect task ``task`` are its units, and
        ``measure`` what each unit's result adds to the stage's figures."""
        stage = Stage(name, unit, measure)
        self.open[task] = stage
        if self._bar is not None:
            stage.bar = self._bar.add_task(name, total=None)
        try:
            yield stage
        finally:
            self.finished.add(name)
            self._push(force=True)
            self.open.pop(task, None)

    def add(self, task: str, n: int) -> None:
        stage = self.open.get(task)
        if stage is not None:
            stage.total += n
            self._push()

    def advance(self, task: str, n: int = 1, results: Sequence[Any] = ()) -> None:
        stage = self.open.get(task)
        if stage is not None:
            stage.done += n
            if stage.measure is not None:
                for result in results:
                    stage.work.update(stage.measure(result))
            self._push(force=stage.done == stage.total)

    def finish(self) -> None:
        self.finished.update(self.stages)
        self.open.clear()
        if in_flow_run():
            self._publish(100.0, f"{self.flow}: done")
        if self._bar is None:
            stage_logger().info("progress 100%%: %s done", self.flow)

    def _start_bar(self) -> None:
        """A rich progress bar on stderr when it is a terminal (the CLI runs flows in-process)."""
        console = self._console
        if console is None:
            if not sys.stderr.isatty():
                return
            from rich.console import Console

            console = Console(stderr=True)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), console=console, transient=False)
        self._bar.start()

    def _stop_bar(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextlib.contextmanager
def run_progress(flow: str, stages: Sequence[str], **options: Any) -> Iterator[RunProgress]:
    """Track the progress of this run's ``stages``; :func:`task_progress` finds it."""
    progress = RunProgress(flow, stages, **options)
    progress._start_bar()
    token = _ACTIVE.set(progress)
    try:
        yield progress
        progress.finish()
    finally:
        progress._stop_bar()
        _ACTIVE.reset(token)


def task_progress() -> RunProgress | None:
    """The progress of the run in this context, if its flow declared one."""
    return _ACTIVE.get()
