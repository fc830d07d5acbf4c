"""Key ranges: a sort or join over every record of a corpus, one bounded range of keys at a time.

A global step that orders every record by its key, or joins records by key (the copy of the
version a build replaces, the diff of two versions), needs all rows of a key together and
its output in key order. One DuckDB query over every row needs more memory as the rows grow,
even under its memory limit (its scan of many files, its sort and its window functions:
bench/results/scale-31rp-duckdb.txt). Here the rows are split by ranges of the key so that
each range holds about ``rows_per_range`` rows of all the tables together, and the ranges
come in key order: the caller sorts and joins each one on its own and appends the results,
which is the whole query's output.

A split takes boundaries from a strided sample of the keys and writes each table's rows to
one local Arrow stream per range in one pass; a range still too big is split again the same
way. At most ``fan_out`` streams are open at once, so N rows take
``ceil(log_fan_out(2 N / rows_per_range))`` passes: one up to 2.1M rows with the
defaults, two up to 537M. Every row of one key lies in one range, so the rows of one
key (and the rows with no key, a range of their own) are never split: a key held by more
rows than a range is what this does not bound.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpusforge.storage import Store

ROWS_PER_RANGE = 16_384  # rows of all the tables in one range at most (unless one key holds more)
FAN_OUT = 256  # ranges one split writes at most: the streams open at once
SAMPLE_PER_RANGE = 32  # keys sampled per range a split makes
READ_ROWS = 8_192  # rows read at a time
READ_BUFFER = 1 << 20  # bytes of a column read at a time (not a whole row group's)


@dataclass(frozen=True)
class Table:
    """A table's parquet files in a store, read by key range: the columns of ``schema``, which
    holds the column the ranges are by (``key`` unless :func:`key_ranges` is told another)."""

    store: Store
    files: list[str]  # relative to the store's root
    schema: pa.Schema


@dataclass(frozen=True)
class _Part:
    """One table's rows in one range: its parquet files (before any split) or a local stream."""

    schema: pa.Schema
    rows: int
    table: Table | None = None
    stream: str | None = None

    def batches(self, key_only: str | None = None) -> Iterator[pa.RecordBatch]:
        """Its rows (``key_only``: at least that column)."""
        if self.stream is not None:
            with pa.OSFile(self.stream, "rb") as f:
                yield from pa.ipc.open_stream(f)
            return
        assert self.table is not None
        schema = pa.schema([self.schema.field(key_only)]) if key_only else self.schema
        for rel in self.table.files:
            with self.table.store.open(rel) as f:
                file = pq.ParquetFile(f, buffer_size=READ_BUFFER)
                for group in range(file.num_row_groups):
                    for batch in file.iter_batches(batch_size=READ_ROWS, row_groups=[group], columns=schema.names,
                                                   use_threads=False):
                        yield batch.select(schema.names).cast(schema)
                    # what reading a row group took goes back: else the next one's can come on top of it
                    pa.default_memory_pool().release_unused()

    def read(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches()), schema=self.schema)

    def remove(self) -> None:
        if self.stream is not None:
            os.remove(self.stream)


def key_ranges(tables: dict[str, Table], rows_per_range: int = ROWS_PER_RANGE, fan_out: int = FAN_OUT,
               nulls_first: bool = False, key: str = "key") -> Iterator[dict[str, pa.Table]]:
    """The rows of every table (by name), one range of keys at a time, the ranges in key order
    (``key``: any type Python orders). Rows with a null key are a range of their own (unless all
    fit in one), first with ``nulls_first``, else last, as the caller's sort puts them. Splits are
    written under a local temporary folder, removed when the iteration ends."""
    top = {name: _Part(t.schema, _parquet_rows(t), table=t) for name, t in tables.items()}
    with tempfile.TemporaryDirectory(prefix="corpusforge-ranges-") as spill:
        yield from _ranges(top, spill, rows_per_range, fan_out, nulls_first, key)


def _parquet_rows(table: Table) -> int:
    rows = 0
    for rel in table.files:
        with table.store.open(rel) as f:
            rows += pq.ParquetFile(f).metadata.num_rows
    return rows


def _ranges(parts: dict[str, _Part], spill: str, rows_per_range: int, fan_out: int,
            nulls_first: bool, key: str) -> Iterator[dict[str, pa.Table]]:
    """The ranges of ``parts`` in key order (the null keys split off at the first split: none
    is left in a range below it)."""
    rows = sum(p.rows for p in parts.values())
    bounds = (_boundaries(parts, min(fan_out, math.ceil(2 * rows / rows_per_range)), key) if rows > rows_per_range
              else [])
    if not bounds:  # small enough, or one key: one range
        yield from _whole(parts)
        return
    *split, nulls = _split(parts, bounds, spill, key)
    if nulls_first:
        yield from _whole(nulls)
    for sub in split:
        yield from _ranges(sub, spill, rows_per_range, fan_out, nulls_first, key)
    if not nulls_first:
        yield from _whole(nulls)


def _whole(parts: dict[str, _Part]) -> Iterator[dict[str, pa.Table]]:
    """``parts`` as one range, when it holds a row; its streams removed after."""
    if sum(p.rows for p in parts.values()):
        yield {name: p.read() for name, p in parts.items()}
    for p in parts.values():
        p.remove()
    pa.default_memory_pool().release_unused()


def _boundaries(parts: dict[str, _Part], ranges: int, key: str) -> list[Any]:
    """Up to ``ranges - 1`` keys that cut the rows into ranges of about equal size: quantiles of
    every ``stride``-th key. All are above the smallest key sampled, so the first range and the
    last both hold rows, and each range is smaller than the whole (no empty list: one key)."""
    total = sum(p.rows for p in parts.values())
    stride = max(1, total // (ranges * SAMPLE_PER_RANGE))
    sample: list[Any] = []
    seen = 0
    for part in parts.values():
        for batch in part.batches(key_only=key):
            first = (-seen) % stride
            keys = batch.column(key).slice(first)[::stride] if first < batch.num_rows else None
            if keys is not None:
                sample += [k for k in keys.to_pylist() if k is not None]
            seen += batch.num_rows
    sample.sort()
    if not sample:
        return []
    return sorted({sample[i * len(sample) // ranges] for i in range(1, ranges)} - {sample[0]})


def _split(parts: dict[str, _Part], bounds: list[Any], spill: str, key: str) -> list[dict[str, _Part]]:
    """The rows of ``parts`` in ``len(bounds) + 1`` ranges (range i: keys from ``bounds[i-1]``
    up to ``bounds[i]``), then a last of the null keys; each table's rows in one pass, a local
    Arrow stream per range."""
    folder = tempfile.mkdtemp(dir=spill)
    edges = np.array(bounds, dtype=object)
    n = len(bounds) + 2  # the ranges, then the null keys
    out: list[dict[str, _Part]] = [{} for _ in range(n)]
    for name, part in parts.items():
        paths = [os.path.join(folder, f"{name}-{i}.arrow") for i in range(n)]
        counts = np.zeros(n, dtype=np.int64)
        with contextlib.ExitStack() as stack:
            writers = [stack.enter_context(pa.ipc.new_stream(stack.enter_context(pa.OSFile(p, "wb")), part.schema))
                       for p in paths]
            for batch in part.batches():
                keys = batch.column(key)
                which = np.full(batch.num_rows, n - 1, dtype=np.int64)
                valid = pc.is_valid(keys).to_numpy(zero_copy_only=False)
                which[valid] = np.searchsorted(edges, keys.filter(valid).to_numpy(zero_copy_only=False), side="right")
                order = np.argsort(which, kind="stable")
                ordered = batch.take(pa.array(order))
                sizes = np.bincount(which, minlength=n)
                start = 0
                for i in np.flatnonzero(sizes):
                    writers[i].write_batch(ordered.slice(start, sizes[i]))
                    start += sizes[i]
                counts += sizes
        part.remove()
        for i in range(n):
            out[i][name] = _Part(part.schema, int(counts[i]), stream=paths[i])
    return out
