"""One storage abstraction over fsspec so local folders and ``s3://`` share one code path.

Every write is atomic: a reader either sees the complete final object or nothing (a temp file
``.name.*.part`` renamed locally; a local temp file uploaded in one ``put`` to an object store).
docs/storage.md describes the S3 rules below (retries, no listings cache).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import itertools
import json
import os
import posixpath
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from corpusforge.hashing import canonical_json

# Fixed parquet writer settings: identical tables give byte-identical files.
PARQUET_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": True,
    "row_group_size": 64 * 1024,
    "store_schema": True,
}


# Retries on S3, explicit rather than inherited: botocore's "standard" mode (throttling, 5xx and
# dropped connections; never 4xx), full-jitter backoff; ``storage_options`` may override it.
S3_MAX_ATTEMPTS = 5
S3_RETRIES: dict[str, Any] = {"mode": "standard", "total_max_attempts": S3_MAX_ATTEMPTS}


# No listing outlives the call that made it: s3fs's listings cache is never invalidated by other
# processes' writes, and units write on workers while the flow reads (stale ETags: ``FileExpired``).
S3_NO_LISTINGS_CACHE: dict[str, Any] = {"use_listings_cache": False}


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left, disk quota exceeded
_TEMP_NAMES = itertools.count()  # this process's temporary files, numbered
# and told apart from other machines' on a shared file system, where containers' pids and
# thread idents coincide (a task run twice writes the same file from two workers)
_TEMP_TOKEN = os.urandom(4).hex()


@functools.cache
def _umask() -> int:
    """This process's umask, read once from /proc (elsewhere all bits: a chmod after each create), so
    a created file needs no chmod when the umask leaves 0644 whole (a system call per fetched file)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0o777


def with_s3_defaults(uri: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` for ``uri`` with this module's S3 rules (retries, no listings cache) unless set."""
    options = dict(storage_options or {})
    if fsspec.utils.get_protocol(uri) in ("s3", "s3a"):
        config_kwargs = dict(options.get("config_kwargs") or {})
        config_kwargs.setdefault("retries", dict(S3_RETRIES))
        options["config_kwargs"] = config_kwargs
        for key, value in S3_NO_LISTINGS_CACHE.items():
            options.setdefault(key, value)
    return options


def url_to_fs(uri: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of a local path or URI, with :func:`with_s3_defaults`."""
    return fsspec.core.url_to_fs(uri, **with_s3_defaults(uri, storage_options))


def is_remote(uri: str) -> bool:
    """True for URIs with a scheme other than ``file``."""
    return fsspec.utils.get_protocol(uri) not in ("file", "local")


def overlaps(a: str, b: str) -> bool:
    """True when two locations of the same kind (both local or both remote) are the same, or one
    lies inside the other."""
    if is_remote(a) != is_remote(b):
        return False

    def folder(uri: str) -> str:
        return (uri if is_remote(uri) else posixpath.abspath(uri)).rstrip("/") + "/"

    x, y = folder(a), folder(b)
    return x.startswith(y) or y.startswith(x)


def require_separate(out: str, reads: Iterable[tuple[str, str]], why: str = "nothing read is ever written to"
                     ) -> None:
    """The one "output overlaps input" check of every flow: ValueError when the output root ``out``
    overlaps anything the run reads (``reads``: (what, uri) pairs)."""
    for what, uri in reads:
        if overlaps(out, uri):
            raise ValueError(f"output root {out} overlaps the {what} {uri}: {why}")


class Store:
    """A folder (local path or URI) with atomic writes; paths are relative to its root and use ``/``."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None, fsync: bool = True):
        """``fsync=False`` skips flushing each local file to disk before its rename: for
        bulk writes of throwaway data (the sample corpus), never for a corpus build."""
        self.root = root.rstrip("/") if is_remote(root) else os.path.abspath(root)
        self.storage_options = dict(storage_options or {})
        self.fsync = fsync
        self.fs, _ = url_to_fs(self.root, self.storage_options)
        self.remote = is_remote(self.root)
        # atomic writes fsync each local file before its rename (writers of big files may
        # sync ahead, see corpusforge.writeback)
        self.durable = self.fsync and not self.remote

    @contextlib.contextmanager
    def _naming(self, rel: str) -> Iterator[None]:
        """Access denied names the object: s3fs's own message is only ``Forbidden``."""
        try:
            yield
        except PermissionError as exc:
            raise PermissionError(f"access denied to {self.path(rel)}: {exc}") from exc

    @contextlib.contextmanager
    def _naming_full_disk(self, rels: tuple[str, ...], temps: list[str] | None) -> Iterator[None]:
        """A full disk or quota names where, so the user knows which disk to free: the file being
        written, or for an object store the local temp folder (``temps``: those made so far; None
        while uploading)."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in FULL_DISK_ERRNOS:
                raise
            if self.remote and temps is not None:
                where = tempfile.gettempdir()
            else:
                where = self.path(rels[len(temps)] if temps is not None and len(temps) < len(rels) else rels[0])
            raise OSError(exc.errno, os.strerror(exc.errno), where) from exc

    def __reduce__(self):  # picklable for Dask: rebuild the filesystem on the worker
        return (Store, (self.root, self.storage_options, self.fsync))

    def path(self, rel: str) -> str:
        """Absolute path (or full URI) of ``rel`` under the root."""
        if not rel:
            return self.root
        return (posixpath.join if self.remote else os.path.join)(self.root, *rel.split("/"))

    def _fs_path(self, rel: str) -> str:
        return self.fs._strip_protocol(self.path(rel))

    def sub(self, rel: str) -> Store:
        """A store rooted at a sub-folder."""
        return Store(self.path(rel), self.storage_options)

    # ---- reads -------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        if not self.remote:  # what fsspec's local exists() does, without its path handling (a fetch asks per URL)
            return os.path.exists(self.path(rel))
        with self._naming(rel):
            return self.fs.exists(self._fs_path(rel))

    def open(self, rel: str, mode: str = "rb") -> IO[bytes]:
        if "w" in mode or "a" in mode:
            raise ValueError("use atomic_write() for writes")
        with self._naming(rel):
            return self.fs.open(self._fs_path(rel), mode)

    def read_bytes(self, rel: str) -> bytes:
        with self._naming(rel), self.open(rel) as f:
            return f.read()

    def read_range(self, rel: str, offset: int, size: int) -> bytes:
        """Read ``size`` bytes at ``offset`` (a ranged GET on object stores)."""
        with self.open(rel) as f:
            f.seek(offset)
            data = f.read(size)
        if len(data) != size:
            raise OSError(f"short read of {rel}: wanted {size} bytes at {offset}, got {len(data)}")
        return data

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def read_npy(self, rel: str) -> np.ndarray:
        return np.load(io.BytesIO(self.read_bytes(rel)), allow_pickle=False)

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        with self.open(rel) as f:
            return pq.read_table(f, columns=columns)

    def dataset(self, rel: str, schema: pa.Schema | None = None):
        """A ``pyarrow.dataset`` over the parquet files under ``rel`` (``schema``: no file opened to find it)."""
        import pyarrow.dataset as ds

        return ds.dataset(self._fs_path(rel), schema=schema, format="parquet", filesystem=self.fs)

    def listdir(self, rel: str = "") -> list[str]:
        """Sorted names (not paths) directly under ``rel``; empty if it does not exist."""
        base = self._fs_path(rel)
        if not self.fs.exists(base):
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(base, detail=False)]
        return sorted(n for n in names if n)

    def size(self, rel: str) -> int:
        return int(self.fs.size(self._fs_path(rel)))

    def sha256(self, rel: str) -> str:
        with self.open(rel) as f:
            return hashlib.file_digest(f, "sha256").hexdigest()

    # ---- writes ------------------------------------------------------------
    @contextlib.contextmanager
    def atomic_write(self, rel: str) -> Iterator[IO[bytes]]:
        """Yield a binary file; on clean exit it appears at ``rel`` whole, else not at all."""
        with self.atomic_writes(rel) as (f,):
            yield f

    @contextlib.contextmanager
    def atomic_writes(self, *rels: str) -> Iterator[list[IO[bytes]]]:
        """:meth:`atomic_write` for the files of one unit (an exception inside leaves none of them).

        Local files are fsynced together, from one thread each: a file system commits its journal
        once for fsyncs that wait at the same time (a unit's small files then cost little)."""
        temps: list[str] = []
        try:
            with self._naming_full_disk(rels, temps), contextlib.ExitStack() as stack:
                files = []
                for rel in rels:
                    fd, tmp = self._temp_file(rel)
                    temps.append(tmp)
                    files.append(stack.enter_context(os.fdopen(fd, "wb")))
                yield files
                for f in files:
                    f.flush()
                if self.durable:
                    if len(files) == 1:
                        os.fsync(files[0].fileno())
                    else:
                        with ThreadPoolExecutor(len(files), thread_name_prefix="fsync") as pool:
                            list(pool.map(os.fsync, [f.fileno() for f in files]))
            for rel, tmp in zip(rels, list(temps), strict=True):
                self._publish(tmp, rel)
                if not self.remote:  # renamed: nothing left to remove
                    temps.remove(tmp)
        finally:
            for tmp in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    @contextlib.contextmanager
    def atomic_local_file(self, rel: str) -> Iterator[str]:
        """:meth:`atomic_write` for a library that writes a file by its path (FAISS's memory-mapped
        inverted lists): yield a local path to write (in the temp folder for an upload)."""
        fd, tmp = self._temp_file(rel)
        os.close(fd)
        try:
            with self._naming_full_disk((rel,), [tmp] if self.remote else []):
                yield tmp
                if self.durable:
                    with open(tmp, "rb") as written:
                        os.fsync(written.fileno())
            self._publish(tmp, rel)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _publish(self, tmp: str, rel: str) -> None:
        """Make the whole temporary file ``tmp`` the file ``rel`` (renamed locally, else uploaded)."""
        if self.remote:
            with self._naming(rel), self._naming_full_disk((rel,), None):
                self.fs.put_file(tmp, self._fs_path(rel))
        else:
            os.replace(tmp, self.path(rel))  # made readable (0644) when it was created

    def _temp_name(self, rel: str) -> str:
        """A new local name beside ``rel`` (``.name.*.part``, so a rename onto ``rel`` is atomic),
        unique by process, thread and count (mkstemp's random names, its folder made first and a
        chmod cost 2.4x the CPU of the whole write of a small file: a fetched image)."""
        final = self.path(rel)
        return os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{_TEMP_TOKEN}-{os.getpid()}-"
                                                    f"{threading.get_ident()}-{next(_TEMP_NAMES)}.part")

    def _temp_file(self, rel: str) -> tuple[int, str]:
        """A new temporary file for ``rel``: beside it locally, anywhere local for an upload."""
        if self.remote:
            return tempfile.mkstemp(prefix="corpusforge-", suffix=".part")
        tmp = self._temp_name(rel)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileNotFoundError:  # its folder is new
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            fd = os.open(tmp, flags, 0o644)
        if _umask() & 0o644:  # whatever the umask: published files are readable as mkstemp's were made
            os.fchmod(fd, 0o644)
        return fd, tmp

    def write_bytes(self, rel: str, data: bytes, sha256: str | None = None) -> str:
        """Write atomically; return the SHA-256 of ``data`` (``sha256``: the caller's, returned as it
        is: a fetch hashed the body as it came)."""
        if self.remote:
            with self.atomic_write(rel) as f:
                f.write(data)
        else:
            self._write_local(rel, data)
        return sha256 or hashlib.sha256(data).hexdigest()

    def _write_local(self, rel: str, data: bytes) -> None:
        """:meth:`atomic_write` of bytes in hand, by plain system calls: a fetch writes a small
        file per image, and the file object and context managers were half of its CPU."""
        tmp = self._write_temp(rel, data)
        try:
            os.replace(tmp, self.path(rel))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _write_temp(self, rel: str, data: bytes) -> str:
        """A whole temporary file beside ``rel`` holding ``data`` (synced when durable); its path."""
        with self._naming_full_disk((rel,), None):
            fd, tmp = self._temp_file(rel)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if self.durable:
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                os.unlink(tmp)
                raise
            os.close(fd)
            return tmp

    def write_linked(self, rels: Sequence[str], data: bytes) -> None:
        """``data`` under every name of ``rels``, each appearing whole or not at all: one file written
        and synced, the names hard links to it (a server-side copy on an object store). For many small
        records looked up by name (a fetch unit's URL outcomes): a link is cheaper than a file each."""
        if self.remote:
            self.write_bytes(rels[0], data)
            for rel in rels[1:]:
                with self._naming(rel):
                    self.fs.copy(self._fs_path(rels[0]), self._fs_path(rel))
            return
        tmp = self._write_temp(rels[0], data)
        try:
            with self._naming_full_disk(tuple(rels), None):
                for rel in rels:
                    try:
                        self._link_local(tmp, rel)
                    except OSError as exc:
                        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP):
                            raise
                        self._write_local(rel, data)  # a file system without hard links
        finally:
            os.unlink(tmp)

    def _link_local(self, src: str, rel: str) -> None:
        """The local file ``src`` also at ``rel``, atomically (an existing ``rel`` replaced)."""
        final = self.path(rel)
        try:
            os.link(src, final)
        except FileNotFoundError:  # its folder is new
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.link(src, final)
        except FileExistsError:  # another link renamed over it
            spare = self._temp_name(rel)
            os.link(src, spare)
            os.replace(spare, final)

    def write_json(self, rel: str, obj: Any) -> str:
        return self.write_bytes(rel, canonical_json(obj).encode() + b"\n")

    def write_npy(self, rel: str, array: np.ndarray) -> str:
        """Write ``array`` as a ``.npy`` file (C order, no pickled objects); return its SHA-256."""
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        return self.write_bytes(rel, buf.getvalue())

    def write_parquet(self, rel: str, table: pa.Table, row_groups: Sequence[int] | None = None) -> str:
        """Write a table with fixed writer settings; return the file's SHA-256. ``row_groups``: a
        non-decreasing label per row; each run of equal labels becomes its own row group(s), so a
        reader filtering on the labelling column reads only its rows."""
        return self.write_bytes(rel, parquet_bytes(table, row_groups))

    @contextlib.contextmanager
    def write_row_groups(self, rel: str, schema: pa.Schema) -> Iterator[Callable[[pa.Table], None]]:
        """:meth:`write_parquet` a table at a time, for a file too big to hold, written atomically."""
        with self.atomic_write(rel) as f, row_group_writer(f, schema) as write:
            yield write

    def link(self, src: str, dst: str) -> None:
        """Make ``dst`` hold the bytes of ``src``, moving none through this process: a hard link
        locally (no disk space; a later atomic replace of ``src`` leaves ``dst`` as it was), a
        server-side copy on an object store, an atomic copy on a file system without hard links."""
        if self.remote:
            with self._naming(dst):
                self.fs.copy(self._fs_path(src), self._fs_path(dst))
            return
        final = self.path(dst)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        try:
            os.link(self.path(src), final)
        except FileExistsError:
            raise
        except OSError:  # no hard links on this file system (EPERM, EXDEV, ENOTSUP)
            with self.open(src) as f, self.atomic_write(dst) as out:
                while block := f.read(1 << 20):
                    out.write(block)

    def remove(self, rel: str) -> None:
        if self.exists(rel):
            self.fs.rm(self._fs_path(rel), recursive=True)


def parquet_bytes(table: pa.Table, row_groups: Sequence[int] | None = None) -> bytes:
    """A parquet file of ``table`` with the fixed writer settings (identical tables, identical
    bytes); ``row_groups``: see :meth:`Store.write_parquet`."""
    with tempfile.SpooledTemporaryFile(max_size=64 << 20) as buf:
        if row_groups is None:
            pq.write_table(table, buf, **PARQUET_WRITE_OPTIONS)
        else:
            labels = np.asarray(row_groups)
            if len(labels) != table.num_rows or (np.diff(labels) < 0).any():
                raise ValueError("row_groups must give a non-decreasing label per row")
            cuts = [0, *(np.flatnonzero(np.diff(labels)) + 1).tolist(), table.num_rows]
            with row_group_writer(buf, table.schema) as write:
                for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
                    if hi > lo:
                        write(table.slice(lo, hi - lo))
        buf.seek(0)
        return buf.read()


@contextlib.contextmanager
def row_group_writer(f: IO[bytes], schema: pa.Schema) -> Iterator[Callable[[pa.Table], None]]:
    """A parquet file written to ``f`` a table at a time, each its own row group(s), with the
    fixed writer settings: the same bytes as :func:`parquet_bytes` with a label per table."""
    options = dict(PARQUET_WRITE_OPTIONS)
    size = options.pop("row_group_size")
    with pq.ParquetWriter(f, schema, **options) as writer:
        yield lambda table: writer.write_table(table, row_group_size=size)


def file_stamp(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any] | None = None,
               content: bool = False) -> str:
    """What changes whenever a file's bytes are replaced, read from its metadata alone (as make
    and rsync notice changes), so a rerun re-reads exactly the files that changed.

    Local files: size, mtime, ctime (ns) and inode (mtime can be set back, ctime and the inode of
    a renamed-over file cannot); object stores: size and ETag; others: size and modification time.
    ``info``: the entry from a listing, if any. ``content``: add the SHA-256 of the bytes
    (``input.verify: content``), for filesystems whose metadata cannot be trusted."""
    if isinstance(fs, LocalFileSystem):
        st = os.stat(path)
        stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    else:
        info = info if info is not None else fs.info(path)
        version = info.get("ETag") or info.get("mtime") or info.get("LastModified") or info.get("created")
        stamp = f"{info.get('size')}:{version}"
    if content:
        with fs.open(path, "rb") as f:
            stamp += f":sha256={hashlib.file_digest(f, 'sha256').hexdigest()}"
    return stamp


def uri_stamp(uri: str, storage_options: dict[str, Any] | None = None) -> str:
    """:func:`file_stamp` of a local path or URI."""
    return file_stamp(*url_to_fs(uri, storage_options))


def open_uri(uri: str, storage_options: dict[str, Any] | None = None) -> IO[bytes]:
    """Open any local path or URI for binary reading."""
    return fsspec.open(uri, "rb", **with_s3_defaults(uri, storage_options)).open()
