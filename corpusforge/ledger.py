"""The unit results of a fan-out, streamed to parquet as units finish, never held in a list.

A fan-out over every partition or shard returns one result per unit (its marker: output
hashes, fingerprint parts, the facts its stage reports): a few KB each, so about 2 GB at
10⁸ images for ingest, resolve and manifest alone if the flow process kept them for the
whole build. A :class:`Ledger` is the sink such a fan-out hands each result to
(:meth:`corpusforge.contract.FanOut.stream`): it counts the actions, buffers a few rows and
writes them to ``work/ledger/{fan-out}/{n}.parquet``. The flow then reads back, in unit
order and a window at a time, only what it needs (the digests a later unit is keyed by,
the facts the staging cuts or the receipt sums), through DuckDB, which sorts out of core.

The ledger is work state of one run (``work/`` is outside every output hash): each run
rewrites it, and nothing a unit writes depends on it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import pyarrow as pa

from corpusforge.contract import COMPUTED, SKIPPED, Marker, StageSummary, UnitResult
from corpusforge.hashing import canonical_json
from corpusforge.layout import ledger_dir, ledger_path
from corpusforge.outofcore import spilling_duckdb
from corpusforge.storage import Store

# Rows buffered before they are written as one file, and read back per batch: what the
# flow process holds of a ledger at once (a row is one unit's marker, ~1-3 KB as JSON).
BATCH_ROWS = 1024
READ_MEMORY = "256MB"  # DuckDB's limit while it sorts a ledger back into unit order

LEDGER_SCHEMA = pa.schema([
    ("unit", pa.int64()),        # the index of the unit's call in the fan-out
    ("action", pa.string()),     # computed | skipped
    ("digest", pa.string()),     # the marker's digest
    ("result", pa.string()),     # canonical JSON of the marker
])

T = TypeVar("T")


class Ledger:
    """The results of one fan-out (``name``: its folder under ``work/ledger``). Use it as the
    fan-out's sink (:meth:`add`), close it (``with``), then read: :meth:`summary` from the
    counts kept here, and :meth:`infos`, :meth:`digests` or the results themselves
    (iterating the ledger) from the files, in unit order."""

    def __init__(self, store: Store, name: str) -> None:
        self.store, self.name = store, name
        self._rows: list[tuple[int, str, str, str]] = []
        self._files: list[str] = []
        self._actions: Counter[str] = Counter()
        self._open = True
        store.remove(ledger_dir(name))  # an earlier run's

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, unit: int, result: UnitResult[Any]) -> None:
        """Record unit ``unit``'s result."""
        if not self._open:
            raise RuntimeError(f"ledger {self.name} is closed")
        self._actions[result.action] += 1
        self._rows.append((unit, result.action, result.digest, canonical_json(result.to_json())))
        if len(self._rows) >= BATCH_ROWS:
            self._flush()

    def close(self) -> None:
        """Write the rows still buffered; the ledger is then read-only."""
        if self._open:
            self._flush()
            self._open = False

    def _flush(self) -> None:
        if not self._rows:
            return
        rel = ledger_path(self.name, len(self._files))
        columns = list(zip(*self._rows, strict=True))
        self.store.write_parquet(rel, pa.Table.from_arrays([pa.array(c, f.type) for c, f in
                                                            zip(columns, LEDGER_SCHEMA, strict=True)],
                                                           schema=LEDGER_SCHEMA))
        self._files.append(rel)
        self._rows = []

    # ---- reads (after close) -----------------------------------------------------------
    def __len__(self) -> int:
        return sum(self._actions.values())

    def summary(self, stage: str) -> StageSummary:
        """Units computed and skipped (from the counts kept while writing: nothing is read)."""
        return StageSummary(stage, self._actions[COMPUTED], self._actions[SKIPPED])

    def __iter__(self) -> Iterator[UnitResult[Any]]:
        """Every unit's result, in unit order, as the fan-out returned it."""
        for action, result in self._read("action", "result"):
            yield UnitResult.of(Marker.from_json(json.loads(result)), action)

    def infos(self) -> Column[Any]:
        """Each unit's marker ``info`` in unit order (its stage's TypedDict), readable more than once."""
        return Column(self, lambda: (r.info for r in self))

    def digests(self) -> Column[str]:
        """Each unit's marker digest in unit order, readable more than once."""
        return Column(self, lambda: (d for (d,) in self._read("digest")))

    def _read(self, *columns: str) -> Iterator[tuple[Any, ...]]:
        if self._open:
            raise RuntimeError(f"ledger {self.name} is read before it is closed")
        if not self._files:
            return
        files = ", ".join("'" + self.store.path(rel).replace("'", "''") + "'" for rel in self._files)
        with spilling_duckdb(READ_MEMORY, self.store) as con:
            query = f"SELECT {', '.join(columns)} FROM read_parquet([{files}]) ORDER BY unit"
            for batch in con.sql(query).to_arrow_reader(BATCH_ROWS):
                yield from zip(*(batch.column(c).to_pylist() for c in columns), strict=True)


class Column(Generic[T]):
    """One field of every unit of a ledger, in unit order: each iteration reads it again
    (so a consumer may sum over it more than once), and ``len`` needs no read."""

    def __init__(self, ledger: Ledger, read: Callable[[], Iterator[T]]) -> None:
        self._ledger, self._read = ledger, read

    def __len__(self) -> int:
        return len(self._ledger)

    def __iter__(self) -> Iterator[T]:
        return iter(self._read())
