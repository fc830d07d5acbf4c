"""A small OpenAI-compatible chat endpoint on 127.0.0.1 that misbehaves on request.

Each POST to ``/v1/chat/completions`` takes the next behaviour from ``script`` (then
``default``): ``true`` / ``false`` (a well-formed verdict), ``fenced`` (the verdict in a
```json block), ``slow`` (sleeps ``slow_s`` before answering true), ``500`` / ``429`` /
``400`` (that HTTP status), ``garbage`` (a body that is not JSON), ``nochoices`` (JSON
without choices), ``prose`` (content without the JSON verdict), or a callable of the
request body returning one of those. Requests (body and headers) are recorded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _completion(content: str) -> bytes:
    return json.dumps({"id": "stub", "object": "chat.completion",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}]}).encode()


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        stub = self.server.stub
        with stub.lock:
            stub.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
            step = stub.script.pop(0) if stub.script else stub.default
        if callable(step):
            step = step(body)
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

    def _send(self, status: int, payload: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass


class ChatStub:
    def __init__(self, script: list[str | Callable[[dict], str]] | None = None, default: str | Callable = "true",
                 slow_s: float = 2.0):
        self.script, self.default, self.slow_s = list(script or []), default, slow_s
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.base_url = ""


@contextmanager
def chat_stub(**kwargs: Any) -> Iterator[ChatStub]:
    stub = ChatStub(**kwargs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.stub = stub
    stub.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
