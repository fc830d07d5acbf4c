"""The latest run's stage times: measured here, kept out of the byte-identical outputs.

The receipt and reports must be equal byte for byte between a rerun and a fresh build,
and wall-clock seconds never are. So a run's timings go to ``work/run/stage_times.json``
and ``.md`` (:data:`tasks.report.files.RUN_LOG`), outside every output hash; report.md
and report.html point there with a fixed sentence.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tasks.report.files import RUN_LOG, RUN_LOG_MD
from corpusforge.storage import Store

# The build's stages as the report names them, in pipeline order.
BUILD_STAGES = ("ingest", "exact_dedup", "staging", "features", "graph", "release", "statistics", "receipt")
POINTER = (f"Stage times of the latest run: `{RUN_LOG_MD}` (wall-clock seconds differ from run to run, "
           "so they are kept out of this report, which a rerun reproduces byte for byte).")


class StageClock:
    """Wall-clock seconds per named stage: ``with clock("features"): ...`` or start/stop."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._open: tuple[str, float] | None = None

    def start(self, name: str) -> None:
        self.stop()
        self._open = (name, time.perf_counter())

    def stop(self) -> None:
        if self._open is not None:
            name, t0 = self._open
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0
            self._open = None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.start(name)
        try:
            yield
        finally:
            self.stop()

    def seconds(self) -> dict[str, float]:
        self.stop()
        return {k: round(v, 3) for k, v in self.totals.items()}


def render_stage_times(flow: str, seconds: dict[str, float]) -> str:
    """A Markdown table of seconds and share of the run per stage."""
    stages = [s for s in BUILD_STAGES if s in seconds] + sorted(set(seconds) - set(BUILD_STAGES) - {"graph_queries"})
    total = sum(seconds[s] for s in stages) or 1.0
    rows = [f"| {s} | {seconds[s]:.1f} | {100 * seconds[s] / total:.1f} % |" for s in stages]
    lines = [f"# {flow}: stage times of the latest run", "", "| stage | seconds | share |", "|---|---|---|", *rows,
             f"| **total** | **{total:.1f}** | 100 % |"]
    if "graph_queries" in seconds:
        lines += ["", f"Graph queries alone (inside graph): {seconds['graph_queries']:.1f} s."]
    return "\n".join(lines) + "\n"


def write_run_log(store: Store, flow: str, work: dict[str, Any]) -> None:
    """The run's work log (units computed/skipped, seconds per stage) as JSON and Markdown."""
    store.write_json(RUN_LOG, {"flow": flow, **work})
    store.write_bytes(RUN_LOG_MD, render_stage_times(flow, work.get("seconds", {})).encode())
