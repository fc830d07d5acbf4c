"""Fault injection for the fault-matrix tests: a process kills itself at a chosen point.

Off unless ``CORPUSFORGE_FAULT`` is set; then the only cost of :func:`fault_point` is one
environment lookup. The tests set it before a Dask cluster starts, so its worker
processes inherit it::

    CORPUSFORGE_FAULT="staging.write@*"          # the first staging shard to get there
    CORPUSFORGE_FAULT="features.start@6f1c...,release.write@train-000000"
    CORPUSFORGE_FAULT_ONCE=/tmp/x/fired          # each point fires once (a folder that exists)

The process reaching a listed point for a listed unit (``*``: any unit) sends itself
SIGKILL — what the kernel's OOM killer or a lost machine does — so nothing of the
stage's cleanup runs. With ``CORPUSFORGE_FAULT_ONCE`` only the first process to reach
a point fires (it creates ``{folder}/{point}`` exclusively), so the work rescheduled
after the crash, or a rerun, proceeds.

Points: ``staging.write`` and ``release.write`` (while a shard's tar is being written,
before its second sample), ``features.start`` (a shard's extraction begins),
``features.done`` (right after a shard's features are marked done), ``graph.index.add``
(a block of an IVF index begins, by its first staging shard), ``graph.query`` (a staging
shard's graph queries begin), ``release.publish`` (a version's files are linked, its pointer not yet
switched; by version).
"""

from __future__ import annotations

import os
import signal

ENV = "CORPUSFORGE_FAULT"
ONCE_ENV = "CORPUSFORGE_FAULT_ONCE"


def fault_point(point: str, unit: str) -> None:
    """Kill this process if ``CORPUSFORGE_FAULT`` names ``point`` for ``unit``."""
    spec = os.environ.get(ENV)
    if spec is None:
        return
    wanted = {tuple(item.strip().split("@", 1)) for item in spec.split(",") if "@" in item}
    if (point, unit) not in wanted and (point, "*") not in wanted:
        return
    once = os.environ.get(ONCE_ENV)
    if once:
        try:
            os.close(os.open(os.path.join(once, point), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
