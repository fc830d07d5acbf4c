"""Ingest and staging on the sample corpus: source bytes read, throughput, side by side.

Prints, in one run on one core:
* ingest + hash + validate + spill: images/s per core (plan → ingest every partition in-process);
* bytes read from the source per byte of the source (metadata table and image files),
  counted by an fsspec filesystem wrapper the source is read through (goal: 1.0×, each
  byte read once; ingest spills the valid bytes and staging copies from the spill);
* staging-shard writing throughput as a ratio to a raw sequential copy of the same bytes
  (read every staged image file, append it to one output file, fsync it once at the end,
  as staging fsyncs each finished shard; goal ≥ 0.8×). Both count the staged images'
  bytes; staging also writes tar headers, captions, sample JSON, its index and records
  files and markers, checks each image's spill checksum and hashes its tar (SHA-256), and
  syncs each tar ahead while writing it (all timed). ``--repeat`` alternates the two
  (staging outputs removed before each staging run, and ``sync`` before each timed run,
  so neither waits for the other's or the setup's writeback) and prints every pair, then the
  median ratio and its range, and the ratio of their CPU times: the two threads of
  staging (writer and tar hash) use more CPU than the copy, so on a machine whose cores
  are busy with other work its wall time grows more than the copy's.

Staging shards have the pipeline's default size (``staging.shard_size``) unless
``--shard-size`` says otherwise: a shard's fixed costs (its records, index and marker
files) weigh more in small shards.

    .venv/bin/python bench/ingest.py [--n 2000] [--source DIR] [--repeat 5] [--shard-size N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from corpusforge.storage import Store
from corpusforge.version import code_version
from sample_corpus import write_sample_corpus
from tasks.ingest.exact_dedup import deduplicate
from tasks.ingest.partition import ingest_partition
from tasks.ingest.sources import SourceConfig, cut_partitions
from tasks.staging.stage import StagingConfig, cut_staging, shard_records, write_staging_shard
from tasks.shared.validate import ValidationConfig

PROTOCOL = "counted"


class _CountedFile:
    """A read-only file that adds every byte it returns to its filesystem's counter."""

    def __init__(self, f: Any, fs: CountingFileSystem):
        self._f, self._fs = f, fs

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        CountingFileSystem.bytes_read += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._f.readinto(buffer)
        CountingFileSystem.bytes_read += n or 0
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _CountedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()

    def __iter__(self):
        return iter(self._f)


class CountingFileSystem(LocalFileSystem):
    """Local files under ``counted://``: a "remote" source for the pipeline (so it reads it
    through fsspec, as it would read s3://), counting the bytes every open file returns."""

    protocol = (PROTOCOL,)
    bytes_read = 0

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3:]
        return super()._strip_protocol(path)

    def unstrip_protocol(self, name: str) -> str:
        return f"{PROTOCOL}://{self._strip_protocol(name)}"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        f = super()._open(path, mode, **kwargs)
        return _CountedFile(f, self) if "r" in mode else f


fsspec.register_implementation(PROTOCOL, CountingFileSystem, clobber=True)


def timed(work: Any) -> tuple[float, float]:
    """Wall and CPU seconds (this process, all threads) of ``work()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def raw_copy(staged: list[dict[str, Any]], target: Path) -> None:
    """The reference: every staged image file read whole and appended to one file, fsynced once."""
    with open(target, "wb") as out:
        for r in staged:
            with open(CountingFileSystem._strip_protocol(r["source_path"]), "rb") as f:
                out.write(f.read())
        out.flush()
        os.fsync(out.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--source", help="an existing source corpus (default: write the sample)")
    parser.add_argument("--repeat", type=int, default=3, help="staging / raw-copy pairs to time (alternating)")
    parser.add_argument("--shard-size", type=int, default=StagingConfig().shard_size,
                        help="average samples per staging shard (default: the pipeline's)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        local_source = args.source or str(work / "source")
        if not args.source:
            write_sample_corpus(local_source, n=args.n, seed=0)
        source_bytes = sum(p.stat().st_size for p in Path(local_source).rglob("*") if p.is_file())
        source = f"{PROTOCOL}://{Path(local_source).resolve()}"
        store = Store(str(work / "out"))
        cfg, val = SourceConfig(partition_size=250), ValidationConfig()

        t0 = time.perf_counter()
        _, parts = cut_partitions(source, store, cfg)
        ingested = [ingest_partition(store, p, cfg, val, 4) for p in parts]
        records = sum(m.info["records"] for m in ingested)
        ingest_s = time.perf_counter() - t0
        ingest_read = CountingFileSystem.bytes_read
        resolved: dict[int, Any] = {}
        deduplicate(store, [m.digest for m in ingested], len(ingested), 4, args.shard_size, resolved.__setitem__)
        shards = cut_staging([resolved[p].info for p in range(len(ingested))], args.shard_size)

        code_version("tasks.staging.stage")  # hashed once per worker process: not part of the throughput
        staged = [r for s in shards for r in shard_records(store, s)]
        total_bytes = sum(r["bytes"] for r in staged)
        staging_read, pairs = 0, []
        for _ in range(args.repeat):
            shutil.rmtree(work / "out" / "staging", ignore_errors=True)
            shutil.rmtree(work / "out" / "_markers" / "staging", ignore_errors=True)
            before = CountingFileSystem.bytes_read
            os.sync()  # neither side pays for writeback left by the setup (the sample corpus is not fsynced)
            shard_s, shard_cpu = timed(lambda: [write_staging_shard(store, s) for s in shards])
            staging_read = max(staging_read, CountingFileSystem.bytes_read - before)
            os.sync()  # or for the other side's deletions
            copy_s, copy_cpu = timed(lambda: raw_copy(staged, work / "raw-copy.bin"))
            (work / "raw-copy.bin").unlink()
            pairs.append((shard_s, shard_cpu, copy_s, copy_cpu))

        print(f"records: {records}, staged: {len(staged)} in {len(shards)} shards, {total_bytes / 1e6:.1f} MB; "
              f"source {source_bytes / 1e6:.1f} MB (metadata + image files)")
        print(f"ingest + hash + validate + spill: {records / ingest_s:.0f} images/s on one core ({ingest_s:.2f} s)")
        print(f"bytes read from the source: ingest {ingest_read / source_bytes:.2f}×, staging "
              f"{staging_read / source_bytes:.2f}×, build {(ingest_read + staging_read) / source_bytes:.2f}× "
              f"the source size (goal 1.0×)")
        for i, (shard_s, shard_cpu, copy_s, copy_cpu) in enumerate(pairs, 1):
            print(f"run {i}: staging shard writing {total_bytes / shard_s / 1e6:.0f} MB/s ({shard_s:.3f} s, "
                  f"CPU {shard_cpu:.3f} s); raw sequential copy {total_bytes / copy_s / 1e6:.0f} MB/s "
                  f"({copy_s:.3f} s, CPU {copy_cpu:.3f} s); ratio {copy_s / shard_s:.2f}")
        ratios = [copy_s / shard_s for shard_s, _, copy_s, _ in pairs]
        print(f"shard writing / raw copy throughput ratio: median {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} runs; goal ≥ 0.8)")
        cpu = [shard_cpu / copy_cpu for _, shard_cpu, _, copy_cpu in pairs]
        print(f"staging CPU time / raw copy CPU time (all threads; what a loaded machine makes wall time of): "
              f"median {statistics.median(cpu):.2f} (range {min(cpu):.2f}–{max(cpu):.2f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
