"""A loopback HTTP proxy in front of a real S3 server that fails chosen requests on purpose.

It forwards every request unchanged (the ``Host`` header too, so SigV4 signatures still
verify) and logs each one with its arrival time. ``fail(path, [...])`` makes the next
requests whose path ends with ``path`` get, in order, ``503`` (S3 ``SlowDown``), ``500``
(``InternalError``) or ``drop`` (the connection closed with no answer); later ones pass.
Real transient faults, caused on the wire, so the client's own retry code is what runs."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.loopback import serving

_ERRORS = {
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = urlsplit(upstream).netloc
        self.lock = threading.Lock()
        self.log: list[tuple[float, str, str, int | str]] = []  # (time, method, path, outcome)
        self.faults: dict[str, list[str]] = {}

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fail(self, path_suffix: str, faults: list[str]) -> None:
        with self.lock:
            self.faults[path_suffix] = list(faults)

    def seen(self, path_suffix: str) -> list[tuple[float, str, int | str]]:
        """(time, method, outcome) of every request whose path ends with ``path_suffix``."""
        with self.lock:
            return [(t, m, o) for t, m, p, o in self.log if p.endswith(path_suffix)]

    def _next_fault(self, path: str) -> str | None:
        with self.lock:
            for suffix, queue in self.faults.items():
                if path.endswith(suffix) and queue:
                    return queue.pop(0)
        return None

    def _record(self, method: str, path: str, outcome: int | str) -> None:
        with self.lock:
            self.log.append((time.monotonic(), method, path, outcome))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultProxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def _handle(self) -> None:
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = self.server._next_fault(path)
        if fault == "drop":
            self.server._record(self.command, path, "drop")
            self.close_connection = True
            self.connection.close()
            return
        if fault in _ERRORS:
            status, code, message = _ERRORS[fault]
            payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                       f"<Message>{message}</Message><Resource>{path}</Resource></Error>").encode()
            self.server._record(self.command, path, status)
            self._answer(status, [("Content-Type", "application/xml")], payload)
            return
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=60)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)
            upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            response = upstream.getresponse()
            payload = response.read()
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command == "HEAD":  # no body; keep the object's size
                headers.append(("Content-Length", response.getheader("Content-Length", "0")))
        finally:
            upstream.close()
        self.server._record(self.command, path, response.status)
        self._answer(response.status, headers, payload, head=self.command == "HEAD")

    def _answer(self, status: int, headers: list[tuple[str, str]], payload: bytes, head: bool = False) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if not head:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """Run a :class:`FaultProxy` to ``upstream`` (an ``http://host:port`` URL) in a thread."""
    with serving(FaultProxy(upstream)) as proxy:
        yield proxy
