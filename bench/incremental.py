"""What a scheduled rebuild costs: a fresh build, then +10 % rows, then 1 % of captions edited.

Prints, for each rerun into the same output, the units each stage recomputed and the
wall time of the whole build, of the feature stage and of the graph queries as ratios to
the fresh build's, all measured in this one run (in-process stages, one core's worth of
work, the default weight-free descriptor). Goals (issue "Rebuilds that are always
right"): the +10 % rerun's feature + graph-query time <= 0.2 of the fresh build's; the
caption edit recomputes 0 feature shards.

    .venv/bin/python bench/incremental.py [--n 2000] [--shard-size 100]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flows.build_corpus import BuildConfig, build
from sample_corpus import write_sample_corpus


def config(source: Path, out: Path, shard_size: int) -> BuildConfig:
    return BuildConfig.model_validate({
        "source": str(source), "out": str(out), "input": {"partition_size": 250},
        "staging": {"shard_size": shard_size}, "splits": {"shard_size": 500},
        "near_dedup": {"index": {"search": "range"}}})


def timed_build(cfg: BuildConfig) -> tuple[float, dict]:
    started = time.perf_counter()
    work = build(cfg)["work"]
    return time.perf_counter() - started, work


def units(work: dict) -> dict:
    """Units computed per stage, from the build's work log."""
    out = {k: work[k]["computed"] for k in ("ingest", "exact_dedup", "resolve", "staging")}
    out["features"] = sum(v["computed"] for v in work.get("features", {}).values())
    out["images_embedded"] = work.get("images_embedded", 0)
    out["graph_queries"] = work["graph"]["queries"]["computed"]
    out["release_shards"] = work["publish"]["release_shards"]["computed"]
    out["manifest_parts"] = work["publish"]["manifest_parts"]["computed"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="records at the first build")
    parser.add_argument("--shard-size", type=int, default=100)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory(prefix="cf-incremental-") as tmp:
        root = Path(tmp)
        source = root / "source"
        n_total = int(args.n * 1.1)
        write_sample_corpus(str(source), n=n_total, seed=0)
        rows = pq.read_table(source / "metadata.parquet").to_pylist()
        pq.write_table(pa.Table.from_pylist(rows[:args.n]), source / "metadata.parquet")
        out = root / "out"
        fresh_s, fresh = timed_build(config(source, out, args.shard_size))

        pq.write_table(pa.Table.from_pylist(rows), source / "metadata.parquet")
        grow_s, grow = timed_build(config(source, out, args.shard_size))

        edited = [dict(r) for r in rows]
        for r in edited[:: 100]:
            r["caption"] = (r.get("caption") or "") + " (edited)"
        pq.write_table(pa.Table.from_pylist(edited), source / "metadata.parquet")
        edit_s, edit = timed_build(config(source, out, args.shard_size))

    def expensive(work: dict) -> float:
        return work["seconds"]["features"] + work["seconds"]["graph_queries"]

    print(f"fresh build of {args.n} records: {fresh_s:.1f} s; units {json.dumps(units(fresh))}")
    for name, seconds, work in (("+10 % rows", grow_s, grow), ("1 % captions edited", edit_s, edit)):
        print(f"{name}: units {json.dumps(units(work))}")
        print(f"  wall {seconds:.1f} s = {seconds / fresh_s:.2f} of fresh; features + graph queries "
              f"{expensive(work):.1f} s = {expensive(work) / expensive(fresh):.2f} of fresh "
              f"(features {work['seconds']['features'] / fresh['seconds']['features']:.2f}, "
              f"queries {work['seconds']['graph_queries'] / max(fresh['seconds']['graph_queries'], 1e-9):.2f})")


if __name__ == "__main__":
    main()
