"""One build per output: a lease on the output root, taken before a build writes anything.

Two builds writing one output at once mix their files (and one of them crashes on the other's
half-written shards), so a build first creates ``OUT/work/lease.json`` exclusively (``O_EXCL``
locally, a conditional put on an object store), refreshes it every :data:`HEARTBEAT_SECONDS` and
removes it when it ends; a stale lease is taken over so that of several builds one wins.
docs/storage.md ("One build per output") gives the rules.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from corpusforge.layout import OUTPUT_LEASE
from corpusforge.storage import Store

HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0  # ten missed heartbeats: the holder is gone
WAIT_POLL_SECONDS = 2.0

_HELD: dict[str, OutputLease] = {}  # this process's leases, by lease location
_HELD_LOCK = threading.Lock()


class OutputBusy(Exception):
    """Another build holds the output root: the message names it, in one line."""

    def __init__(self, out: str, holder: dict[str, Any], where: str):
        self.holder = holder
        run = f"flow run {holder['flow_run']}, " if holder.get("flow_run") else ""
        super().__init__(f"output root {out} is being built by another build: host {holder.get('host')} pid "
                         f"{holder.get('pid')} ({run}started {holder.get('started')}; lease {where}); "
                         "wait for it with --wait")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class OutputLease:
    """The lease on one output root (see the module's docstring); use :func:`holding_output`."""

    def __init__(self, store: Store, flow_run: str | None = None):
        self.store = store
        self.where = store.path(OUTPUT_LEASE)
        self.holder = {"host": socket.gethostname(), "pid": os.getpid(), "flow_run": flow_run, "started": _now(),
                       "token": uuid.uuid4().hex}
        self.lost = False
        self.made: list[str] = []  # local folders the lease created, removed with it when left empty
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # ---- the lease object --------------------------------------------------
    def _body(self) -> bytes:
        return json.dumps({**self.holder, "refreshed": _now(), "refreshed_unix": time.time()}).encode()

    def _fs_path(self) -> str:
        return self.store._fs_path(OUTPUT_LEASE)

    def _read(self) -> tuple[dict[str, Any], str | None] | None:
        """The lease now there and its ETag (object stores), or None."""
        try:
            if self.store.remote:
                info = self.store.fs.info(self._fs_path())
                return json.loads(self.store.fs.cat_file(self._fs_path())), info.get("ETag")
            with open(self.where, "rb") as f:
                return json.loads(f.read()), None
        except FileNotFoundError:
            return None
        except ValueError:  # a lease cut short while written: its holder died at once
            return {"host": "?", "pid": "?", "refreshed_unix": 0.0, "token": None}, None

    def _create(self) -> bool:
        """Create the lease exclusively; False when one is there."""
        if self.store.remote:
            return self._put(mode="create")
        folder = os.path.dirname(self.where)
        while not os.path.isdir(folder) and folder not in self.made:
            self.made.append(folder)
            folder = os.path.dirname(folder)
        os.makedirs(os.path.dirname(self.where), exist_ok=True)
        try:
            fd = os.open(self.where, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self._body())
            f.flush()
            os.fsync(f.fileno())
        return True

    def _put(self, **condition: Any) -> bool:
        """A conditional put of our lease (``mode="create"`` or ``IfMatch=etag``); False
        when the condition did not hold."""
        try:
            self.store.fs.pipe_file(self._fs_path(), self._body(), **condition)
        except OSError as exc:
            if _precondition_failed(exc):
                return False
            raise
        return True

    def _take_over(self, stale: dict[str, Any], etag: str | None) -> bool:
        """Replace the stale lease ``stale`` by ours; False when someone else changed it first."""
        if self.store.remote:
            return etag is not None and self._put(IfMatch=etag)
        grave = f"{self.where}.{self.holder['token']}.stale"
        try:
            os.rename(self.where, grave)
        except FileNotFoundError:
            return self._create()
        try:
            with open(grave, "rb") as f:
                moved = json.loads(f.read() or b"{}")
        except ValueError:
            moved = {}
        if moved.get("token") != stale.get("token"):  # a new holder's lease: put it back
            with contextlib.suppress(FileExistsError):
                os.link(grave, self.where)
        os.unlink(grave)
        return self._create()

    def is_stale(self, lease: dict[str, Any]) -> bool:
        if lease.get("host") == self.holder["host"] and lease.get("pid") == os.getpid():
            with _HELD_LOCK:  # this process's own: stale unless a build here holds it now (a
                return self.where not in _HELD  # release the storage refused, e.g. mid-outage)
        if lease.get("host") == self.holder["host"] and isinstance(lease.get("pid"), int):
            try:
                os.kill(lease["pid"], 0)
            except ProcessLookupError:
                return True  # its process is gone
            except PermissionError:
                pass  # it runs, as another user
        return time.time() - float(lease.get("refreshed_unix") or 0) > STALE_SECONDS

    # ---- taking, refreshing, giving back ---------------------------------
    def acquire(self, wait: bool = False, waiting: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Take the lease; with another live holder, raise :class:`OutputBusy`, or with
        ``wait`` poll until it is free (``waiting(holder)`` is called once, when waiting starts)."""
        announced = False
        while True:
            if self._create():
                break
            current = self._read()
            if current is None:
                continue  # released between our create and our read
            lease, etag = current
            if self.is_stale(lease):
                if self._take_over(lease, etag):
                    logging.getLogger("corpusforge").warning(
                        "took over the stale lease of %s (host %s pid %s, last refreshed %s)", self.store.root,
                        lease.get("host"), lease.get("pid"), lease.get("refreshed"))
                    break
                continue
            if not wait:
                raise OutputBusy(self.store.root, lease, self.where)
            if waiting is not None and not announced:
                waiting(lease)
                announced = True
            time.sleep(WAIT_POLL_SECONDS)
        self._beat = threading.Thread(target=self._heartbeat, name="output-lease", daemon=True)
        self._beat.start()

    def refresh(self) -> None:
        """Rewrite the lease (a heartbeat); a lease that is no longer ours is not touched."""
        if self.lost:
            return
        current = self._read()
        if current is None or current[0].get("token") != self.holder["token"]:
            self.lost = True
        elif self.store.remote:
            self.lost = not self._put(IfMatch=current[1])
        else:
            self.store.write_bytes(OUTPUT_LEASE, self._body())
        if self.lost:
            logging.getLogger("corpusforge").error("the lease on %s was taken over by another build", self.store.root)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - an unreachable store raises botocore's own errors, not OSError
                # a storage hiccup: the next beat tries again (a dead thread would print its traceback)
                logging.getLogger("corpusforge").warning("lease on %s not refreshed (%s: %s); the next beat tries again",
                                                         self.store.root, type(exc).__name__, exc)

    def release(self) -> None:
        """Stop refreshing and remove the lease, if it is still ours."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        current = self._read()
        if current is not None and current[0].get("token") == self.holder["token"]:
            self.store.remove(OUTPUT_LEASE)
        for folder in self.made:  # innermost first: a run that wrote nothing leaves nothing
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def _precondition_failed(exc: BaseException) -> bool:
    """True for an object store's "precondition failed" answer (HTTP 412) to a conditional put."""
    while exc is not None:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or "pre-condition" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def held_here(store: Store) -> bool:
    """True when this process holds the lease on ``store``'s root (a CLI run, inside its flow)."""
    with _HELD_LOCK:
        return store.path(OUTPUT_LEASE) in _HELD


@contextlib.contextmanager
def holding_output(store: Store, wait: bool = False, flow_run: str | None = None,
                   waiting: Callable[[dict[str, Any]], None] | None = None) -> Iterator[OutputLease]:
    """Hold the lease on ``store``'s root for the block: taken (or, when this process holds
    it already, reused and named after ``flow_run``), and given back at the end, also on
    failure. Raises :class:`OutputBusy` when another build holds it and ``wait`` is off."""
    with _HELD_LOCK:
        held = _HELD.get(store.path(OUTPUT_LEASE))
    if held is not None:
        if flow_run:  # known once the flow has started: the lease names it from now on
            held.holder["flow_run"] = flow_run
            held.refresh()
        yield held
        return
    lease = OutputLease(store, flow_run)
    lease.acquire(wait=wait, waiting=waiting)
    with _HELD_LOCK:
        _HELD[lease.where] = lease
    try:
        yield lease
    finally:
        with _HELD_LOCK:
            _HELD.pop(lease.where, None)
        lease.release()
