"""Fetching a URL list: corpusforge's fetch units against img2dataset on the same URLs.

The loopback hosts (``sample_corpus/http_hosts.py``) serve ``--images`` distinct small JPEGs over
``--hosts`` addresses (127.0.0.2, …) with ``--latency-ms`` added to every answer. corpusforge
fetches them with every check on (robots.txt, tdmrep.json, opt-out headers, address checks, body
cap, magic bytes, per-host limit of 2 connections, outcomes stored); img2dataset 1.47, installed
by this script into its own virtualenv (``--venv``), fetches the same URL list without resizing.
Printed: images/s of each, their ratio, CPU seconds per image, peak RSS, and the most requests any
host had in flight at once. corpusforge's fetch stage runs as a build runs it (host units planned,
fetched, each partition's ledger written): its units on a Dask ``LocalCluster`` of ``--units``
worker processes, the per-host limits held by the cluster's semaphores and the scheduler's host
ledger (``--engine threads``: in threads of this process, the limits process-wide).
Enforced (exit 1): corpusforge fetched every image, never had more than 2 requests in flight at
one host, and did at least ``--goal`` times img2dataset's images/s (the issue's goal: 1.0). The
loopback server's CPU and memory are counted for neither; it sets ``TCP_NODELAY`` as real servers
do (without it a client that reuses connections, as corpusforge does, waited ~44 ms per answer).
Both tools share the machine with whatever else runs: say the load with the figures (it is printed).

    python bench/fetch.py --images 2000 --hosts 32 --latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corpusforge.storage import Store  # noqa: E402
from tasks.ingest.fetch.config import FetchConfig  # noqa: E402
from tasks.ingest.fetch.stage import fetch_stage  # noqa: E402
from tasks.ingest.licenses import LicenseConfig  # noqa: E402
from tasks.ingest.sources import SourceConfig, cut_partitions  # noqa: E402
from tests.http_hosts import serving  # noqa: E402

LIMIT = 2  # connections per host (FetchConfig's default), enforced on corpusforge
UA = "corpusforge-bench/1.0 (+https://example.org/bench; bench@example.org)"


def write_images(folder: Path, n: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG", quality=75)
        (folder / f"i{i}.jpg").write_bytes(buf.getvalue())


def img2dataset_venv(venv: Path) -> Path:
    exe = venv / "bin" / "img2dataset"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "img2dataset==1.47.0"], check=True)
    return exe


SERVER = "sample_corpus.http_hosts"  # the loopback hosts: a child of this process, not part of a fetcher


def _ours(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its living descendants, but the loopback server (its CPU and memory serve
    both fetchers, and were counted as corpusforge's before)."""
    procs = []
    for p in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            if SERVER not in " ".join(p.cmdline()):
                procs.append(p)
    return procs


class PeakRSS:
    """The most resident memory a process and its descendants held at once (sampled every 50 ms)."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(0.05):
            try:
                procs = _ours(psutil.Process(self.pid))
                self.peak = max(self.peak, sum(p.memory_info().rss for p in procs if p.is_running()))
            except psutil.Error:
                pass

    def __enter__(self) -> PeakRSS:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _cpu_s(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and its living descendants so far (not the loopback server's)."""
    total = 0.0
    for p in _ours(root):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


class _ThreadFanOut:
    """The fetch stage's units in ``n`` threads of this process (``--engine threads``)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, unit: Any, calls: list[dict[str, Any]]) -> list[Any]:
        with ThreadPoolExecutor(self.n) as pool:
            return list(pool.map(lambda c: unit.fn(**c), calls))

    def stream(self, unit: Any, calls: list[dict[str, Any]], sink: Any) -> None:
        for i, result in enumerate(self(unit, calls)):
            sink(i, result)


def _call(fn: Any, kwargs: dict[str, Any]) -> Any:
    return fn(**kwargs)


class _DaskFanOut(_ThreadFanOut):
    """The fetch stage's units as tasks on a LocalCluster's worker processes (as a build runs them)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, unit: Any, calls: list[dict[str, Any]]) -> list[Any]:
        return self.client.gather([self.client.submit(_call, unit.fn, c, pure=False) for c in calls])


def run_corpusforge(tmp: Path, source: Path, units: int, engine: str, unit_urls: int) -> dict:
    store = Store(str(tmp / "cf-out"), fsync=False)
    _, parts = cut_partitions(str(source), store, SourceConfig(partition_size=500))
    cfg = FetchConfig(user_agent=UA, allow_private_networks=True, threads=32, retries=1, backoff_s=0.05,
                      connections_per_host=LIMIT, unit_urls=unit_urls)
    me = psutil.Process()
    with contextlib.ExitStack() as stack:
        fan_out: Any = _ThreadFanOut(units)
        if engine == "dask":
            from distributed import Client, LocalCluster

            cluster = stack.enter_context(LocalCluster(n_workers=units, threads_per_worker=1, processes=True,
                                                       dashboard_address=None))
            client = stack.enter_context(Client(cluster))
            client.run(lambda: __import__("tasks.ingest.fetch.stage"))  # imports are not the fetch's cost
            fan_out = _DaskFanOut(client)
        before, start = _cpu_s(me), time.perf_counter()
        with PeakRSS(me.pid) as rss:  # the whole stage: host units planned, fetched, the ledgers written
            work, section = fetch_stage(store, parts, cfg, LicenseConfig(), fan_out)
        wall, cpu = time.perf_counter() - start, _cpu_s(me) - before
    return {"wall_s": wall, "images": section["fetched"], "cpu_s": cpu, "peak_rss_mb": rss.peak / 2**20,
            "engine": engine, "host_units": sum(work["host_units"].values())}


def run_img2dataset(exe: Path, tmp: Path, source: Path, processes: int, threads: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen([str(exe), "--url_list", str(source), "--input_format", "parquet", "--url_col", "url",
                             "--output_format", "files", "--output_folder", str(tmp / "i2d-out"),
                             "--resize_mode", "no", "--processes_count", str(processes),
                             "--thread_count", str(threads), "--retries", "1",
                             "--disallowed_header_directives", "[]"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with PeakRSS(proc.pid) as rss:
        if proc.wait() != 0:
            raise RuntimeError(f"img2dataset exited with {proc.returncode}")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stats = [json.loads(p.read_text()) for p in (tmp / "i2d-out").glob("*_stats.json")]
    return {"wall_s": wall, "images": sum(s["successes"] for s in stats),
            "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "peak_rss_mb": rss.peak / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--latency-ms", type=int, default=20)
    ap.add_argument("--units", type=int, default=2, help="corpusforge fetch units at a time (Dask worker processes)")
    ap.add_argument("--engine", choices=("dask", "threads"), default="dask",
                    help="corpusforge's units on a LocalCluster (as a build runs them) or in threads of this process")
    ap.add_argument("--unit-urls", type=int, default=FetchConfig().unit_urls,
                    help="fetch.unit_urls: URLs in one host unit at most (small hosts packed up to it)")
    ap.add_argument("--processes", type=int, default=2, help="img2dataset processes")
    ap.add_argument("--threads", type=int, default=32, help="img2dataset threads per process")
    ap.add_argument("--venv", default=str(ROOT / ".venv-bench-img2dataset"))
    ap.add_argument("--goal", type=float, default=1.0,
                    help="exit 1 when corpusforge's images/s over img2dataset's is below this (the issue's goal)")
    ap.add_argument("--record", help="append the results, the date and the load average as a JSON line here")
    args = ap.parse_args()
    started, load_before = datetime.now(timezone.utc), os.getloadavg()
    exe = img2dataset_venv(Path(args.venv))
    with tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp_dir:
        tmp = Path(tmp_dir)
        write_images(tmp / "images", args.images)
        hosts = [f"127.0.0.{2 + h}" for h in range(args.hosts)]
        with serving(tmp, {h: {"robots": "allow"} for h in hosts}, tmp / "images", args.latency_ms) as served:
            urls = [served.url(hosts[i % len(hosts)], f"/img/i{i}.jpg") for i in range(args.images)]
            source = tmp / "urls.parquet"
            pq.write_table(pa.table({"url": urls, "license": ["CC BY 4.0"] * len(urls)}), source)
            results = {}
            for name, run in (("corpusforge", lambda: run_corpusforge(tmp, source, args.units, args.engine,
                                                                      args.unit_urls)),
                              ("img2dataset", lambda: run_img2dataset(exe, tmp, source, args.processes,
                                                                      args.threads))):
                served.reset()
                results[name] = run()
                results[name]["peak_in_flight_per_host"] = max(served.seen()["peak"].values())
    for name, r in results.items():
        print(f"{name:12s} {r['images']:>6d} images in {r['wall_s']:.1f} s: {r['images'] / r['wall_s']:.0f} "
              f"images/s, {r['cpu_s'] / max(r['images'], 1) * 1000:.2f} ms CPU/image, peak RSS "
              f"{r['peak_rss_mb']:.0f} MB, most in flight at one host {r['peak_in_flight_per_host']}")
    cf, i2d = results["corpusforge"], results["img2dataset"]
    ratio = (cf["images"] / cf["wall_s"]) / (i2d["images"] / i2d["wall_s"])
    print(f"ratio corpusforge/img2dataset images/s: {ratio:.2f} (goal {args.goal:g}; load {os.getloadavg()[0]:.1f})")
    if args.record:
        with open(args.record, "a") as f:
            f.write(json.dumps({"date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "args": vars(args),
                                "load_before": load_before, "load_after": os.getloadavg(), "ratio": ratio,
                                "results": results}) + "\n")
    missed = []
    if cf["peak_in_flight_per_host"] > LIMIT:
        missed.append(f"corpusforge had {cf['peak_in_flight_per_host']} requests in flight at one host (limit {LIMIT})")
    if cf["images"] != args.images:
        missed.append(f"corpusforge fetched {cf['images']} of {args.images} images")
    if ratio < args.goal:
        missed.append(f"ratio {ratio:.2f} below the goal {args.goal:g}")
    if missed:
        sys.exit("bound missed: " + "; ".join(missed))


if __name__ == "__main__":
    main()
