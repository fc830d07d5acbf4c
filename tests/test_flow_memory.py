"""The flow process only coordinates (docs/architecture.md): what it holds grows with the
shards, a few hundred bytes each, never with the records, and no unit's result is kept in a
list for the whole build.

The build driver (``flows.build_corpus.build``) runs on real inputs at two sizes under
tracemalloc, with every unit run here by a fan-out that leaves the unit's own allocations
out of the peak (a task's memory is a worker's, not the flow's): what is measured is what
the flow allocates and holds between units, including each unit's result once returned.
Partitions, staging shards and release shards hold eight records each, so a few hundred
records give tens of shards, and a flow holding ~200 bytes or more per record fails the bound
as surely as one holding each unit's result (the old flow: 3.7 KB a shard). The ledgers and
marker reads work in windows of a few units here (instead of a thousand), so that these sizes
show the regime of a build of 10⁸ images, where a window is a small part of the whole. At 10⁸
images (3·10⁵ partitions and shards at the defaults) the bound is 0.15 GB.

The peak is taken at each unit's start: it covers the flow up to the last unit it submits.
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import tracemalloc
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import corpusforge.contract
import corpusforge.ledger
import flows.build_corpus
from corpusforge.contract import Unit, tree_reduce

PER = 8  # records per partition, staging shard and release shard
SIZES = (64, 192)  # records: 8 and 24 partitions
WINDOW = 4  # units per ledger file and read batch, markers read at once
BOUND = 512  # bytes the flow may hold per shard (partition, staging shard, release shard)


class FlowOnly:
    """A fan-out that runs each unit here, one after the other, and measures the flow's peak
    between units: after each unit returns, the cyclic garbage it left is collected and the
    traced peak reset, so a unit's transient allocations never count (the report's figures
    leave matplotlib cycles behind, ~10 KB a shard, that a worker would free), but its result,
    and all the flow keeps, do."""

    def __init__(self) -> None:
        self.peak = 0

    def _run(self, unit: Unit, kwargs: dict[str, Any]) -> Any:
        self.peak = max(self.peak, tracemalloc.get_traced_memory()[1])
        result = unit.fn(**kwargs)
        gc.collect()
        tracemalloc.reset_peak()
        return result

    def __call__(self, unit: Unit, calls: list[dict[str, Any]]) -> list[Any]:
        return [self._run(unit, c) for c in calls]

    def stream(self, unit: Unit, calls: list[dict[str, Any]], sink: Any) -> None:
        for i, kwargs in enumerate(calls):
            sink(i, self._run(unit, kwargs))

    def each(self, units: list[tuple[Unit, dict[str, Any]]]) -> list[Any]:
        return [self._run(u, kwargs) for u, kwargs in units]

    def reduce(self, unit: Unit, merge: Unit, calls: list[dict[str, Any]]) -> Any:
        return tree_reduce([self._run(unit, c) for c in calls], lambda a, b: self._run(merge, dict(a=a, b=b)))


def _source(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray((np.random.default_rng(i).random((8, 8, 3)) * 255).astype("uint8")).save(buf, "PNG")
        (folder / f"{i:05d}.png").write_bytes(buf.getvalue())
        rows.append({"path": f"{i:05d}.png", "caption": f"caption {i}"})
    pq.write_table(pa.Table.from_pylist(rows), folder / "metadata.parquet")
    return folder / "metadata.parquet"


def _config(source: Path, out: Path) -> flows.build_corpus.BuildConfig:
    return flows.build_corpus.BuildConfig.model_validate({
        "source": str(source), "out": str(out), "input": {"partition_size": PER}, "staging": {"shard_size": PER},
        "splits": {"shard_size": PER, "val": 0.1, "test": 0.1}, "validation": {"min_side": 1},
        "features": {"models": []}, "near_dedup": None, "eval_captions": None, "licenses": None})


def _flow_peak(tmp_path: Path, n: int) -> tuple[int, int]:
    """(the flow's peak traced bytes above its start, shards) of a fresh build of ``n`` records."""
    config = _config(_source(tmp_path / f"src{n}", n), tmp_path / f"out{n}")
    fan_out = FlowOnly()
    flows.build_corpus.fan_out = fan_out
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = flows.build_corpus.build(config)
        peak = fan_out.peak - start
    finally:
        tracemalloc.stop()
    work = result["work"]
    shards = sum(sum(work[s].values()) for s in ("ingest", "staging")) + sum(work["publish"]["release_shards"].values())
    return peak, shards


def _peaks(tmp: str) -> list[tuple[int, int]]:
    """The two sizes' (peak, shards), in a fresh process: tracemalloc traces every thread, and
    those an earlier test left running in the suite's process (a Prefect client's, a
    cluster's) would be counted as the flow's."""
    corpusforge.ledger.BATCH_ROWS = WINDOW
    corpusforge.contract.MARKER_WINDOW = WINDOW
    flows.build_corpus.build(_config(_source(Path(tmp) / "warm", 2 * PER), Path(tmp) / "warm-out"))  # imports, caches
    return [_flow_peak(Path(tmp), n) for n in SIZES]


@pytest.mark.integration  # one worker process of its own
def test_the_flow_holds_a_few_hundred_bytes_per_shard_and_nothing_per_record(tmp_path):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        (p1, s1), (p2, s2) = pool.submit(_peaks, str(tmp_path)).result()
    per_shard = (p2 - p1) / (s2 - s1)
    print(f"flow peak {p1 / 1e6:.2f} MB ({s1} shards), {p2 / 1e6:.2f} MB ({s2} shards): {per_shard:.0f} B a shard")
    assert s2 - s1 >= 40, (s1, s2)
    assert per_shard <= BOUND, f"the flow holds {per_shard:.0f} bytes per shard (bound {BOUND})"


def test_a_ledger_gives_back_results_in_unit_order_and_markers_are_read_in_order(tmp_path, monkeypatch):
    """Results that finish out of order come back in unit order, from several files, as often as
    read; marker reads keep the order of their paths and name the first one missing."""
    from corpusforge.contract import SKIPPED, UnitResult, finish_unit, require_markers
    from corpusforge.ledger import Ledger
    from corpusforge.storage import Store

    monkeypatch.setattr(corpusforge.ledger, "BATCH_ROWS", 3)
    monkeypatch.setattr(corpusforge.contract, "MARKER_WINDOW", 3)
    store = Store(str(tmp_path / "out"), fsync=False)
    markers = [finish_unit(store, f"work/x/{i:02d}", f"fp{i}", {f"work/x/{i:02d}": f"{i:064x}"}, {"part": i})
               for i in range(10)]
    with Ledger(store, "x") as ledger:
        for i in (3, 0, 9, 1, 2, 8, 4, 7, 6, 5):
            ledger.add(i, UnitResult.of(markers[i], SKIPPED))
    assert len(store.listdir("work/ledger/x")) == 4
    assert list(ledger.infos()) == list(ledger.infos()) == [{"part": i} for i in range(10)]
    assert list(ledger.digests()) == [m.digest for m in markers]
    assert [r.fingerprint for r in ledger] == [f"fp{i}" for i in range(10)]
    assert ledger.summary("x").counts() == {"computed": 0, "skipped": 10}

    rels = [f"work/x/{i:02d}" for i in (7, 2, 9, 0, 5)]
    assert [m.info["part"] for m in require_markers(store, rels, "x")] == [7, 2, 9, 0, 5]
    with pytest.raises(FileNotFoundError, match="work/x/11 is not complete"):
        list(require_markers(store, [*rels, "work/x/11", "work/x/12"], "x"))
