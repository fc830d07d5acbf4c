"""A fetch unit's URLs worked through host by host, in lanes: a lane takes one of a host's slots
(:class:`~tasks.ingest.fetch.politeness.HostSlots`), fetches the unit's URLs of that host one
after the other until none is left, and returns the slot. At most ``threads`` lanes run at once,
at most a host's connection limit on one host (counted across every unit by the slots). So a slot
costs two scheduler round trips per lane, not per request, and is never held idle (why, and what
slots taken per request cost before: docs/fetch.md, politeness)."""

from __future__ import annotations

import contextvars
import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tasks.ingest.fetch.politeness import HostSlots

T = TypeVar("T", bound=Hashable)
WAIT_S = 1.0  # a thread waits this long for the slot of the host it picked, then picks again


def run_lanes(queues: dict[str, deque[T]], slots: HostSlots, limit: Callable[[str], int], threads: int,
              work: Callable[[T], tuple[str, T] | None]) -> None:
    """``work(item)`` for every item of ``queues`` (host → its items, in order), in lanes; an
    item ``work`` hands back as ``(host, item)`` (a redirect to another host) joins that host's
    queue, so a lane never waits for a slot while it holds one. An exception in ``work`` stops
    the other lanes after their current item and is raised here."""
    lock = threading.Lock()
    lanes: Counter[str] = Counter()
    hosts = list(queues)
    stop = threading.Event()

    def pick(first: int) -> str | None:
        """A host with items left and room for one more lane of this unit, reserved for a lane:
        the one with the fewest of this unit's lanes, hosts taken round from ``first``."""
        with lock:
            turn = hosts[first:] + hosts[:first]
            room = [h for h in turn if queues[h] and lanes[h] < limit(h)]
            if not room:
                return None
            host = min(room, key=lanes.__getitem__)  # the first of the fewest
            lanes[host] += 1
            return host

    def drain(host: str) -> None:
        with slots.lane(host, limit(host)):
            while not stop.is_set():
                with lock:
                    if not queues[host]:
                        return
                    item = queues[host].popleft()
                handed = work(item)
                if handed is not None:  # the lane that drains the queue it joins, or the next, takes it
                    with lock:
                        if handed[0] not in queues:
                            queues[handed[0]] = deque()
                            hosts.append(handed[0])
                        queues[handed[0]].append(handed[1])

    def lane_thread(n: int) -> None:
        try:
            for attempt in itertools.count():
                if stop.is_set() or (host := pick((n + attempt) % len(hosts))) is None:
                    return
                try:
                    # one scheduler round trip; a release of the host's slot anywhere wakes it
                    if slots.take(host, limit(host), WAIT_S):
                        drain(host)
                finally:
                    with lock:
                        lanes[host] -= 1
        except BaseException:
            stop.set()
            raise

    useful = min(threads, sum(min(limit(h), len(q)) for h, q in queues.items()))  # lanes that can run at once
    if not useful:
        return
    with ThreadPoolExecutor(useful) as pool:
        # each thread runs in a copy of this task's context: the Dask worker it runs on is a
        # ContextVar, and it is what makes the host slots cluster-wide (a thread without it fell
        # back to a per-process limit: 3 in flight at one host were seen)
        jobs = [pool.submit(contextvars.copy_context().run, lane_thread, n) for n in range(useful)]
        for job in jobs:
            job.result()
