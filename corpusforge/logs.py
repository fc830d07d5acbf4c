"""The logger a stage writes to. Stages do not import the orchestrator, so the adapter
(:mod:`corpusforge.cluster`) installs its run logger here where a run starts: each flow's
entry and each task run's body on a worker (importing a module installs nothing). Inside a
flow or task run the lines reach the run's log in the Prefect UI; anywhere else (tests,
notebooks) they go to the standard ``corpusforge`` logger."""

from __future__ import annotations

import logging
from collections.abc import Callable

_provider: Callable[[], logging.Logger | logging.LoggerAdapter] | None = None


def install(provider: Callable[[], logging.Logger | logging.LoggerAdapter]) -> None:
    """Route :func:`stage_logger` through ``provider`` (called where the orchestration adapter starts a run)."""
    global _provider
    _provider = provider


def stage_logger() -> logging.Logger | logging.LoggerAdapter:
    """The run's logger when an orchestrator installed one, else ``corpusforge``'s."""
    return _provider() if _provider is not None else logging.getLogger("corpusforge")
