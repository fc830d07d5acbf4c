"""A small OpenAI-compatible chat endpoint on 127.0.0.1 that misbehaves on request.

Each POST to ``/v1/chat/completions`` takes the next behaviour from ``script`` (then
``default``): ``true`` / ``false`` (a well-formed verdict), ``fenced`` (the verdict in a
```json block), ``slow`` (sleeps ``slow_s`` before answering true), ``500`` / ``429`` /
``400`` (that HTTP status), ``garbage`` (a body that is not JSON), ``nochoices`` (JSON
without choices), ``prose`` (content without the JSON verdict), or a callable of the
request body returning one of those. Requests (body and headers) are recorded.

For the captioning stage a step may also be a tuple: ``("text", content)`` answers with
that content, ``("text", content, finish_reason)`` with that finish reason too,
``("429", seconds)`` is a 429 with ``Retry-After: seconds``, ``("slow", seconds,
content)`` answers after that long; ``"503"`` is that status and ``"drop"`` closes the
connection without a response. ``latency_s`` delays every answer (benchmarks). The stub
counts requests per image (:meth:`ChatStub.image_counts`, by the SHA-256 of the data
URL's bytes) and measures the most requests in flight at once (``max_in_flight``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.loopback import serving


def _completion(content: str, finish_reason: str = "stop") -> bytes:
    return json.dumps({"id": "stub", "object": "chat.completion",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": finish_reason}]}).encode()


def image_digest(body: dict) -> str | None:
    """SHA-256 of the image bytes in a chat request's data URL (None: no image)."""
    for message in body.get("messages", []):
        for part in message["content"] if isinstance(message.get("content"), list) else []:
            if part.get("type") == "image_url":
                return hashlib.sha256(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])).hexdigest()
    return None


def system_prompt(body: dict) -> str:
    return next((m["content"] for m in body.get("messages", []) if m.get("role") == "system"), "")


class _Handler(BaseHTTPRequestHandler):
    server: Any
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers; every answer has a Content-Length

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        stub = self.server.stub
        with stub.lock:
            stub.in_flight += 1
            stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
        try:
            self._answer(stub)
        finally:
            with stub.lock:
                stub.in_flight -= 1

    def _answer(self, stub: ChatStub) -> None:
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client went away mid-request (killed): nothing was received
            self.close_connection = True
            return
        body = json.loads(raw or b"{}")
        with stub.lock:
            stub.requests.append({"path": self.path, "body": body, "headers": dict(self.headers),
                                  "at": time.monotonic()})
            step = stub.script.pop(0) if stub.script else stub.default
        if callable(step):
            step = step(body)
        if stub.latency_s:
            time.sleep(stub.latency_s)
        if isinstance(step, tuple):
            self._tuple_step(step)
            return
        if step == "drop":
            self.close_connection = True
            return
        if step == "503":
            self._send(503, b'{"error": "overloaded"}')
            return
        if step == "slow":
            time.sleep(stub.slow_s)
            step = "true"
        if step in ("500", "429", "400"):
            self._send(int(step), b'{"error": "stub"}')
        elif step == "garbage":
            self._send(200, b"<html>not json")
        elif step == "nochoices":
            self._send(200, b'{"object": "chat.completion"}')
        elif step == "prose":
            self._send(200, _completion("I think it might be inferable, hard to say."))
        elif step == "fenced":
            self._send(200, _completion('```json\n{"inferable": true, "reason": "caption names it"}\n```'))
        else:
            self._send(200, _completion(json.dumps({"inferable": step == "true", "reason": f"stub says {step}"})))

    def _tuple_step(self, step: tuple) -> None:
        kind = step[0]
        if kind == "text":
            self._send(200, _completion(step[1], *step[2:]))
        elif kind == "429":
            self._send(429, b'{"error": "rate limited"}', {"Retry-After": str(step[1])})
        elif kind == "slow":
            time.sleep(step[1])
            self._send(200, _completion(step[2]))
        else:
            raise ValueError(f"unknown stub step {step!r}")

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the listen backlog: 5 by default, which refuses bursts of connections


class ChatStub:
    def __init__(self, script: list[Any] | None = None, default: Any = "true",
                 slow_s: float = 2.0, latency_s: float = 0.0):
        self.script, self.default, self.slow_s, self.latency_s = list(script or []), default, slow_s, latency_s
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.base_url = ""
        self.in_flight = self.max_in_flight = 0

    def image_counts(self) -> Counter[tuple[str | None, str]]:
        """Requests per (image digest, system prompt)."""
        with self.lock:
            return Counter((image_digest(r["body"]), system_prompt(r["body"])) for r in self.requests)


@contextmanager
def chat_stub(**kwargs: Any) -> Iterator[ChatStub]:
    stub = ChatStub(**kwargs)
    server = _Server(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.stub = stub
    stub.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    with serving(server):
        yield stub
