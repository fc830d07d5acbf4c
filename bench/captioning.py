"""Captioning stage throughput against the loopback chat stub (tests/chat_stub.py).

1. Requests/s of the stage (one staging shard, one caption request per image) against a
   stub answering after a fixed latency, at concurrency 1, 8, 64, 256 per task; the ideal
   is concurrency / latency, and beside it a bare httpx client posting the same bodies at
   the same concurrency: what this machine and the stub can do at all. stage/bare near 1
   means the stage is not what limits throughput.
2. The stage's own cost per request (reading the image from the staging tar, header
   check or decode/resize/encode, base64, journal, bookkeeping) against a zero-latency
   stub: the stage's time per request next to the same requests posted by a bare httpx
   client with pre-encoded bodies, and the image preparation alone.

Images are 640×480 JPEGs (GPIC's mean is 587×479): at max_side 768 they are sent as
stored; ``--max-side 512`` makes the stage resize and re-encode every one.
Run: ``PYTHONPATH=. python bench/captioning.py [--latency 0.05]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from corpusforge.storage import Store
from corpusforge.tarshard import Sample
from tasks.captions.client import encode_image, request_body
from tasks.captions.config import CaptioningConfig
from tasks.captions.prompts import caption_prompts
from tasks.captions.stage import caption_shard, assign_captions
from tests.staging_files import write_staging_shard


def jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    base = rng.random((30, 40, 3))  # smooth content compresses like a photograph, not like noise
    img = Image.fromarray((np.kron(base, np.ones((16, 16, 1))) * 255).astype("uint8"))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def staging(root: Path, n: int) -> Store:
    store = Store(str(root))
    images = [jpeg(i) for i in range(n)]
    records = [{"key": f"b{i:06d}", "sha256": hashlib.sha256(d).hexdigest(), "ext": "jpg", "width": 640,
                "height": 480, "source": "bench", "caption_type": "short", "part": 0, "row": i, "bytes": len(d)}
               for i, d in enumerate(images)]
    samples = [Sample(r["key"], {"jpg": d, "txt": b"", "json": b"{}"}) for r, d in zip(records, images, strict=True)]
    write_staging_shard(store, "s", records, samples)
    return store


MAX_SIDE = 768


def config(base_url: str, concurrency: int) -> CaptioningConfig:
    return CaptioningConfig.model_validate({
        "endpoint": {"base_url": base_url, "model": "bench", "concurrency": concurrency, "timeout_s": 120},
        "questions": [], "recaption": True, "mix": {"short": 1.0}, "max_side": MAX_SIDE})


def run_stage(root: Path, n: int, base_url: str, concurrency: int) -> float:
    """Seconds the stage takes for ``n`` fresh requests (a new output root: nothing journaled)."""
    store = staging(root, n)
    cfg = config(base_url, concurrency)
    digest = assign_captions(store, ["s"], cfg, near_dedup=False)["s"]
    started = time.perf_counter()
    result = caption_shard(store, "s", cfg, digest)
    elapsed = time.perf_counter() - started
    assert result.requests_asked == n and result.info["by_status"] == {"kept": n}, result.info
    return elapsed


def bodies_for(n: int, base_url: str) -> list[bytes]:
    """The request bodies the stage sends for the first ``n`` bench images, built up front."""
    cfg = config(base_url, 1)
    prompt = caption_prompts(cfg)["short"]
    return [json.dumps(request_body("bench", prompt, encode_image(jpeg(i), cfg.max_side, cfg.jpeg_quality),
                                    cfg.sampling)).encode() for i in range(n)]


async def bare_client(base_url: str, bodies: list[bytes], concurrency: int) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        it = iter(bodies)

        async def worker() -> None:
            for body in it:
                resp = await http.post(base_url + "/chat/completions", content=body,
                                       headers={"Content-Type": "application/json"})
                resp.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


STUB_PROCESS = """
import sys, time
from tests.chat_stub import chat_stub
with chat_stub(default=("text", "A short caption of a bench image with some words in it."),
               latency_s=float(sys.argv[1])) as stub:
    print(stub.base_url, flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
"""


@contextlib.contextmanager
def stub_process(latency: float) -> Iterator[str]:
    """The stub in its own process, so that its request parsing does not share a GIL with
    the stage being measured (as a real server would not)."""
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-c", STUB_PROCESS, str(latency)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": root})
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--latency", type=float, default=0.05, help="stub latency per request, seconds")
    parser.add_argument("--rounds", type=int, default=6, help="requests per concurrency slot")
    parser.add_argument("--overhead-n", type=int, default=400, help="requests for the overhead measurement")
    parser.add_argument("--max-side", type=int, default=768, help="the stage's max_side")
    args = parser.parse_args()
    global MAX_SIDE
    MAX_SIDE = args.max_side
    print(f"# 1. requests/s, stub latency {args.latency * 1000:.0f} ms")
    print("concurrency  requests  stage req/s  bare client req/s  ideal req/s  stage/ideal  stage/bare")
    with tempfile.TemporaryDirectory() as tmp, stub_process(args.latency) as base_url:
        for c in (1, 8, 64, 256):
            n = max(20, c * args.rounds)
            seconds = run_stage(Path(tmp) / f"c{c}", n, base_url, c)
            bare = asyncio.run(bare_client(base_url, bodies_for(n, base_url)[: n], c))
            ideal = c / args.latency
            print(f"{c:11d}  {n:8d}  {n / seconds:11.1f}  {n / bare:17.1f}  {ideal:11.0f}  {n / seconds / ideal:11.2f}"
                  f"  {bare / seconds:10.2f}")
    n = args.overhead_n
    print(f"\n# 2. per-request cost against a zero-latency stub ({n} requests, concurrency 8)")
    with tempfile.TemporaryDirectory() as tmp, stub_process(0.0) as base_url:
        stage_s = run_stage(Path(tmp) / "o", n, base_url, 8)
        cfg = config(base_url, 8)
        images = [jpeg(i) for i in range(n)]
        started = time.perf_counter()
        for d in images:
            encode_image(d, cfg.max_side, cfg.jpeg_quality)
        encode_s = time.perf_counter() - started
        bare_s = asyncio.run(bare_client(base_url, bodies_for(n, base_url), 8))
    per = {k: 1000 * v / n for k, v in {"stage": stage_s, "bare": bare_s, "encode": encode_s}.items()}
    print(f"stage, whole:                         {per['stage']:6.2f} ms/request")
    print(f"bare httpx client, same bodies:       {per['bare']:6.2f} ms/request")
    print(f"image preparation alone:              {per['encode']:6.2f} ms/image (one thread, max_side {MAX_SIDE})")
    print(f"stage overhead over the bare client:  {per['stage'] - per['bare']:6.2f} ms/request "
          f"({(per['stage'] - per['bare']) / per['stage']:.0%} of the stage's time against a zero-latency stub)")


if __name__ == "__main__":
    main()
