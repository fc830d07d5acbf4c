"""A whole build at the largest sizes this machine allows, to check bench/scale.py's
projections on the real flow (issue 22).

The sample corpus generator's corpus (``corpusforge sample``: planted exact and near
duplicates, bad records, captions, licences) of each size is built with the demo's
configuration (configs/demo.yaml: SSCD int8 near-duplicates, DINOv2 reference
statistics at random init, 2 worker processes), then built again into the same output (a
no-op rerun). Synthetic smooth pictures (bench/noop_rerun.py) do not serve here: SSCD
finds them all alike, and one near-duplicate component leaves the test split empty. Per
build it records, measured:

* wall time and seconds per stage (the run log);
* peak RSS of the flow process (``ru_maxrss``) and of the largest worker process
  (sampled once a second, so a shorter peak can be missed);
* Prefect task runs (from the API);
* bytes read by the flow and worker processes (``/proc/<pid>/io`` ``rchar``, sampled
  once a second: reads of a process that ended between two samples are missed).

It prints one row per build, then the growth exponent of each stage's time between the
sizes (a fit over two or three points, extrapolated, not measured, beyond them).

    .venv/bin/python bench/build_size.py [--sizes 5000 20000] [--results bench/results/build-size.jsonl]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.noop_rerun import task_runs  # noqa: E402
from corpusforge import cluster  # noqa: E402
from flows.build_corpus import BuildConfig, run_build  # noqa: E402
from sample_corpus import write_sample_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class Sampler:
    """Peak RSS of the worker processes and the bytes read by this process tree, sampled
    once a second in a thread (children come and go with each Dask cluster)."""

    def __init__(self) -> None:
        self.worker_rss = 0
        self.read: dict[int, int] = {}
        self._before: dict[int, int] = {}  # what processes alive at the start had read by then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._sample()
        self._before = dict(self.read)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sample()
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def _sample(self) -> None:
        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            try:
                cmd = " ".join(p.cmdline())
                if p.pid != me.pid and "prefect" in cmd and "server" in cmd:
                    continue  # the Prefect API server is not part of the build
                self.read[p.pid] = max(self.read.get(p.pid, 0), p.io_counters().read_chars)
                if p.pid != me.pid:
                    self.worker_rss = max(self.worker_rss, p.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    @property
    def read_bytes(self) -> int:
        """Bytes read since the start by the processes sampled."""
        return sum(n - self._before.get(pid, 0) for pid, n in self.read.items())


def build_config(source: Path, out: Path) -> BuildConfig:
    """The demo's configuration (as `make demo` builds) on ``source``."""
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data.update(source=str(source), out=str(out))
    return BuildConfig.model_validate(data)


def measured(cfg: BuildConfig) -> dict[str, Any]:
    """One build of ``cfg``, with what it cost."""
    started_at, started = time.time(), time.perf_counter()
    with Sampler() as sampler:
        work = run_build(cfg)["work"]
    wall = time.perf_counter() - started
    return {"wall": round(wall, 1), "stages": {k: round(v, 1) for k, v in work["seconds"].items()},
            "flow_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "worker_rss_mb": round(sampler.worker_rss / 2**20, 1), "task_runs": task_runs(started_at),
            "read_mb": round(sampler.read_bytes / 2**20, 1)}


def exponent(ns: list[int], ys: list[float]) -> float | None:
    """Least-squares slope of log y over log n (None when a value is not positive)."""
    if len(ns) < 2 or min(ys) <= 0:
        return None
    xs, ls = [math.log(n) for n in ns], [math.log(y) for y in ys]
    mx, my = sum(xs) / len(xs), sum(ls) / len(ls)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ls, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--results", help="append each build's figures here (JSON lines)")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cf-size-") as tmp, cluster.prefect_api():
        for n in sorted(args.sizes):
            root = Path(tmp) / str(n)
            write_sample_corpus(str(root / "source"), n=n, seed=0)
            cfg = build_config(root / "source", root / "out")
            for run in ("fresh", "no-op rerun"):
                row = {"n": n, "run": run, "load": round(os.getloadavg()[0], 1), **measured(cfg)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.results:
                    with open(args.results, "a") as f:
                        f.write(json.dumps(row) + "\n")
    stages = sorted({s for r in rows for s in r["stages"]})
    print("\nmeasured (seconds; MB):")
    print(f"{'N':>7} {'run':<12}{'wall':>7}{'runs':>6}{'flow MB':>9}{'worker MB':>10}{'read MB':>9}"
          + "".join(f"{s[:11]:>12}" for s in stages))
    for r in rows:
        print(f"{r['n']:>7} {r['run']:<12}{r['wall']:>7.0f}{r['task_runs']:>6}{r['flow_rss_mb']:>9.0f}"
              f"{r['worker_rss_mb']:>10.0f}{r['read_mb']:>9.0f}" + "".join(f"{r['stages'].get(s, 0):>12.1f}"
                                                                          for s in stages))
    fresh = [r for r in rows if r["run"] == "fresh"]
    ns = [r["n"] for r in fresh]
    print("\ngrowth exponent b of time ∝ N^b between the sizes (fresh builds; fitted, not a projection):")
    for key in ("wall", *stages):
        ys = [r["wall"] if key == "wall" else r["stages"].get(key, 0.0) for r in fresh]
        b = exponent(ns, ys)
        print(f"  {key:<14}{'-' if b is None else f'{b:.2f}':>6}")
    for r in rows:
        if r["run"] == "no-op rerun":
            f = next(x for x in fresh if x["n"] == r["n"])
            print(f"N={r['n']}: no-op rerun / fresh = {r['wall'] / f['wall']:.3f} (wall), "
                  f"{sum(r['stages'].values()) / max(sum(f['stages'].values()), 1e-9):.3f} (stages)")


if __name__ == "__main__":
    main()
