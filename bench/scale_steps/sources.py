"""Planning a table source and a tar (GPIC) source at scale: the "plan-inputs" task
(tasks.ingest.sources.cut_partitions), as the build runs it, on inputs of N records.

* table: ``{data}/table/metadata.parquet`` with path, caption, key and one unmapped column
  (which goes to every row's ``extra`` JSON), streamed into chunk files of
  ``partition_size`` rows. Its row groups are :data:`TABLE_BATCH` rows at every size: Arrow
  decodes a row group whole, so the reader's memory follows the input's row group, not N
  (measured at 100k rows: 53 -> 73 MB above the start with 10k- and 100k-row groups, ~0.2 KB
  per row of a row group); row groups that grew with N up to 100k made the line through the
  quick sizes project that as growth with N;
* tars: a GPIC release root (``train|val|test/gpic_{split}_NNNNN.tar``, 8:1:1) of
  N / :data:`RECORDS_PER_TAR` tars; planning lists them and stamps each from the listing
  (it never opens a tar), so the files are empty stand-ins of the real names.
"""

from __future__ import annotations

import math
import os
from typing import Any

from bench.scale import FIXED, GUARDED, INPUTS, Scale, step

RECORDS_PER_TAR = 1000
TABLE_BATCH = 10_000  # rows written at a time: one row group each, the same at every size


def _table_dir(data: str) -> str:
    return os.path.join(data, "table")


def _tars_dir(data: str) -> str:
    return os.path.join(data, "gpic")


def _out(data: str, kind: str):
    """The build output the plan writes its chunks to (one per source kind: planning prunes
    the input chunks another source left)."""
    from corpusforge.storage import Store

    return Store(os.path.join(data, f"out-{kind}"), fsync=False)


def write_table(store, sc: Scale, src: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = _table_dir(os.path.dirname(src))
    os.makedirs(folder, exist_ok=True)
    schema = pa.schema([("path", pa.string()), ("caption", pa.string()), ("key", pa.string()),
                        ("aesthetic", pa.float64())])
    with pq.ParquetWriter(os.path.join(folder, "metadata.parquet"), schema) as writer:
        for lo in range(0, sc.n, TABLE_BATCH):
            ids = range(lo, min(sc.n, lo + TABLE_BATCH))
            writer.write_table(pa.table({"path": [f"img/{i // 10_000:04d}/k{i:09d}.jpg" for i in ids],
                                         "caption": [f"caption {i}" for i in ids],
                                         "key": [f"k{i:09d}" for i in ids],
                                         "aesthetic": [(i % 1000) / 100 for i in ids]}, schema=schema))


def write_gpic(store, sc: Scale, src: str) -> None:
    root = _tars_dir(os.path.dirname(src))
    n_tars = math.ceil(sc.n / RECORDS_PER_TAR)
    for i in range(n_tars):
        split = "train" if i % 10 < 8 else "val" if i % 10 == 8 else "test"
        os.makedirs(os.path.join(root, split), exist_ok=True)
        open(os.path.join(root, split, f"gpic_{split}_{i:05d}.tar"), "wb").close()


INPUTS["table"] = write_table
INPUTS["gpic"] = write_gpic
MODULES = ("tasks.ingest.sources", "pyarrow.parquet")


@step("table_source_plan", ("table",), "task", MODULES)
def run_table_source_plan(store, sc: Scale, data: str) -> dict[str, Any]:
    """Planning a metadata table (the "plan-inputs" task): read in batches, normalised
    column by column, written as input chunks. (A rerun on the unchanged table reads back
    the chunk list instead: tests/test_source_cuts.py.)"""
    from corpusforge.contract import marker_path
    from tasks.ingest.sources import TABLE_CUTS, SourceConfig, cut_partitions

    out = _out(data, "table")
    out.remove(marker_path(TABLE_CUTS))  # planned in full, as a first run or a changed table is
    kwargs = dict(src=_table_dir(data), store=out, cfg=SourceConfig())
    kind, parts = cut_partitions(**kwargs)
    assert kind == "table" and len(parts) == sc.parts, (kind, len(parts), sc.parts)
    return {"tasks": 1, "params": [kwargs], "partitions": len(parts)}


@step("tar_source_plan", ("gpic",), "task", MODULES)
def run_tar_source_plan(store, sc: Scale, data: str) -> dict[str, Any]:
    """Planning a GPIC release root (the "plan-inputs" task): its tars listed split by split,
    each stamped from the listing, one partition each."""
    from tasks.ingest.sources import SourceConfig, cut_partitions

    kwargs = dict(src=_tars_dir(data), store=_out(data, "gpic"), cfg=SourceConfig())
    kind, parts = cut_partitions(**kwargs)
    assert kind == "tars" and len(parts) == math.ceil(sc.n / RECORDS_PER_TAR)
    return {"tasks": 1, "params": [kwargs], "partitions": len(parts)}


FIXED += ["table_source_plan", "tar_source_plan"]
GUARDED += ["table_source_plan", "tar_source_plan"]
