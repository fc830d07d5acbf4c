"""Release assignment at N synthetic records: the old planner (a Python dict per record, from
git, tests/old_release.py) against the columnar one (DuckDB under a memory limit).

Writes N staging records in S = N / shard_size staging shards (records, index with three
members per sample, near-duplicate decisions with ~40 % of records in components spanning
shards), then runs each planner in its own process and prints wall time, peak RSS of
that process (ru_maxrss: Python and DuckDB's native memory) and bytes per record above
the interpreter's baseline. No tars are written: planning reads only these tables.

    .venv/bin/python bench/release_plan.py [--n 10000 100000] [--shard-size 1000] [--old] [--memory-limit 2GB]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import resource
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from corpusforge.layout import STAGING_RECORDS_SCHEMA, staging_index, staging_records
from tasks.graph.files import NEAR_DECISION_SCHEMA, decisions_path
from corpusforge.storage import Store
from tasks.release.shards import ASSIGN_MEMORY_LIMIT

INDEX_SCHEMA = pa.schema([("key", pa.string()), ("ext", pa.string()), ("offset", pa.int64()), ("size", pa.int64()),
                          ("sha256", pa.string())])


def write_synthetic(root: Path, n: int, shard_size: int, seed: int = 0) -> list[str]:
    """``n`` staged records in shards of ``shard_size``, with indexes and decisions."""
    rng = random.Random(seed)
    store = Store(str(root), fsync=False)
    shards = []
    for s in range(0, n, shard_size):
        shard = f"{s // shard_size:06d}"
        shards.append(shard)
        records, index, decisions = [], [], []
        offset = 0
        for i in range(s, min(n, s + shard_size)):
            key = f"{rng.getrandbits(40):010x}{i:09d}"
            ext = rng.choice(("jpg", "png", "webp"))
            sha = f"{rng.getrandbits(256):064x}"
            records.append({"key": key, "part": i // 5000, "row": i % 5000, "sha256": sha, "width": 640,
                            "height": 480, "source": rng.choice(("web", "books", "art")),
                            "caption_type": rng.choice(("short", "long", "tag")), "ext": ext, "bytes": 50_000})
            for member, size in ((ext, 50_000), ("txt", 80), ("json", 400)):
                index.append({"key": key, "ext": member, "offset": offset + 512, "size": size,
                              "sha256": f"{rng.getrandbits(256):064x}"})
                offset += 512 + size + (-size % 512)
            component = rng.randrange(n // 3) if rng.random() < 0.4 else None
            removed = component is not None and rng.random() < 0.2
            decisions.append({"key": key, "status": "near_duplicate" if removed else "kept",
                              "reason": "pair" if removed else "", "duplicate_of": None, "component_id": component,
                              "component_size": None if component is None else 3,
                              "max_similarity": None if component is None else 0.9})
        store.write_parquet(staging_records(shard), pa.Table.from_pylist(records, schema=STAGING_RECORDS_SCHEMA))
        store.write_parquet(staging_index(shard), pa.Table.from_pylist(index, schema=INDEX_SCHEMA))
        store.write_parquet(decisions_path(shard), pa.Table.from_pylist(decisions, schema=NEAR_DECISION_SCHEMA))
    return shards


def _run(which: str, root: str, shards: list[str], memory_limit: str, queue: mp.Queue) -> None:
    from tasks.release.splits import SplitConfig

    if which == "old":
        from tests.old_release import old_release_module

        plan = old_release_module().plan_release_files
    else:
        from tasks.release.shards import assign_release_files, write_staged_list

        def plan(store, shards, cfg, near_dedup):
            return assign_release_files(store, write_staged_list(store, shards), cfg, near_dedup,
                                        memory_limit=memory_limit)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    summary = plan(Store(root), shards, SplitConfig(), near_dedup=True)
    queue.put({"seconds": time.perf_counter() - started, "baseline_kib": baseline,
               "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               "release_shards": len(summary["shards"])})


def measure(which: str, root: Path, shards: list[str], memory_limit: str) -> dict:
    """One planner in a fresh process (spawned: its peak RSS is its own)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_run, args=(which, str(root), shards, memory_limit, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--old", action="store_true", help="also run the old planner (from git)")
    parser.add_argument("--memory-limit", default=ASSIGN_MEMORY_LIMIT, help="DuckDB's budget in the new planner")
    args = parser.parse_args()
    rows = []
    for n in args.n:
        with tempfile.TemporaryDirectory(prefix="release-plan-bench-") as tmp:
            shards = write_synthetic(Path(tmp), n, args.shard_size)
            for which in (("old", "new") if args.old else ("new",)):
                r = measure(which, Path(tmp), shards, args.memory_limit)
                extra = (r["peak_kib"] - r["baseline_kib"]) * 1024
                rows.append({"planner": which, "n": n, "staging_shards": len(shards), **r,
                             "peak_mib": round(r["peak_kib"] / 1024), "bytes_per_record": round(extra / n)})
                print(json.dumps(rows[-1]), flush=True)
    print("\n| planner | N | staging shards | wall s | peak RSS MiB | bytes/record above baseline |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['planner']} | {r['n']:,} | {r['staging_shards']} | {r['seconds']:.1f} | {r['peak_mib']} | "
              f"{r['bytes_per_record']:,} |")


if __name__ == "__main__":
    main()
