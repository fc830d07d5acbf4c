"""What every fetch unit of a build knows about a host, in one place: Retry-After and backoff
pauses, the circuit breaker, the minimum interval between requests and the bandwidth spent.

On a Dask cluster the :class:`HostLedger` lives on the scheduler (:class:`HostLedgerPlugin`,
registered by the first unit that needs it; the scheduler runs one handler call at a time, so
every update is atomic), and units reach it through :func:`ledger_call`. Outside a cluster one
ledger per process serves every unit of the process. Times in the ledger are the ledger's own
monotonic clock; callers send and receive only durations, so the processes' clocks never meet.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

PLUGIN_NAME = "corpusforge-fetch-hosts"
HANDLER = "corpusforge_fetch_hosts"


@dataclass
class _Host:
    not_before: float = 0.0   # no request starts earlier (Retry-After, backoff, min_interval)
    paid_until: float = 0.0   # the bytes received so far are paid for at the host's bandwidth then
    failures: int = 0         # consecutive failed attempts
    open_until: float = 0.0   # the breaker is open until then


class HostLedger:
    """The shared state of every host (thread-safe; on the scheduler, called from its loop)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hosts: dict[str, _Host] = {}

    def _left(self, h: _Host, now: float) -> list[float]:
        return [max(0.0, max(h.not_before, h.paid_until) - now), max(0.0, h.open_until - now)]

    def reserve(self, host: str, min_interval: float) -> list[float]:
        """A turn at ``host`` for a request: [seconds to wait before it starts, seconds the breaker
        stays open (0: closed)]. The next turn is ``min_interval`` after this one."""
        with self.lock:
            now, h = time.monotonic(), self.hosts.setdefault(host, _Host())
            wait, open_left = self._left(h, now)
            if not open_left:
                h.not_before = now + wait + min_interval
            return [wait, open_left]

    def pause(self, host: str, seconds: float) -> None:
        """No request to ``host`` starts in the next ``seconds`` (Retry-After, backoff)."""
        with self.lock:
            h = self.hosts.setdefault(host, _Host())
            h.not_before = max(h.not_before, time.monotonic() + seconds)

    def charge(self, host: str, nbytes: int, bytes_per_s: float) -> None:
        """``nbytes`` received from ``host``: the next request waits until they are paid for."""
        with self.lock:
            h, now = self.hosts.setdefault(host, _Host()), time.monotonic()
            h.paid_until = max(h.paid_until, now) + nbytes / bytes_per_s

    def report(self, events: dict[str, list[Any]], hosts: list[str], breaker_failures: int,
               cooldown_s: float) -> dict[str, list[float]]:
        """Apply attempt results ``{host: [a success came, failures after the last success]}``;
        return [seconds to wait, seconds open] of each of ``hosts`` that has either."""
        with self.lock:
            now = time.monotonic()
            for host, (reset, failures) in events.items():
                h = self.hosts.setdefault(host, _Host())
                h.failures = failures if reset else h.failures + failures
                if failures and h.failures >= breaker_failures and h.open_until <= now:
                    h.open_until = now + cooldown_s  # opened, or opened again after the cooldown
            state = {host: self._left(self.hosts[host], now) for host in hosts if host in self.hosts}
            return {host: left for host, left in state.items() if any(left)}


_LOCAL = HostLedger()


class HostLedgerPlugin(SchedulerPlugin):
    """The cluster's :class:`HostLedger`, answering the ``corpusforge_fetch_hosts`` handler."""

    idempotent = True  # a second registration (another unit, another worker) keeps the first
    name = PLUGIN_NAME

    def start(self, scheduler: Any) -> None:
        self.ledger = HostLedger()  # made on the scheduler (a lock does not travel)
        scheduler.handlers[HANDLER] = self.handle

    def handle(self, action: str, args: list[Any]) -> Any:
        if action not in ("reserve", "pause", "charge", "report"):
            raise ValueError(f"unknown host ledger action {action!r}")
        return getattr(self.ledger, action)(*args)


_REGISTERED: set[str] = set()  # scheduler addresses this process registered the plugin with
_REGISTER_LOCK = threading.Lock()


def on_dask_worker() -> bool:
    """Whether this code runs in a task on a Dask worker (whose cluster then shares state)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


def cluster_client() -> Any:
    """The Dask client of the worker this task runs on, or None outside a cluster."""
    if not on_dask_worker():
        return None
    from distributed import get_client

    return get_client()


def ledger_call(client: Any, action: str, *args: Any) -> Any:
    """``HostLedger.<action>(*args)`` on the cluster's ledger (``client``), or this process's."""
    if client is None:
        return getattr(_LOCAL, action)(*args)
    with _REGISTER_LOCK:
        if client.scheduler.address not in _REGISTERED:
            client.register_plugin(HostLedgerPlugin())
            _REGISTERED.add(client.scheduler.address)
    return client.sync(getattr(client.scheduler, HANDLER), action=action, args=list(args))
