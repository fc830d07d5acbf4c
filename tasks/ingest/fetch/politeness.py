"""Politeness towards a host: a limit on requests in flight that holds across every Dask worker
(a ``distributed.Semaphore`` per host, or a process-wide one outside a cluster), a minimum
interval between requests, ``Retry-After`` honoured in seconds or as an HTTP date up to a cap,
exponential backoff with jitter, and a circuit breaker."""

from __future__ import annotations

import contextlib
import contextvars
import random
import threading
import time
from collections.abc import Iterator
from typing import Any
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_LOCAL: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_LOCAL_LOCK = threading.Lock()


def on_dask_worker() -> bool:
    """Whether this code runs in a task on a Dask worker (whose cluster then shares locks)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


_SHARED: dict[str, Any] = {}


def _cluster_semaphore(name: str, limit: int) -> Any:
    """A ``distributed.Semaphore`` every worker of this task's cluster shares, or None outside one."""
    if not on_dask_worker():
        return None
    from distributed import Semaphore

    with _LOCAL_LOCK:
        if name not in _SHARED:
            _SHARED[name] = Semaphore(max_leases=limit, name=name)
        return _SHARED[name]


LEASE_LINGER_S = 0.5  # an idle cluster lease is kept this long for the unit's next request to the host


class HostSlots:
    """One fetch unit's slots on hosts: at most ``limit`` requests in flight to a host across every
    Dask worker, held as leases of a ``distributed.Semaphore`` per host (process-wide semaphores
    outside a cluster). A lease is kept while the unit keeps using it and returned after
    :data:`LEASE_LINGER_S` idle, so a request costs no scheduler round trip while a unit works
    through a host's URLs, and a lease never waits on work elsewhere for long."""

    def __init__(self, linger: float = LEASE_LINGER_S):
        self.linger = linger
        self.lock = threading.Lock()
        self.idle: dict[str, list[float]] = {}  # host -> when each held, unused lease became idle
        self.limits: dict[str, int] = {}
        self.closed = threading.Event()
        self.reaper: threading.Thread | None = None

    @contextlib.contextmanager
    def slot(self, host: str, limit: int) -> Iterator[None]:
        """Hold one of ``limit`` slots for ``host`` while a request is in flight."""
        shared = _cluster_semaphore(f"corpusforge-fetch:{host}:{limit}", limit)
        if shared is None:
            with _LOCAL_LOCK:
                local = _LOCAL.setdefault((host, limit), threading.BoundedSemaphore(limit))
            with local:
                yield
            return
        with self.lock:
            self.limits[host] = limit
            reused = bool(self.idle.get(host))
            if reused:
                self.idle[host].pop()
            if self.reaper is None:
                self.reaper = threading.Thread(target=contextvars.copy_context().run, args=(self._reap,),
                                               daemon=True)  # in this task's context: its Dask worker
                self.reaper.start()
        if not reused:
            shared.acquire()
        try:
            yield
        finally:
            with self.lock:
                self.idle.setdefault(host, []).append(time.monotonic())

    def _release_idle(self, older_than: float) -> None:
        now = time.monotonic()
        freed = []
        with self.lock:
            for host, since in self.idle.items():
                keep = [t for t in since if now - t < older_than]
                freed += [host] * (len(since) - len(keep))
                self.idle[host] = keep
        for host in freed:
            limit = self.limits[host]
            _cluster_semaphore(f"corpusforge-fetch:{host}:{limit}", limit).release()

    def _reap(self) -> None:
        while not self.closed.wait(self.linger / 2):
            self._release_idle(self.linger)

    def close(self) -> None:
        """Return every lease (all are idle once the unit's requests are done)."""
        self.closed.set()
        if self.reaper is not None:
            self.reaper.join()
        self._release_idle(-1.0)


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A ``Retry-After`` value in seconds from ``now``: delta-seconds or an HTTP date; None when
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before attempt ``attempt`` + 1: ``base`` · 2^attempt, ±50 % jitter, capped."""
    return min(cap, base * (2 ** attempt)) * rng.uniform(0.5, 1.5)


class HostState:
    """One worker process's view of a host: when the next request may start (Retry-After,
    minimum interval), consecutive failures (the breaker) and the figures the receipt reports."""

    def __init__(self, breaker_failures: int):
        self.lock = threading.Lock()
        self.not_before = 0.0
        self.failures = 0
        self.breaker_failures = breaker_failures

    def wait_turn(self, min_interval: float) -> float:
        """Sleep until this host may be asked again; the seconds waited."""
        with self.lock:
            now = time.monotonic()
            start = max(now, self.not_before)
            self.not_before = start + min_interval if min_interval else self.not_before
        if start > now:
            time.sleep(start - now)
        return start - now

    def pause(self, seconds: float) -> None:
        with self.lock:
            self.not_before = max(self.not_before, time.monotonic() + seconds)

    def failed(self) -> None:
        with self.lock:
            self.failures += 1

    def succeeded(self) -> None:
        with self.lock:
            self.failures = 0

    @property
    def open(self) -> bool:
        return self.failures >= self.breaker_failures


class Hosts:
    """The :class:`HostState` of every host one fetch unit talks to."""

    def __init__(self, breaker_failures: int):
        self._lock = threading.Lock()
        self._states: dict[str, HostState] = {}
        self.breaker_failures = breaker_failures

    def __getitem__(self, host: str) -> HostState:
        with self._lock:
            return self._states.setdefault(host, HostState(self.breaker_failures))
