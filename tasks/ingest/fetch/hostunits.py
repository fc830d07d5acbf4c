"""The fetch stage's units, cut by host, so that one unit owns a host's politeness (issue 33).

One planning unit on the engine reads the input cut (pinned by its SHA-256, so its parameters
stay a few names and digests at any partition count), keeps the rows that would be requested
(:func:`~tasks.ingest.fetch.unit.before_request` refuses the others) and cuts them into host
units. The kept rows are spilled to a scratch folder and grouped by DuckDB out of core: the
planner holds one partition's rows, one host unit's rows and the hosts' counts, never the whole
list. The cutting rule and the files: docs/fetch.md (the stage and its files); the ingest
partitions are not touched.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.contract import Unit, read_marker, read_pinned, step_call
from corpusforge.outofcore import spilling_duckdb
from corpusforge.storage import Store
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.unit import before_request, host_of, row_sha1
from tasks.ingest.files import (FETCH_PARTS_PER_ROW_GROUP, FETCH_PLAN, FETCH_PLAN_SCHEMA, FETCH_UNIT_SCHEMA,
                                fetch_unit_path, input_path)
from tasks.ingest.licenses import LicenseConfig
from tasks.ingest.sources import TABLE_CUTS

class HostUnits(TypedDict):
    """The planning unit's result: each host unit file's SHA-256, in unit order, and the counts."""

    units: list[str]
    urls: int
    hosts: int


DUCKDB_MEMORY = "512MB"  # beyond this DuckDB sorts on disk (the scratch folder)
BATCH_ROWS = 65_536


def input_cut_sha256(store: Store) -> str:
    """The SHA-256 of the input cut in ``store`` (its marker's: the cut was just planned), which
    names every partition's chunk digest: the planning unit's one input."""
    marker = read_marker(store, TABLE_CUTS)
    if marker is None:
        raise FileNotFoundError(f"{store.path(TABLE_CUTS)}: the URL list's input cut is not marked done")
    return marker.outputs[TABLE_CUTS]


def _cut_indexes(store: Store, cut_sha256: str) -> list[int]:
    """The partition indexes of the input cut whose SHA-256 is ``cut_sha256``."""
    listed = pq.read_table(io.BytesIO(read_pinned(store, TABLE_CUTS, cut_sha256, "fetch planning")))
    return listed.column("index").to_pylist()


def _spill_requests(store: Store, cut_sha256: str, lic: LicenseConfig | None, folder: Path) -> None:
    """Each partition's rows that would be requested, one file per partition (one in memory at a time)."""
    for part in _cut_indexes(store, cut_sha256):
        wanted = [{"part": part, "row": i, "url": meta["url"], "sha1": row_sha1(meta), "host": host_of(meta)}
                  for i, meta in enumerate(store.read_parquet(input_path(part)).to_pylist())
                  if before_request(meta, lic) is None]
        if wanted:
            pq.write_table(pa.Table.from_pylist(wanted, schema=FETCH_UNIT_SCHEMA), folder / f"{part:06d}.parquet")


def host_assignment(counts: list[tuple[str | None, int]], cap: int) -> tuple[list[tuple[str, int, bool]], int]:
    """Each host's first unit and whether it is cut (more than ``cap`` URLs: units of its own, ``cap``
    URLs each); smaller hosts are packed, in the order given, into units of up to ``cap``. Returns
    (host key, first unit, cut) per host ('' keys URLs without a usable host) and the unit count."""
    assigned, unit, fill = [], 0, 0
    for host, n in counts:
        if n > cap:
            unit, fill = unit + (fill > 0), 0
            assigned.append((host or "", unit, True))
            unit += -(-n // cap)
        else:
            if fill + n > cap:
                unit, fill = unit + 1, 0
            assigned.append((host or "", unit, False))
            fill += n
    return assigned, unit + (fill > 0)


def plan_host_units(store: Store, cut_sha256: str, lic: LicenseConfig | None, unit_urls: int) -> HostUnits:
    """Write the host units of the input cut ``cut_sha256`` (see the module docstring); their
    SHA-256s and counts."""
    with tempfile.TemporaryDirectory(prefix="corpusforge-fetch-plan-") as tmp:
        spill = Path(tmp) / "rows"
        spill.mkdir()
        _spill_requests(store, cut_sha256, lic, spill)
        if not any(spill.iterdir()):
            store.write_parquet(FETCH_PLAN, FETCH_PLAN_SCHEMA.empty_table())
            return {"units": [], "urls": 0, "hosts": 0}
        with spilling_duckdb(DUCKDB_MEMORY) as db:
            db.execute(f"CREATE VIEW rows AS SELECT *, coalesce(host, '') AS hkey "
                       f"FROM read_parquet('{spill}/*.parquet')")
            counts = db.execute("SELECT host, count(*) FROM rows GROUP BY host ORDER BY host NULLS LAST").fetchall()
            hosts, n_units = host_assignment(counts, unit_urls)
            assignment = pa.table({"hkey": [h for h, _, _ in hosts], "first_unit": [u for _, u, _ in hosts],
                                   "cut": [c for _, _, c in hosts]})
            db.register("assignment", assignment)
            db.execute(f"""CREATE TABLE assigned AS SELECT r.part, r.row, r.url, r.sha1, r.host,
                CAST(a.first_unit + CASE WHEN a.cut THEN (row_number() OVER (PARTITION BY r.hkey ORDER BY r.part, r.row)
                     - 1) // {int(unit_urls)} ELSE 0 END AS INTEGER) AS unit
                FROM rows r JOIN assignment a USING (hkey)""")
            routes = db.sql("SELECT DISTINCT part, unit FROM assigned ORDER BY part, unit").to_arrow_table()
            labels = [part // FETCH_PARTS_PER_ROW_GROUP for part in routes.column("part").to_pylist()]
            store.write_parquet(FETCH_PLAN, routes.cast(FETCH_PLAN_SCHEMA), row_groups=labels)
            shas = _write_units(store, db.sql("SELECT unit, part, row, url, sha1, host FROM assigned "
                                                  "ORDER BY unit, host NULLS LAST, part, row")
                                .to_arrow_reader(BATCH_ROWS))
    if len(shas) != n_units:
        raise AssertionError(f"{len(shas)} host units written for {n_units} planned")
    return {"units": shas, "urls": sum(n for _, n in counts), "hosts": sum(h is not None for h, _ in counts)}


def _write_units(store: Store, batches: pa.RecordBatchReader) -> list[str]:
    """One file per unit from ``batches`` sorted by unit (at most one unit's rows held)."""
    shas: list[str] = []
    held: list[pa.Table] = []

    def flush() -> None:
        table = pa.concat_tables(held).drop_columns(["unit"]).cast(FETCH_UNIT_SCHEMA)
        shas.append(store.write_parquet(fetch_unit_path(len(shas)), table))
        held.clear()

    for batch in batches:
        table = pa.Table.from_batches([batch])
        units = table.column("unit").to_pylist()
        start = 0
        for end in range(1, len(units) + 1):
            if end == len(units) or units[end] != units[start]:
                if held and held[0].column("unit")[0].as_py() != units[start]:
                    flush()
                held.append(table.slice(start, end - start))
                start = end
    if held:
        flush()
    return shas


PLAN_HOST_UNITS = Unit(plan_host_units, "plan-host-units")


def plan_host_units_call(store: Store, cut_sha256: str, cfg: FetchConfig, lic: LicenseConfig | None
                         ) -> dict[str, Any]:
    """The planning unit's call (``keyed(PLAN_HOST_UNITS)``), keyed by the input cut's SHA-256 (so by
    every partition's chunk digest), the licence allow-list and ``fetch.unit_urls``: a rerun with
    none changed runs nothing. Its parameters are O(1): the task reads the cut itself."""
    config = [lic.model_dump(mode="json") if lic else None, cfg.unit_urls]
    return step_call(store, PLAN_HOST_UNITS, config, [cut_sha256],
                     dict(store=store, cut_sha256=cut_sha256, lic=lic, unit_urls=cfg.unit_urls), (FETCH_PLAN,))
