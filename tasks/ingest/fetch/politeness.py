"""Politeness towards a host, all of it holding across every Dask worker of a build: a limit on
requests in flight (a ``distributed.Semaphore`` per host), and the host's pauses (``Retry-After``
in seconds or as an HTTP date up to a cap, exponential backoff with jitter), circuit breaker,
minimum interval and bandwidth (the scheduler's host ledger, :mod:`.hostledger`). Outside a
cluster the same rules hold per process."""

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

from tasks.ingest.fetch.hostledger import cluster_client, ledger_call, on_dask_worker

RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_LOCAL: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_LOCAL_LOCK = threading.Lock()


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


class HostSlots:
    """One fetch unit's slots on hosts: at most ``limit`` requests in flight to a host across every
    Dask worker, a slot being a lease of a ``distributed.Semaphore`` per host (process-wide
    semaphores outside a cluster). A lane (:mod:`.lanes`) keeps one slot while it drains the
    unit's URLs of that host; a redirect to another host goes on in a lane of that host (a
    :class:`~tasks.ingest.fetch.fetcher.Hop`), so a lane never waits for a slot while it holds one.
    A request outside any lane holds a slot of its host for that request alone."""

    def __init__(self) -> None:
        self.mine = threading.local()  # .host: the host whose slot this thread's lane holds

    def take(self, host: str, limit: int, timeout: float | None) -> bool:
        """One of ``host``'s ``limit`` slots, waiting at most ``timeout`` s (None: as long as it takes)."""
        shared = _cluster_semaphore(f"corpusforge-fetch:{host}:{limit}", limit)
        if shared is not None:
            return bool(shared.acquire(timeout=timeout))
        with _LOCAL_LOCK:
            local = _LOCAL.setdefault((host, limit), threading.BoundedSemaphore(limit))
        return local.acquire(timeout=timeout)

    def give(self, host: str, limit: int) -> None:
        shared = _cluster_semaphore(f"corpusforge-fetch:{host}:{limit}", limit)
        if shared is not None:
            shared.release()
        else:
            _LOCAL[(host, limit)].release()

    @contextlib.contextmanager
    def lane(self, host: str, limit: int) -> Iterator[None]:
        """This thread's requests to ``host`` use the slot it took (:meth:`take`); returned on exit."""
        self.mine.host = host
        try:
            yield
        finally:
            self.mine.host = None
            self.give(host, limit)

    def lane_elsewhere(self, host: str) -> bool:
        """Whether this thread's lane holds a slot of a host other than ``host``."""
        return getattr(self.mine, "host", None) not in (None, host)

    @contextlib.contextmanager
    def slot(self, host: str, limit: int, timeout: float) -> Iterator[None]:
        """A slot for one request to ``host``: the thread's lane's, or (outside a lane) one taken
        for the request, waiting at most ``timeout`` (then :class:`SlotTimeout`, a failed attempt)."""
        if getattr(self.mine, "host", None) == host:
            yield
            return
        if not self.take(host, limit, timeout):
            raise SlotTimeout(f"no free connection to {host} within {timeout:g} s")
        try:
            yield
        finally:
            self.give(host, limit)


class SlotTimeout(Exception):
    """No slot of a host came free in time (see :meth:`HostSlots.slot`)."""


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


SYNC_S = 0.2  # how often a unit on a cluster reports attempts and learns the others' pauses


class HostView:
    """One fetch unit's view of the :class:`~tasks.ingest.fetch.hostledger.HostLedger` its
    cluster (or process) shares; its fast path and per-request turns: docs/fetch.md (politeness).
    A pause and a failed attempt are sent at once: failures are rare, and the breaker must count
    every unit's before it opens."""

    def __init__(self, breaker_failures: int, cooldown_s: float):
        self.breaker_failures, self.cooldown_s = breaker_failures, cooldown_s
        self.client = cluster_client()
        self.lock = threading.Lock()
        self.wait_until: dict[str, float] = {}  # this process's monotonic clock
        self.open_until: dict[str, float] = {}
        self.floor: dict[str, float] = {}  # pauses set here (a sync answer that crossed them keeps them)
        self.events: dict[str, list] = {}  # host -> [a success came, failures after it], not yet reported
        self.learned: dict[str, threading.Event] = {}  # the hosts this unit works with: set once its first answer came
        self.closed = threading.Event()
        self.syncer: threading.Thread | None = None

    def turn(self, host: str, min_interval: float, metered: bool) -> float | None:
        """Wait for a turn at ``host``; the seconds waited, or None while its breaker is open."""
        if min_interval or metered:
            wait, open_left = ledger_call(self.client, "reserve", host, min_interval)
            if open_left:
                return None
            time.sleep(wait)
            return wait
        if self.client is None:
            self._sync([host])  # in-process: exact and cheap
        else:
            self.learn([host])  # on a cluster: what the other units know of a host new to this one
        waited = 0.0
        while True:
            with self.lock:
                now = time.monotonic()
                if self.open_until.get(host, 0.0) > now:
                    return None
                wait = max(self.wait_until.get(host, 0.0), self.floor.get(host, 0.0)) - now
            if wait <= 0:
                return waited
            time.sleep(wait)
            waited += wait

    def pause(self, host: str, seconds: float) -> None:
        """No request to ``host`` from any unit for ``seconds``."""
        with self.lock:
            self.floor[host] = max(self.floor.get(host, 0.0), time.monotonic() + seconds)
        ledger_call(self.client, "pause", host, seconds)

    def charge(self, host: str, nbytes: int, bytes_per_s: float) -> None:
        ledger_call(self.client, "charge", host, nbytes, bytes_per_s)

    def failed(self, host: str) -> None:
        with self.lock:
            self.events.setdefault(host, [False, 0])[1] += 1
        self._sync([host])  # reported at once: the answer says whether the breaker is open now

    def succeeded(self, host: str) -> None:
        with self.lock:
            self.events[host] = [True, 0]
        if self.client is None:
            self._sync([host])

    def _sync(self, hosts: list[str]) -> None:
        """Report the attempts not yet reported; learn ``hosts``' pauses and breakers."""
        with self.lock:
            events, self.events = self.events, {}
        answer = ledger_call(self.client, "report", events, hosts, self.breaker_failures, self.cooldown_s)
        now = time.monotonic()
        with self.lock:
            for host in hosts:
                wait, open_left = answer.get(host, (0.0, 0.0))
                self.wait_until[host] = now + wait
                self.open_until[host] = now + open_left

    def learn(self, hosts: list[str]) -> None:
        """Before this unit's first request to any of ``hosts``, learn their pauses and breakers
        from the ledger in one round trip (and start syncing); on a cluster only. The unit's other
        request threads wait for that answer: one that went ahead on the empty local view slipped
        past another unit's Retry-After (seen 1.7 s into a 3 s pause on a loaded machine). A unit
        learns all its hosts at once before it starts (one round trip, not one per host)."""
        if self.client is None:
            return
        with self.lock:
            waits = [self.learned[h] for h in hosts if h in self.learned]
            new = [h for h in dict.fromkeys(hosts) if h not in self.learned]
            for h in new:
                self.learned[h] = threading.Event()
            start = bool(new) and self.syncer is None
            if start:
                self.syncer = threading.Thread(target=contextvars.copy_context().run,
                                               args=(self._sync_loop,), daemon=True)
        if start:
            self.syncer.start()
        if new:
            try:
                self._sync(new)
            finally:
                for h in new:
                    self.learned[h].set()  # a failed answer leaves the local view, as the syncing does
        for event in waits:
            event.wait()

    def _sync_loop(self) -> None:
        while not self.closed.wait(SYNC_S):
            with self.lock:
                hosts = sorted(self.learned)
            try:
                self._sync(hosts)
            except OSError:  # the scheduler is out of reach a moment: the local view holds meanwhile
                continue

    def close(self) -> None:
        """Stop syncing; report the last attempts."""
        self.closed.set()
        if self.syncer is not None:
            self.syncer.join()
        if self.events:
            self._sync([])
