"""The loopback image hosts (``sample_corpus/http_hosts.py``) as a test helper: a real server
process, its hosts' URLs and what each host saw."""

from __future__ import annotations

import contextlib
import io
import json
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
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
