"""The loopback image hosts (``sample_corpus/http_hosts.py``) as a test helper: a real server
process, its hosts' URLs and what each host saw; and a https host with a self-signed
certificate (:func:`tls_host`), a real TLS server in a thread."""

from __future__ import annotations

import contextlib
import io
import datetime
import ipaddress
import json
import ssl
import threading
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def jpeg(seed: int, size: tuple[int, int] = (320, 256)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def bomb_png(side: int = 30_000) -> bytes:
    """A PNG whose header declares side×side pixels (over validation.max_pixels) in a few bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


def write_images(folder: Path, n: int) -> dict[str, bytes]:
    """``img{i}.jpg`` for i < n, plus ``truncated.jpg`` and ``bomb.png``; name → bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {f"img{i}.jpg": jpeg(i) for i in range(n)}
    files["truncated.jpg"] = jpeg(10_000)[:3000]
    files["bomb.png"] = bomb_png()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


@dataclass
class Hosts:
    ports: dict[str, int]
    control: str

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.ports[host]}{path}"

    def seen(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.control + "/") as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        urllib.request.urlopen(self.control + "/reset").read()


@contextlib.contextmanager
def serving(folder: Path, hosts: dict[str, dict[str, Any]], images: Path, latency_ms: int = 0) -> Iterator[Hosts]:
    """Start the server process for ``hosts``; stop it on exit."""
    config, ready = folder / "hosts.json", folder / "ready.json"
    config.write_text(json.dumps({"images": str(images), "hosts": hosts, "latency_ms": latency_ms}))
    proc = subprocess.Popen([sys.executable, "-m", "sample_corpus.http_hosts", "--config", str(config),
                             "--ready", str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the loopback hosts did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        yield Hosts(info["hosts"], info["control"])
    finally:
        proc.kill()
        proc.wait()


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate valid for the DNS name ``name`` alone: (certificate, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@dataclass
class TlsHost:
    port: int
    cert: Path
    seen: list[tuple[str | None, str, str]]  # (SNI name, Host header, path) of every request


@contextlib.contextmanager
def tls_host(folder: Path, name: str, images: Path, address: str = "127.0.0.1") -> Iterator[TlsHost]:
    """A https image host on ``address`` whose certificate names ``name`` alone: ``/img/FILE``
    serves ``images/FILE``, anything else is 404 (robots.txt too: everything allowed). It
    records the SNI name each connection asked for and the Host header of each request."""
    cert, key = self_signed(folder, name)
    seen: list[tuple[str | None, str, str]] = []
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def remember_sni(sock: ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        sock.sni_name = server_name  # type: ignore[attr-defined]

    ctx.sni_callback = remember_sni

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append((getattr(self.connection, "sni_name", None), self.headers["Host"], self.path))
            file = images / self.path.removeprefix("/img/")
            ok = self.path.startswith("/img/") and file.is_file()
            body = file.read_bytes() if ok else b"not here"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that refuses the certificate hangs up

    server = Server((str(ipaddress.ip_address(address)), 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield TlsHost(server.server_address[1], cert, seen)
    finally:
        server.shutdown()
        server.server_close()
