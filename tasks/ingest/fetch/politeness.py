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


SYNC_S = 0.2  # how often a unit on a cluster reports attempts and learns the others' pauses


class HostView:
    """One fetch unit's view of the :class:`~tasks.ingest.fetch.hostledger.HostLedger` its
    cluster (or process) shares. Hosts without a minimum interval or a bandwidth limit take the
    fast path: a request waits on the locally known pause and breaker, and on a cluster a
    background thread reports successes and learns every unit's pauses every :data:`SYNC_S`
    (one scheduler round trip for all the unit's hosts). A pause (Retry-After, backoff) and a
    failed attempt are sent at once (failures are rare, and the breaker must count every unit's
    before it opens). A host with ``min_interval`` or a bandwidth limit asks the ledger for each
    request's turn (a round trip per request, small beside the interval it waits)."""

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
            self._learn(host)  # on a cluster: what the other units know of a host new to this one
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

    def _learn(self, host: str) -> None:
        """Before this unit's first request to ``host``, learn its pauses and breaker from the
        ledger (and start syncing). The unit's other request threads wait for that answer: one
        that went ahead on the empty local view slipped past another unit's Retry-After (seen
        1.7 s into a 3 s pause on a loaded machine)."""
        with self.lock:
            learned = self.learned.get(host)
            first = learned is None
            if first:
                learned = self.learned[host] = threading.Event()
                start = self.syncer is None
                if start:
                    self.syncer = threading.Thread(target=contextvars.copy_context().run,
                                                   args=(self._sync_loop,), daemon=True)
        if not first:
            learned.wait()
            return
        if start:
            self.syncer.start()
        try:
            self._sync([host])
        finally:
            learned.set()  # a failed answer leaves the local view, as the syncing does

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
