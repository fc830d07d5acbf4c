"""robots.txt and ``/.well-known/tdmrep.json``, fetched once per origin and kept in the fetch
store (``fetch/origins/``), reused by every unit, worker and run for ``robots_max_age_s``. One
worker fetches an origin's files at a time (a cluster-wide lock per origin), so an origin's
robots.txt is requested once however many units need it. A file that could not be fetched
(5xx, unreachable) is reused only within the run that met it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import datetime

from corpusforge.hashing import sha256_bytes
from tasks.ingest.files import fetch_origin_path
from corpusforge.storage import Store
from tasks.ingest.fetch.addresses import Target
from tasks.ingest.fetch.hostledger import on_dask_worker
from tasks.ingest.fetch.optouts import OriginFile

ORIGIN_FILES = ("robots.txt", ".well-known/tdmrep.json")
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


@contextlib.contextmanager
def origin_lock(origin: str) -> Iterator[None]:
    """Held while one origin's files are looked up or fetched: process-wide, and cluster-wide on
    a Dask worker (``distributed.Lock``)."""
    with _LOCKS_LOCK:
        local = _LOCKS.setdefault(origin, threading.Lock())
    with local:
        if not on_dask_worker():
            yield
            return
        from distributed import Lock

        with Lock(f"corpusforge-fetch-origin:{origin}"):
            yield


class Origins:
    """The origin files one fetch unit has looked up, by origin."""

    def __init__(self, store: Store, fetch_file: Callable[[Target], OriginFile], now: Callable[[], datetime],
                 max_age_s: float):
        self.store, self.fetch_file, self.now, self.max_age_s = store, fetch_file, now, max_age_s
        self._seen: dict[str, dict[str, OriginFile]] = {}
        self._lock = threading.Lock()
        self.fetched = 0  # origin files this unit requested

    def files(self, target: Target) -> dict[str, OriginFile]:
        origin = target.origin
        with self._lock:
            if origin in self._seen:
                return self._seen[origin]
        files = self._stored(origin)  # stored: no lock taken (two scheduler round trips on a cluster)
        if files is None:
            with origin_lock(origin):
                files = self._stored(origin) or self._fetch(target)
        with self._lock:
            self._seen[origin] = files
        return files

    def _stored(self, origin: str) -> dict[str, OriginFile] | None:
        rel = fetch_origin_path(sha256_bytes(origin.encode()))
        if not self.store.exists(rel):
            return None
        data = self.store.read_json(rel)
        age = (self.now() - datetime.fromisoformat(data["fetched_at"])).total_seconds()
        if age > self.max_age_s:
            return None
        return {name: OriginFile.from_json(f) for name, f in data["files"].items()}

    def _fetch(self, target: Target) -> dict[str, OriginFile]:
        files = {}
        for name in ORIGIN_FILES:
            files[name] = self.fetch_file(Target(target.scheme, target.host, target.port, f"/{name}"))
            self.fetched += 1
        if all(f.status is not None and f.status < 500 for f in files.values()):
            rel = fetch_origin_path(sha256_bytes(target.origin.encode()))
            self.store.write_json(rel, {"origin": target.origin, "fetched_at": self.now().isoformat(),
                                        "files": {n: f.to_json() for n, f in files.items()}})
        return files
