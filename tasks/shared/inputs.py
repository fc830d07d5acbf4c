"""What a flow may read of a user's input, decided in one place for every flow.

A build's source, contamination's evaluation sets, the generated images that
``evaluate`` and ``qualify-prompts`` embed: each names files by paths in its rows, by
the entries of a folder or by the members of a tar, and each of those can be hostile (a
path to ``/etc/hostname``, a ``local://`` or ``http://`` URL, a symlink out of the folder,
a FIFO that blocks the reader, a tar member named ``../x``, a decompression bomb).
Every flow goes through these functions, so every flow refuses exactly what the build
refuses, with the same per-record reason:

:func:`resolve_input` (a path from a row or a listing), :func:`read_input` (its bytes, checked
again at read time), :func:`list_folder`, :func:`tar_member_reason`, :func:`image_refusal` (before
anything decodes) and :func:`read_image` (all of that for one image).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterator, Sequence
from typing import IO, Any

import fsspec

from corpusforge.records import Status
from corpusforge.storage import is_remote, open_uri, url_to_fs
from tasks.shared.validate import ValidationConfig, validate_image

SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")  # file:/x, local:/x, c:/x
UNSAFE_PATH = "unsafe_path"
Entry = tuple[str, bool]  # a folder entry: (path, regular file)


class InputRefused(OSError):
    """A location that may not be read; ``reason`` is the record's reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _under(location: str, root: str) -> bool:
    if root.endswith("://"):
        return location.startswith(root)
    root = root.rstrip("/")
    return location == root or location.startswith(root + "/")


def allowed_roots(base: str, extra: Sequence[str] = ()) -> list[str]:
    """Where input paths may point: the source's folder, for a source on an object store
    that store's whole protocol (``s3://``), and any roots the config allow-lists."""
    roots = [base]
    if is_remote(base):
        roots.append(f"{fsspec.utils.get_protocol(base)}://")
    return roots + [r for r in extra if r]


def locate(base: str, path: str, roots: Sequence[str] = ()) -> tuple[str | None, str]:
    """(location, "") for an input path that may be read, else (None, why it is refused).

    Decided from the string alone, before any byte is read: empty paths, control
    characters, backslashes and chained URLs (``simplecache::…``) are refused; a relative
    path must stay inside ``base`` (no ``..`` escape); an absolute path or a URI of any
    protocol (``file://``, ``local://``, ``http(s)://``, ``memory://``, ``zip://``, ``s3://``…)
    must lie under one of ``roots`` (default: :func:`allowed_roots` of ``base``).
    Local files are checked once more at read time (:func:`local_file_refusal`).
    """
    roots = list(roots) or allowed_roots(base)
    if not path:
        return None, "empty path"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path) or "\\" in path:
        return None, "control character or backslash in path"
    if "::" in path:
        return None, "chained URL not allowed"
    if "://" in path or path.startswith("/"):
        protocol, rest = fsspec.core.split_protocol(path)
        if any(p in ("..", ".") for p in rest.split("/")):
            return None, "'..' or '.' component in path"
        normal = path if protocol else posixpath.normpath(path)
        if not any(_under(normal, r if "://" in r else os.path.abspath(r)) for r in roots):
            kind = f"{protocol}:// URL" if protocol else "absolute path"
            return None, f"{kind} outside the allowed roots (input.allow_roots)"
        return normal, ""
    if SCHEME_LIKE.match(path):
        return None, "URL-like path without '//' (write ./name for a file whose name has a colon)"
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../") or normal == ".":
        return None, "path escapes the source folder"
    return posixpath.join(base, normal), ""


def local_file_refusal(location: str, roots: Sequence[str]) -> str | None:
    """Why a local file may not be read (None: it may): its real path, symlinks resolved,
    must lie inside a local root and it must be a regular file (a FIFO or device is never
    opened). Only metadata is looked at; remote locations are not checked here."""
    if is_remote(location):
        return None
    real = os.path.realpath(location)
    local_roots = [os.path.realpath(r) for r in roots if not is_remote(r)]
    if not any(_under(real, r) for r in local_roots):
        return "symlink to a location outside the source"
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return None  # reported as missing_file by the reader
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
    if not stat.S_ISREG(mode):
        return "not a regular file (folder, FIFO, device or socket)"
    return None


def unsafe_path_reason(path: str, why: str) -> str:
    """A refused path's record reason, the same in every flow."""
    return f"{UNSAFE_PATH}: {path!r}: {why}"


def resolve_input(base: str, path: str, roots: Sequence[str]) -> tuple[str | None, str]:
    """(location, "") for a path that may be read, else (None, its ``unsafe_path`` reason):
    :func:`locate` on the string, then :func:`local_file_refusal` on a local file."""
    location, why = locate(base, path, roots)
    if location is not None:
        why = local_file_refusal(location, roots) or ""
    if location is None or why:
        return None, unsafe_path_reason(path, why)
    return location, ""


def _open_local(location: str) -> IO[bytes]:
    """A local file opened without ever blocking: non-blocking, not following a final
    symlink, and re-checked to be a regular file once open."""
    fd = os.open(location, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_NOFOLLOW", 0))
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise OSError(f"{location}: not a regular file")
    return f


def read_local(location: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of a local file, opened as :func:`_open_local` opens it."""
    with _open_local(location) as f:
        return f.read(min(limit, os.fstat(f.fileno()).st_size + 1))


def open_input(location: str, roots: Sequence[str], storage_options: dict[str, Any],
               path: str | None = None) -> IO[bytes]:
    """A location :func:`resolve_input` gave, opened for reading and checked once more now
    (the folder may have changed since it was resolved). Raises :class:`InputRefused`
    (its reason as :func:`resolve_input`'s, naming ``path``), and OSError as opening does."""
    if is_remote(location):
        return open_uri(location, storage_options)
    if why := local_file_refusal(location, roots):
        raise InputRefused(unsafe_path_reason(path or location, why))
    return _open_local(os.path.realpath(location))


def read_input(location: str, roots: Sequence[str], storage_options: dict[str, Any],
               limit: int = ValidationConfig().max_bytes + 1, path: str | None = None) -> bytes:
    """At most ``limit`` bytes of a location, opened by :func:`open_input`."""
    with open_input(location, roots, storage_options, path) as f:
        if not is_remote(location):
            limit = min(limit, os.fstat(f.fileno()).st_size + 1)  # read(n) allocates n bytes up front
        return f.read(limit)


def scan_folder(folder: str, folders: list[str]) -> Iterator[Entry]:
    """One folder's entries as (path, regular), its sub-folders (symlinks not followed)
    appended to ``folders``: a symlink to a folder and any special file (FIFO, device,
    socket) is an entry, so the reader reports it as an error. ``regular``: a regular file,
    not a link (the entry's type from the directory listing, no stat)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir and not entry.is_symlink():
                folders.append(entry.path)
            else:
                yield entry.path, entry.is_file(follow_symlinks=False)


def walk_local(folder: str) -> Iterator[Entry]:
    """Every entry under a local folder (see :func:`scan_folder`), as the walk meets it."""
    pending = [folder]
    while pending:
        yield from scan_folder(pending.pop(), pending)


def list_folder(uri: str, storage_options: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """Every entry under a folder (local path or URI) as (path relative to it, the object
    store's listing entry or None locally), sorted. Locally, symlinks are listed, never
    followed (a linked folder is one entry), and special files are listed too:
    :func:`resolve_input` then refuses each with its reason. For a folder of evaluation or
    generated images; a build's source is listed out of core (:mod:`tasks.ingest.sources`)."""
    if not is_remote(uri):
        root = uri.rstrip("/") or "/"
        return sorted((posixpath.relpath(p, root), None) for p, _ in walk_local(root))
    fs, root = url_to_fs(uri, storage_options)
    root = root.rstrip("/")
    return [(p[len(root) + 1:], info) for p, info in sorted(fs.find(root, detail=True).items())]


def tar_member_reason(why: str) -> str:
    """The record reason for an unusable tar member (see ``iter_tar_samples``)."""
    if why.startswith("unsafe member name"):
        return f"unsafe_name: {why}"
    if why.startswith("not a regular file"):
        return f"unsafe_member: {why}"
    return f"read_error: {why}"


_BYTES_ONLY = ValidationConfig(min_side=1, full_decode=False)


def image_refusal(data: bytes) -> str | None:
    """The validator's error for bytes that are no usable image (``empty_file``,
    ``oversized_file``, ``not_an_image``, ``unsupported_format``, ``decompression_bomb``),
    from the header alone; None for an image. The build's filters (size, aspect) are not
    applied: they decide what enters a corpus, not what may be looked at."""
    verdict = validate_image(data, _BYTES_ONLY)
    return verdict.reason if verdict.status is Status.ERROR else None


def read_image(location: str, roots: Sequence[str], storage_options: dict[str, Any], path: str
               ) -> tuple[bytes | None, str | None]:
    """(image bytes, None), or (None, the record's error) with the build's reasons: refused
    (``unsafe_path``), ``missing_file``, ``read_error`` or :func:`image_refusal`'s."""
    try:
        data = read_input(location, roots, storage_options, path=path)
    except InputRefused as exc:
        return None, exc.reason
    except FileNotFoundError:
        return None, f"missing_file: {path}"
    except (OSError, ValueError) as exc:
        return None, f"read_error: {type(exc).__name__}: {exc}"
    refusal = image_refusal(data)
    return (None, refusal) if refusal else (data, None)

