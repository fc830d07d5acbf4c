"""What a no-op rerun costs next to a fresh build, per corpus shape (issue 31, item 4: ≤ 10 %).

A folder of small synthetic pictures (48–64 px, ``validation.min_side: 32``) is built on an
embedded LocalCluster of 2 worker processes with a temporary Prefect server, then built
again into the same output with nothing changed, twice: every unit is current. Neither rerun
makes a task run (the fresh build kept its version when it ended, the account of a version
compared with itself is written without a read, and the folder's listing is probed by a walk
of its entries in the flow process, ``folder_stamp``), so the embedded cluster is never
started; the first rerun writes that account, the second finds it current. Shapes:

* ``tiny units``: ``input.partition_size: 50``, ``staging.shard_size: 25`` (2,400 pictures:
  48 partitions, ~96 staging shards), where per-unit costs dominate;
* ``default units``: the default partition and staging shard sizes (a few big units).

Per build it prints wall time, CPU seconds (this process and its reaped worker processes,
from ``getrusage``; the Prefect server's own CPU is not counted), seconds in stages (the
run log) and the Prefect task runs made, by task (from the API); then the rerun's share
of the fresh build, wall and CPU. It exits 1 when a rerun costs more than
:data:`BOUND` of its fresh build, in wall or CPU.

    .venv/bin/python bench/noop_rerun.py [--n 2400] [--shapes tiny default]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import re
import resource
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import corpusforge.cluster as cluster
from flows.build_corpus import BuildConfig, run_build

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"input": {"partition_size": 50}, "staging": {"shard_size": 25}},
    "default": {},
}


def pictures(folder: Path, n: int) -> None:
    """``n`` distinct smooth pictures, 48–64 px a side."""
    folder.mkdir(parents=True)
    for i in range(n):
        rng = np.random.default_rng(i)
        coarse = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        side = (int(rng.integers(48, 65)), int(rng.integers(48, 65)))
        buf = io.BytesIO()
        Image.fromarray(coarse).resize(side, Image.Resampling.BICUBIC).save(buf, "PNG")
        (folder / f"{i:05d}.png").write_bytes(buf.getvalue())


def config(source: Path, out: Path, shape: dict[str, Any]) -> BuildConfig:
    return BuildConfig.model_validate({
        "source": str(source), "out": str(out), "validation": {"min_side": 32},
        "splits": {"shard_size": 100, "val": 0.1, "test": 0.1},
        "dask": {"n_workers": 2, "processes": True}, "licenses": None, **shape})


def task_runs(since: float) -> Counter[str]:
    """Task runs created on the Prefect API after ``since`` (epoch seconds), by task."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterStartTime

    async def names() -> list[str]:
        found: list[str] = []
        flt = TaskRunFilter(start_time=TaskRunFilterStartTime(after_=datetime.fromtimestamp(since, tz=timezone.utc)))
        async with get_client() as client:
            while runs := await client.read_task_runs(task_run_filter=flt, offset=len(found), limit=200):
                found += [r.name for r in runs]
        return found

    return Counter(re.sub(r"( \d+/\d+|-[0-9a-f]{3})$", "", n) for n in asyncio.run(names()))


def cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the build's worker processes)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def timed(cfg: BuildConfig) -> dict[str, Any]:
    started_at, cpu, started = time.time(), cpu_seconds(), time.perf_counter()
    result = run_build(cfg)
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    work = result["work"]
    return {"wall": wall, "cpu": cpu, "stages": sum(work["seconds"].values()), "seconds": work["seconds"],
            "runs": task_runs(started_at), "staging_shards": sum(work["staging"].values()),
            "partitions": sum(work["ingest"].values())}


BOUND = 0.10  # issue 31: a no-op rerun costs at most 10 % of a fresh build, for every shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2400, help="pictures in the source folder")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["tiny", "default"])
    args = parser.parse_args()
    logging.disable(logging.INFO)
    print(f"{args.n} pictures, 2 worker processes; seconds (measured)")
    print(f"{'build':<22}{'parts':>6}{'shards':>7}{'wall':>8}{'cpu':>8}{'stages':>8}{'runs':>6}  slowest stages")
    over = []
    with tempfile.TemporaryDirectory(prefix="cf-noop-") as tmp, cluster.prefect_api():
        root = Path(tmp)
        pictures(root / "source", args.n)
        for shape in args.shapes:  # each shape's lines as soon as it is measured
            out = root / shape
            fresh = report(f"{shape}: fresh", timed(config(root / "source", out, SHAPES[shape])))
            print(f"{shape}: task runs of the fresh build {dict(sorted(fresh['runs'].items()))}")
            for name in ("no-op rerun", "no-op again"):
                rerun = report(f"{shape}: {name}", timed(config(root / "source", out, SHAPES[shape])))
                wall, cpu = rerun["wall"] / fresh["wall"], rerun["cpu"] / fresh["cpu"]
                print(f"{shape}: {name} / fresh build = {wall:.3f} (wall), "
                      f"{cpu:.3f} (CPU), {rerun['stages'] / fresh['stages']:.3f} (stages)")
                print(f"{shape}: task runs of the {name} {dict(sorted(rerun['runs'].items()))}", flush=True)
                if max(wall, cpu) > BOUND:
                    over.append(f"{shape}: {name} {max(wall, cpu):.3f}")
    print(f"bound: a no-op rerun ≤ {BOUND} of a fresh build (wall and CPU): "
          + (f"BROKEN by {', '.join(over)}" if over else "kept"))
    if over:
        raise SystemExit(1)


def report(name: str, r: dict[str, Any]) -> dict[str, Any]:
    """Print one build's row; return it."""
    slow = sorted(r["seconds"].items(), key=lambda kv: -kv[1])[:4]
    print(f"{name:<22}{r['partitions']:>6}{r['staging_shards']:>7}{r['wall']:>8.1f}{r['cpu']:>8.1f}"
          f"{r['stages']:>8.1f}{sum(r['runs'].values()):>6}  " + ", ".join(f"{k} {v:.1f}" for k, v in slow), flush=True)
    return r


if __name__ == "__main__":
    main()
