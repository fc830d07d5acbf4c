"""A loopback HTTP server process standing in for many image hosts, with scripted faults: the
URL-list sample (``corpusforge sample --urls``), the fetch tests and bench/fetch.py use it.

Every address in 127.0.0.0/8 is its own host: one server thread per address, each with its own
robots.txt and tdmrep.json. A control server on 127.0.0.1 reports per host the requests seen
(path, start time) and the most requests ever in flight at once (from its arrival until it is answered
or its client hangs up). Paths script the faults::

    /img/PATH                 the image file PATH          /status/CODE/NAME   answer CODE
    /429s/SECS/NAME           429 Retry-After: SECS once     /429date/SECS/NAME  the same as an HTTP date
    /503once/NAME             503 once, then the image       /503always/NAME     always 503
    /xrobots/VALUE/NAME       X-Robots-Tag: VALUE (quoted)   /tdm/NAME           tdm-reservation: 1
    /redirect/N/NAME          N redirects, then the image    /loop/NAME          redirects to itself
    /to/LOCATION              a redirect to LOCATION (quoted, e.g. http%3A//169.254.169.254/ or file%3A/etc/passwd)
    /huge/NAME                Content-Length: 10^12          /endless/NAME       an endless chunked body
    /drip/NAME                the image, a byte every 0.2 s  /html/NAME          HTML served as image/jpeg
    /dripheaders/NAME         the status line and headers, a byte every 0.2 s, then the image

Run: ``python -m sample_corpus.http_hosts --config hosts.json --ready ready.json``; the config
is ``{"images": DIR, "hosts": {"127.0.0.2": {"robots": "allow"|"disallow:/PATH"|"scoped:/PATH"|
"404"|"503"|"timeout", "tdmrep": [...]}}, "latency_ms": 0, "port": 0}`` (port 0: any free port,
one per host); the ready file, written once every server listens, maps each host to its port and
names the control URL.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import threading
import time
from collections import defaultdict
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

ROBOTS_TIMEOUT_S = 30


def hung_up(conn: socket.socket, seconds: float) -> bool:
    """Wait up to ``seconds``; True as soon as the client has closed the connection (so an
    answer it gave up on stops counting as in flight)."""
    try:
        readable, _, _ = select.select([conn], [], [], seconds)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or closed here already
        return True


class Ledger:
    """What every host saw: requests (path, start) and the most in flight at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[str, dict[int, socket.socket]] = defaultdict(dict)  # connections mid-request
        self.peak: dict[str, int] = defaultdict(int)
        self.requests: dict[str, list[tuple[str, float]]] = defaultdict(list)
        self.ports: dict[str, set[int]] = defaultdict(set)  # client ports (connections) of each host's image
        # requests (not robots.txt's, tdmrep.json's: an answer whose body a client does not read closes its connection)
        self.once: set[tuple[str, str]] = set()

    def enter(self, host: str, path: str, port: int, conn: socket.socket) -> None:
        """A request arrives: it counts as in flight, beside those whose client has not hung up
        (a client that gave up on an answer, at its deadline, has closed the connection although
        the handler may not have noticed yet: it is not a request the client still has open)."""
        with self.lock:
            if not path.startswith(("/robots.txt", "/.well-known/")):
                self.ports[host].add(port)
            active = self.active[host]
            for key in [k for k, c in active.items() if hung_up(c, 0)]:
                del active[key]
            active[id(conn)] = conn
            self.peak[host] = max(self.peak[host], len(active))
            self.requests[host].append((path, time.time()))

    def leave(self, host: str, conn: socket.socket) -> None:
        with self.lock:
            self.active[host].pop(id(conn), None)

    def first(self, host: str, path: str) -> bool:
        """True the first time ``path`` is asked of ``host``."""
        with self.lock:
            if (host, path) in self.once:
                return False
            self.once.add((host, path))
            return True

    def report(self) -> dict[str, Any]:
        with self.lock:
            return {"peak": dict(self.peak), "requests": {h: list(r) for h, r in self.requests.items()},
                    "ports": {h: sorted(p) for h, p in self.ports.items()}}

    def reset(self) -> None:
        with self.lock:
            self.peak.clear()
            self.requests.clear()
            self.ports.clear()
            self.once.clear()


def _handler(host: str, spec: dict[str, Any], images: Path, ledger: Ledger, latency: float) -> type:
    class Host(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # TCP_NODELAY, as nginx, Apache and CDNs set it: with Nagle on, the body (written after the
        # headers) waited for the client's delayed ACK, ~44 ms per request on a kept-alive connection
        # (0.4 ms with it off), a stall no real host puts on a client that reuses connections.
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:
            pass

        def send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None,
                 content_type: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.done()  # before the client can have a byte of the answer (it may hang up at once)
            self.end_headers()
            self.wfile.write(body)

        def image(self, name: str, headers: dict[str, str] | None = None) -> None:
            file = (images / unquote(name)).resolve()
            if not (file.is_relative_to(images.resolve()) and file.is_file()):
                return self.send(404, b"no such image")
            kind = "image/png" if file.suffix == ".png" else "image/jpeg"
            self.send(200, file.read_bytes(), headers, kind)

        def done(self) -> None:
            """The request stops counting as in flight (once)."""
            if not self.left:
                self.left = True
                ledger.leave(host, self.connection)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ledger.enter(host, self.path, self.client_address[1], self.connection)
            self.left = False
            try:
                if latency:
                    time.sleep(latency)
                self.route(self.path)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                self.done()

        def route(self, path: str) -> None:
            parts = path.lstrip("/").split("/")
            head, rest = parts[0], parts[1:]
            if path == "/robots.txt":
                return self.robots(spec.get("robots", "404"))
            if path == "/.well-known/tdmrep.json":
                if "tdmrep" in spec:
                    return self.send(200, json.dumps(spec["tdmrep"]).encode(), content_type="application/json")
                return self.send(404)
            if head == "img":
                return self.image("/".join(rest))
            if head in ("429s", "429date", "retry-far"):
                if ledger.first(host, path):
                    secs = int(rest[0]) if head != "retry-far" else 100_000
                    after = formatdate(time.time() + secs, usegmt=True) if head == "429date" else str(secs)
                    return self.send(429, b"slow down", {"Retry-After": after})
                return self.image(rest[-1])
            if head == "503once":
                return self.send(503) if ledger.first(host, path) else self.image(rest[-1])
            if head == "503always":
                return self.send(503)
            if head == "status":
                return self.send(int(rest[0]), b"<html>gone</html>", content_type="text/html")
            if head == "xrobots":
                return self.image(rest[-1], {"X-Robots-Tag": unquote(rest[0])})
            if head == "tdm":
                return self.image(rest[-1], {"tdm-reservation": "1"})
            if head == "redirect":
                n = int(rest[0])
                to = f"/redirect/{n - 1}/{rest[-1]}" if n > 1 else f"/img/{rest[-1]}"
                return self.send(302, headers={"Location": to})
            if head == "loop":
                return self.send(302, headers={"Location": path})
            if head == "to":
                return self.send(302, headers={"Location": unquote(path[len("/to/"):])})
            if head == "huge":
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(10 ** 12))
                self.done()  # the client hangs up on the headers
                self.end_headers()
                return self.wfile.write(b"\xff\xd8\xff" + b"\0" * 1024)
            if head == "endless":
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"\xff" * 65536
                while True:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            if head == "dripheaders":
                data = (images / Path(rest[-1]).name).read_bytes()
                head_bytes = (f"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: {len(data)}\r\n"
                              f"X-Padding: {'x' * 100}\r\n\r\n").encode()
                self.close_connection = True
                for i in range(len(head_bytes)):
                    self.wfile.write(head_bytes[i:i + 1])
                    self.wfile.flush()
                    if hung_up(self.connection, 0.2):
                        return
                self.wfile.write(data)
                return
            if head == "drip":
                data = (images / Path(rest[-1]).name).read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    if hung_up(self.connection, 0.2):
                        return None
                return None
            if head == "html":
                return self.send(200, b"<!doctype html><html><body>not an image</body></html>",
                                 content_type="image/jpeg")
            return self.send(404)

        def robots(self, mode: str) -> None:
            if mode == "allow":
                return self.send(200, b"User-agent: *\nAllow: /\n")
            if mode.startswith("disallow:"):
                return self.send(200, f"User-agent: *\nDisallow: {mode.split(':', 1)[1]}\n".encode())
            if mode.startswith("scoped:"):
                return self.send(200, f"User-agent: corpusforge\nDisallow: {mode.split(':', 1)[1]}\n\n"
                                      "User-agent: *\nAllow: /\n".encode())
            if mode == "timeout":
                if hung_up(self.connection, ROBOTS_TIMEOUT_S):
                    return None
                return self.send(200, b"User-agent: *\nAllow: /\n")
            return self.send(int(mode))

    return Host


class QuietServer(ThreadingHTTPServer):
    """A host whose clients hang up mid-answer (caps, deadlines) without a traceback each time."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


def _control(ledger: Ledger) -> type:
    class Control(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/reset":
                ledger.reset()
            body = json.dumps(ledger.report()).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Control


def serve(config: dict[str, Any], ready: Path) -> None:
    """Start every host and the control server; write ``ready``; serve until killed."""
    ledger = Ledger()
    images, latency = Path(config["images"]), config.get("latency_ms", 0) / 1000
    servers = {"control": QuietServer(("127.0.0.1", 0), _control(ledger))}
    for host, spec in config["hosts"].items():
        servers[host] = QuietServer((host, config.get("port", 0)), _handler(host, spec, images, ledger, latency))
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ports = {h: s.server_address[1] for h, s in servers.items() if h != "control"}
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"control": f"http://127.0.0.1:{servers['control'].server_address[1]}",
                               "hosts": ports}))
    tmp.replace(ready)
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="JSON: images folder, hosts and their robots/tdmrep")
    parser.add_argument("--ready", required=True, help="where to write the hosts' ports once serving")
    args = parser.parse_args()
    serve(json.loads(Path(args.config).read_text()), Path(args.ready))


if __name__ == "__main__":
    main()
