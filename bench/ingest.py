"""Ingest and shard-writing throughput on the sample corpus, measured side by side.

Prints, in one run on one core:
* ingest + hash + validate: images/s per core (plan → ingest every partition in-process);
* staging-shard writing throughput as a ratio to a raw sequential copy of the same bytes
  (read every staged image file, append it to one output file).

    .venv/bin/python bench/ingest.py [--n 2000] [--source DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from corpusforge.layout import hashes_path, keys_table_path
from corpusforge.storage import Store
from sample_corpus import write_sample_corpus
from tasks.exact_dedup import find_duplicate_keys, find_exact_duplicates, resolve_partition
from tasks.ingest import ingest_partition
from tasks.sources import SourceConfig, plan_partitions
from tasks.staging import plan_staging, shard_records, write_staging_shard
from tasks.validate import ValidationConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--source", help="an existing source corpus (default: write the sample)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        source = args.source or str(work / "source")
        if not args.source:
            write_sample_corpus(source, n=args.n, seed=0)
        store = Store(str(work / "out"))
        cfg, val = SourceConfig(partition_size=250), ValidationConfig()

        t0 = time.perf_counter()
        _, parts = plan_partitions(source, store, cfg)
        ingested = [ingest_partition(store, p, cfg, val, 4) for p in parts]
        records = sum(m["info"]["records"] for m in ingested)
        ingest_s = time.perf_counter() - t0
        keys = [m["outputs"][keys_table_path(p.index)] for p, m in zip(parts, ingested, strict=True)]
        hashes = [m["outputs"][hashes_path(p.index)] for p, m in zip(parts, ingested, strict=True)]
        keydup = [find_duplicate_keys(store, b, keys) for b in range(4)]
        exact = [find_exact_duplicates(store, b, hashes, [m["digest"] for m in keydup]) for b in range(4)]
        decisions = [m["digest"] for m in keydup + exact]
        resolved = [resolve_partition(store, p.index, m["digest"], decisions, 250)
                    for p, m in zip(parts, ingested, strict=True)]
        shards = plan_staging([m["info"] for m in resolved], 250)

        t0 = time.perf_counter()
        for s in shards:
            write_staging_shard(store, s, {})
        shard_s = time.perf_counter() - t0

        staged = [r for s in shards for r in shard_records(store, s)]
        t0 = time.perf_counter()
        with open(work / "raw-copy.bin", "wb") as out:
            for r in staged:
                with open(r["source_path"], "rb") as f:
                    out.write(f.read())
        copy_s = time.perf_counter() - t0
        total_bytes = sum(r["bytes"] for r in staged)

        print(f"records: {records}, staged: {len(staged)} in {len(shards)} shards, {total_bytes / 1e6:.1f} MB")
        print(f"ingest + hash + validate: {records / ingest_s:.0f} images/s on one core ({ingest_s:.2f} s)")
        print(f"staging shard writing:    {total_bytes / shard_s / 1e6:.0f} MB/s ({shard_s:.2f} s)")
        print(f"raw sequential copy:      {total_bytes / copy_s / 1e6:.0f} MB/s ({copy_s:.2f} s)")
        print(f"shard writing / raw copy throughput ratio: {copy_s / shard_s:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
