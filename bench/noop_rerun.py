"""What a no-op rerun costs next to a fresh build, with one Prefect task run per unit and
with batches of units (issue 22), side by side in one run.

A folder of small synthetic pictures (48–64 px, ``validation.min_side: 32``) is built on
an embedded LocalCluster of 2 worker processes with a temporary Prefect server, as the
issue measured it (``staging.shard_size: 25``, ``input.partition_size: 50``), then built
again into the same output: every unit skips by its marker. "per unit" is the old
fan-out, emulated by giving every unit its own batch (``batch_count`` returns the number
of units); "batched" is :func:`corpusforge.cluster.batch_count`. Prints wall time and
time in stages of each build, the rerun's share of the fresh build, and the task runs
each build made (from the Prefect API).

    .venv/bin/python bench/noop_rerun.py [--n 2400]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from PIL import Image

import corpusforge.cluster as cluster
from flows.build_corpus import BuildConfig, run_build


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


def config(source: Path, out: Path) -> BuildConfig:
    return BuildConfig.model_validate({
        "source": str(source), "out": str(out), "input": {"partition_size": 50},
        "staging": {"shard_size": 25}, "validation": {"min_side": 32},
        "splits": {"shard_size": 100, "val": 0.1, "test": 0.1},
        "dask": {"n_workers": 2, "processes": True}, "licenses": None})


def task_runs(since: float) -> int:
    """Task runs created on the Prefect API after ``since`` (epoch seconds)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterStartTime

    async def count() -> int:
        found, page = 0, 200
        flt = TaskRunFilter(start_time=TaskRunFilterStartTime(after_=datetime.fromtimestamp(since, tz=timezone.utc)))
        async with get_client() as client:
            while len(runs := await client.read_task_runs(task_run_filter=flt, offset=found, limit=page)) == page:
                found += page
        return found + len(runs)

    return asyncio.run(count())


def timed(cfg: BuildConfig) -> dict[str, float]:
    started_at = time.time()
    started = time.perf_counter()
    work = run_build(cfg)["work"]
    wall = time.perf_counter() - started
    return {"wall": wall, "stages": sum(work["seconds"].values()), "task_runs": task_runs(started_at),
            **{f"s.{k}": v for k, v in work["seconds"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2400, help="pictures in the source folder")
    args = parser.parse_args()
    logging.disable(logging.INFO)
    batched = cluster.batch_count
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cf-noop-") as tmp, cluster.prefect_api():
        root = Path(tmp)
        pictures(root / "source", args.n)
        for mode, count in (("per unit", lambda n_units, slots: n_units), ("batched", batched)):
            cluster.batch_count = count
            out = root / mode.replace(" ", "-")
            rows[f"{mode}: fresh"] = timed(config(root / "source", out))
            rows[f"{mode}: no-op rerun"] = timed(config(root / "source", out))
        cluster.batch_count = batched
    keys = sorted({k for r in rows.values() for k in r if k.startswith("s.")})
    print(f"{args.n} pictures, 2 worker processes; seconds (measured)")
    print(f"{'build':<24}{'wall':>8}{'stages':>8}{'runs':>7}" + "".join(f"{k[2:]:>12}" for k in keys))
    for name, r in rows.items():
        print(f"{name:<24}{r['wall']:>8.1f}{r['stages']:>8.1f}{r['task_runs']:>7.0f}"
              + "".join(f"{r.get(k, 0):>12.1f}" for k in keys))
    for mode in ("per unit", "batched"):
        fresh, rerun = rows[f"{mode}: fresh"], rows[f"{mode}: no-op rerun"]
        print(f"{mode}: no-op rerun / fresh build = {rerun['wall'] / fresh['wall']:.2f} (wall), "
              f"{rerun['stages'] / fresh['stages']:.2f} (stages)")


if __name__ == "__main__":
    main()
