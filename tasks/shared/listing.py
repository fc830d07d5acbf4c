"""A folder's listing out of core: every flow that lists a folder of user files (a build's
source, evaluate's and qualify-prompts' generated images) spills it as it comes and reads it
back sorted one range of keys at a time (:func:`spill_listing`, :func:`sorted_ranges`; links
listed, never followed: :func:`tasks.shared.inputs.scan_folder`), so no process holds the
folder's paths.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import fsspec.asyn
import pyarrow as pa
import pyarrow.compute as pc

from corpusforge.key_ranges import FAN_OUT, ROWS_PER_RANGE, Table, key_ranges
from corpusforge.storage import Store
from tasks.shared.inputs import scan_folder, walk_local

LISTING_THREADS = 16  # top-level sub-folders listed at once (I/O-bound)
SPILL_ROWS = 16_384  # entries of one spill part (held as Arrow columns until it is written)
SPILL_BATCH = 256  # entries a lister hands to the writer at a time (the queue holds 32 batches, ~1 MB of paths)
REMOTE_PAGE = 1_000  # objects taken from an S3 listing at a time (its page size)
LISTING_RANGE_ROWS = ROWS_PER_RANGE  # listing entries sorted or matched at a time
LISTING_FAN_OUT = FAN_OUT  # ranges one split of the listing makes

# A listed entry: (path as the filesystem names it, a regular file, the object store's listing
# entry: its size and ETag, what a stamp is made of; None locally)
Listed = tuple[str, bool, dict[str, Any] | None]
ToTable = Callable[[list[Listed]], pa.Table]


def spill_path(folder: str, n: int) -> str:
    return f"{folder}/part-{n:06d}.parquet"


def _s3_entries(fs: fsspec.AbstractFileSystem, path: str, delimiter: str) -> Iterator[dict[str, Any]]:
    """An S3 listing's entries a page at a time: s3fs's ``find`` and ``ls`` return (and
    cache) the whole listing."""
    bucket, key, _ = fs.split_path(path)
    listing = fs._iterdir(bucket, delimiter=delimiter, prefix=f"{key}/" if key else "")

    async def page() -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        async for entry in listing:
            entries.append(entry)
            if len(entries) == REMOTE_PAGE:
                break
        return entries

    while entries := fsspec.asyn.sync(fs.loop, page):
        yield from entries


def _remote_scan(fs: fsspec.AbstractFileSystem, path: str, prefixes: list[str] | None) -> Iterator[Listed]:
    """Every object under a prefix, or with ``prefixes`` a list only those directly under
    it, its sub-prefixes appended to the list. Streamed from S3; other object stores list
    with ``find``/``ls``. An object is a regular file."""
    import s3fs  # only for remote sources (it takes a quarter of a second to import)

    if isinstance(fs, s3fs.S3FileSystem):
        entries = _s3_entries(fs, path, "" if prefixes is None else "/")
    elif prefixes is None:
        entries = iter(fs.find(path, detail=True).values())
    else:
        entries = fs.ls(path, detail=True)
    for entry in entries:
        if entry["type"] == "directory":
            prefixes.append(entry["name"])
        else:
            yield entry["name"], True, entry


def _local_scan(folder: str, folders: list[str] | None) -> Iterator[Listed]:
    """:func:`scan_folder` (``folders`` given) or :func:`walk_local` as :data:`Listed` entries."""
    entries = walk_local(folder) if folders is None else scan_folder(folder, folders)
    return ((path, regular, None) for path, regular in entries)


class SpillWriter:
    """Spill parts of :data:`SPILL_ROWS` entries, written from one thread: Arrow's allocator
    (mimalloc) keeps a heap per thread that builds tables, so parts written by the listers
    themselves held ~14 MB per lister (measured at 100k files in 10 sub-folders: the spill held
    210 MB above the start, 71 MB from one writer)."""

    def __init__(self, store: Store, folder: str, to_table: ToTable) -> None:
        self.store, self.folder, self.to_table = store, folder, to_table
        self.parts: list[str] = []
        self.pending: list[pa.Table] = []
        self.held = 0

    def add(self, entries: list[Listed]) -> None:
        while entries:
            take = entries[:SPILL_ROWS - self.held]
            entries = entries[len(take):]
            self.pending.append(self.to_table(take))
            self.held += len(take)
            if self.held == SPILL_ROWS:
                self.flush()

    def flush(self) -> None:
        if self.held:
            self.parts.append(spill_path(self.folder, len(self.parts)))
            self.store.write_parquet(self.parts[-1], pa.concat_tables(self.pending))
            self.pending, self.held = [], 0


def _batched(entries: Iterator[Listed]) -> Iterator[list[Listed]]:
    """``entries`` in lists of :data:`SPILL_BATCH`."""
    return iter(lambda: list(itertools.islice(entries, SPILL_BATCH)), [])


def spill_listing(store: Store, folder: str, fs: fsspec.AbstractFileSystem, root: str, remote: bool,
                  to_table: ToTable) -> list[str]:
    """List a folder (local) or prefix (remote) into spill parts under ``folder`` of ``store``,
    each made by ``to_table`` from the entries it holds (which may drop some); their paths. The
    top level first, then its sub-folders on :data:`LISTING_THREADS` listers, which hand
    batches of :data:`SPILL_BATCH` entries (a bounded queue of them) to this thread, the one
    writer (``to_table`` runs here too)."""
    folders: list[str] = []
    writer = SpillWriter(store, folder, to_table)
    for batch in _batched(_remote_scan(fs, root, folders) if remote else _local_scan(root, folders)):
        writer.add(batch)
    listings = ((_remote_scan(fs, f, None) if remote else _local_scan(f, None)) for f in folders)
    lock = threading.Lock()
    batches: queue.Queue[list[Listed] | None] = queue.Queue(2 * LISTING_THREADS)
    stop = threading.Event()

    def lister() -> None:
        try:
            while not stop.is_set():
                with lock:
                    listing = next(listings, None)
                if listing is None:
                    return
                for batch in _batched(listing):
                    if stop.is_set():
                        return
                    batches.put(batch)
        except BaseException:
            stop.set()  # the others stop too: the error is raised once they have
            raise
        finally:
            batches.put(None)

    with ThreadPoolExecutor(LISTING_THREADS) as pool:
        listers = [pool.submit(lister) for _ in range(LISTING_THREADS)]
        running = len(listers)
        try:
            while running:
                batch = batches.get()
                if batch is None:
                    running -= 1
                elif not stop.is_set():
                    writer.add(batch)
        except BaseException:
            stop.set()
            while running:  # let every lister see the stop and finish
                if batches.get() is None:
                    running -= 1
            raise
        finally:
            stop.set()
        for done in listers:
            done.result()
    writer.flush()
    return writer.parts


def sorted_ranges(store: Store, parts: list[str], schema: pa.Schema, key: str, remote: bool
                  ) -> Iterator[pa.Table]:
    """The rows of the parquet ``parts`` sorted by ``key``, a range of about
    :data:`LISTING_RANGE_ROWS` rows at a time; with ``remote``, a row whose key repeats the
    one before is dropped (an object listed twice: at the top level and under a prefix)."""
    for ranged in key_ranges({"rows": Table(store, parts, schema)}, LISTING_RANGE_ROWS, LISTING_FAN_OUT,
                             key=key):
        rows = ranged["rows"].sort_by(key)
        if remote and rows.num_rows > 1:
            keys = rows[key]
            repeated = pc.equal(keys.slice(1), keys.slice(0, rows.num_rows - 1))
            rows = rows.filter(pa.concat_arrays([pa.array([True]), pc.invert(repeated).combine_chunks()]))
        yield rows
