"""One HTTP request to a checked address: the client never resolves a name itself (the URL it
is given holds the address :mod:`tasks.ingest.fetch.addresses` checked; ``Host`` and TLS SNI
carry the name, and the certificate is verified against the name). Redirects are not followed
here (the caller checks every hop); the body is read only when the caller's header check lets
it, is capped while it streams, and the whole request has a deadline."""

from __future__ import annotations

import functools
import hashlib
import socket
import ssl
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpcore
import httpx
from httpcore._backends.sync import SyncStream  # not exported; httpcore is pinned (constraints.txt)

from tasks.ingest.fetch.addresses import Target

# Magic bytes of the image formats a fetch keeps (the content type is never trusted).
MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
         (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))


def image_magic(head: bytes) -> str | None:
    """The image format ``head`` starts with, from its magic bytes, or None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[4:8] == b"ftyp" and head[8:12] in (b"avif", b"avis", b"heic", b"heix", b"mif1"):
        return "HEIF"
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


# What a request can raise from the connection or the protocol (a timeout, a refused or reset
# connection, a malformed answer, a URL it cannot send): a failed attempt.
REQUEST_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                  httpcore.UnsupportedProtocol)
_PATH_SAFE = string.punctuation  # a path is sent as it is written; only what is not ASCII is percent-encoded


class TooLarge(Exception):
    """The body is over the cap (declared or counted)."""


class Deadline(Exception):
    """The request ran past its total deadline."""


@dataclass
class Response:
    """What one request gave: its status and headers, and the body when it was read."""

    status: int
    headers: httpx.Headers
    body: bytes | None = None
    sha256: str | None = None
    received: int = 0
    extra: dict[str, str] = field(default_factory=dict)


@functools.cache
def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """Certificates verified against the system's authorities, or ``ca_bundle``'s alone (made once
    per process: loading the authorities cost 20 ms of CPU per unit)."""
    return ssl.create_default_context(cafile=ca_bundle) if ca_bundle else httpx.create_ssl_context()


_DEADLINE = threading.local()  # .at: when the request this thread makes must be answered (monotonic)


class _Stream(SyncStream):
    """httpcore's socket stream, with two changes. Each read and write waits at most until the
    request's deadline (:func:`request`): headers that drip a byte at a time, each inside the
    read timeout, held a request for as long as the host liked (the deadline was checked only
    while the body streamed). And the socket's timeout is set only when it changes: httpcore set
    it before every read and write, each time two ``fcntl`` calls that let go of the GIL (three
    hand-offs among a unit's threads per request)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self._timeout = sock.gettimeout()

    def _settimeout(self, timeout: float | None) -> None:
        at = getattr(_DEADLINE, "at", None)
        if at is not None:
            left = at - time.monotonic()
            if left <= 0:
                raise socket.timeout("past the request's deadline")
            timeout = left if timeout is None else min(timeout, left)
        if timeout != self._timeout:
            self._sock.settimeout(timeout)
            self._timeout = timeout

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            self._settimeout(timeout)
            return self._sock.recv(max_bytes)
        except socket.timeout as exc:
            raise httpcore.ReadTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.ReadError(exc) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            while buffer:
                self._settimeout(timeout)
                buffer = buffer[self._sock.send(buffer):]
        except socket.timeout as exc:
            raise httpcore.WriteTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.WriteError(exc) from exc

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        stream = super().start_tls(*args, **kwargs)
        return _Stream(stream.get_extra_info("socket")) if type(stream) is SyncStream else stream


class _Backend(httpcore.SyncBackend):
    """httpcore's blocking backend, its connections as :class:`_Stream`."""

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        stream = super().connect_tcp(*args, **kwargs)
        return _Stream(stream.get_extra_info("socket"))


def new_client(tls: ssl.SSLContext) -> httpcore.ConnectionPool:
    """A connection pool that verifies TLS, uses no proxy, follows no redirect and resolves nothing
    but what it is given. Requests go to httpcore's pool itself: ``httpx.Client``'s layers (URL
    merging, cookies, auth, redirects, event hooks) did nothing here and cost about a fifth of
    the CPU of a fetched image, and ``httpx``'s transport (its URL parsing, request and
    response models, exception mapping, content decoding) about a tenth (cProfile)."""
    return httpcore.ConnectionPool(ssl_context=tls, max_connections=None, max_keepalive_connections=64,
                                   keepalive_expiry=5.0, network_backend=_Backend())


def request(client: httpcore.ConnectionPool, target: Target, address: str, user_agent: str, deadline_s: float,
            connect_timeout_s: float, max_bytes: int, read_body: Callable[[int, httpx.Headers], bool]) -> Response:
    """GET ``target`` from ``address``. ``read_body(status, headers)`` decides whether the body is
    read (opt-out headers are checked there, before a byte of it); a body over ``max_bytes`` (by
    Content-Length, or counted) raises :class:`TooLarge`, a request past ``deadline_s``
    :class:`Deadline`; connection and protocol errors raise one of :data:`REQUEST_ERRORS`. The
    body is asked for as it is stored (``Accept-Encoding: identity``) and kept as received."""
    start = time.monotonic()

    def left() -> float:
        remaining = deadline_s - (time.monotonic() - start)
        if remaining <= 0:
            raise Deadline(f"no complete answer within {deadline_s:g} s")
        return remaining

    timeout = min(left(), connect_timeout_s)
    path = target.path if target.path.isascii() else quote(target.path, safe=_PATH_SAFE)
    host = target.host_header
    req = httpcore.Request(
        "GET", httpcore.URL(scheme=target.scheme, host=address, port=target.port, target=path),
        headers=[(b"Host", host.encode("ascii" if host.isascii() else "idna")), (b"User-Agent", user_agent.encode()),
                 (b"Accept", b"image/*"), (b"Accept-Encoding", b"identity")],
        extensions={"sni_hostname": target.host,
                    "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}})
    _DEADLINE.at = start + deadline_s
    try:
        return _answer(client.handle_request(req), left, max_bytes, read_body)
    except httpcore.TimeoutException:
        left()  # past the deadline: say so
        raise
    finally:
        _DEADLINE.at = None


def _answer(resp: httpcore.Response, left: Callable[[], float], max_bytes: int,
            read_body: Callable[[int, httpx.Headers], bool]) -> Response:
    """What :func:`request` returns: the status, the headers and (when ``read_body`` lets it) the body."""
    try:
        out = Response(resp.status, httpx.Headers(resp.headers))
        if not read_body(out.status, out.headers):
            return out
        declared = out.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise TooLarge(f"Content-Length {declared} > {max_bytes} bytes")
        hasher, chunks = hashlib.sha256(), []
        for chunk in resp.iter_stream():
            left()
            out.received += len(chunk)
            if out.received > max_bytes:
                raise TooLarge(f"body over {max_bytes} bytes")
            hasher.update(chunk)
            chunks.append(chunk)
        left()
        out.body, out.sha256 = b"".join(chunks), hasher.hexdigest()
        return out
    finally:
        resp.close()
