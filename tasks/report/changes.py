"""What changed between two versions of a corpus: records, release shards, licences, statistics.

A record is identified by its key, its source path relative to its version's source root
(:func:`source_prefix`: a source moved from a disk to S3 changes no record) and, for rows
equal in both, its occurrence among them in input order. Between the old and the new version each record is
**added**, **removed** or **changed** in its fate (status), reason, split, release shard,
caption (as released) or image bytes (SHA-256). ``changes.parquet`` lists every one
(ordered by key, source path, occurrence), ``CHANGES.md`` counts them, lists the first
ones, and adds the release shards rewritten, added and removed (from the versions' output
lists, ``receipt_outputs.parquet``), the change in licence counts and, when the statistics changed, their provenance.

Both versions' rows are compared one range of keys at a time (:mod:`corpusforge.key_ranges`):
each range's records are built, joined and sorted by DuckDB, and the ranges come in key
order, so a task's memory stays the same at any size of corpus; rows stream from DuckDB into
the parquet writer in row groups of a fixed size, whose fixed settings make the file
deterministic.

Each build keeps its version's records (``work/previous/``, :func:`keep_previous_version`)
when it ends, and a build into a root whose version is not the one kept keeps it before
anything is replaced; the next build compares its version with that copy and writes both
files beside it (:func:`diff_versions`; :func:`same_version_account` when the two are one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict

import pyarrow as pa

from corpusforge.contract import Unit, must_compute
from corpusforge.key_ranges import Table, key_ranges
from corpusforge.layout import MANIFEST_DIR, MANIFEST_SCHEMA, RESOLVED_SCHEMA, TABLE_SUFFIXES
from tasks.ingest.files import RESOLVED_DIR
from tasks.release.files import RELEASE_DIR, RELEASE_ASSIGNMENT_DIR, RELEASE_ASSIGNMENT_SCHEMA
from tasks.report.files import (CHANGES_MD, CHANGES_SCHEMA, CHANGES_TABLE, PREVIOUS_DIR, PREVIOUS_OUTPUTS,
                                PREVIOUS_RECEIPT, PREVIOUS_RECORDS, RECEIPT, RECEIPT_OUTPUTS)
from corpusforge.outofcore import spilling_duckdb
from corpusforge.storage import PARQUET_WRITE_OPTIONS, Store

FIELDS = ("status", "reason", "split", "shard", "caption", "sha256")
RECORD_COLUMNS = ("key", "source_path", "occurrence", *FIELDS)
RECORD_SCHEMA = pa.schema([CHANGES_SCHEMA.field(c) for c in ("key", "source_path", "occurrence")]
                          + [pa.field(c, pa.string()) for c in FIELDS])
LISTED = 50  # records listed per kind of change in CHANGES.md (changes.parquet has them all)
BATCH_ROWS = PARQUET_WRITE_OPTIONS["row_group_size"]  # rows of a row group of both files
FETCH_ROWS = 8_192  # rows DuckDB hands over at a time (it sizes each batch's buffers for this many)
# The columns a version's records are built from (key: every table is read by ranges of it).
_MANIFEST = pa.schema([MANIFEST_SCHEMA.field(c) for c in ("key", "source_path", "part", "row", "status", "reason",
                                                          "split", "shard", "sha256")])
_ASSIGNMENTS = pa.schema([RELEASE_ASSIGNMENT_SCHEMA.field(c) for c in ("key", "caption")])
_INPUTS = pa.schema([RESOLVED_SCHEMA.field(c) for c in ("key", "part", "row", "caption")])


def _files(store: Store, folder: str) -> list[str]:
    """Every parquet file under ``folder`` (recursively), relative to the store's root."""
    root = store.fs._strip_protocol(store.path(folder))
    if not store.fs.exists(root):
        return []
    base = store.fs._strip_protocol(store.path(""))
    return sorted(p[len(base) + 1:] for p in store.fs.find(root) if p.endswith(".parquet") and "/." not in p)


def source_prefix(receipt: dict[str, Any]) -> str:
    """What every source path of a version starts with: its source folder, or the folder of
    its metadata table (where the table's relative paths are resolved), with a slash."""
    source = str(receipt.get("source") or "").rstrip("/")
    if source.endswith(TABLE_SUFFIXES):
        source = source.rsplit("/", 1)[0]
    return f"{source}/" if source else ""


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _version_tables(store: Store, side: str) -> dict[str, Table]:
    """The tables a version's records are built from, named ``{side}_manifest``,
    ``{side}_plans`` and ``{side}_inputs`` (the resolved partitions)."""
    manifest = _files(store, MANIFEST_DIR)
    if not manifest:
        raise FileNotFoundError(f"{store.path(MANIFEST_DIR)}: no manifest (not a finished corpus version)")
    return {f"{side}_manifest": Table(store, manifest, _MANIFEST),
            f"{side}_plans": Table(store, _files(store, RELEASE_ASSIGNMENT_DIR), _ASSIGNMENTS),
            f"{side}_inputs": Table(store, _files(store, RESOLVED_DIR), _INPUTS)}


def records_query(side: str, prefix: str) -> str:
    """SQL for a version's records in one range of keys (the tables of :func:`_version_tables`):
    manifest rows with their caption (the captioning stage's for a released record it
    captioned, else the input's, from the resolved partitions), and their source path relative
    to the version's source root ``prefix``."""
    prefix = _sql_text(prefix)
    relative = (f"(SELECT * REPLACE (CASE WHEN starts_with(source_path, {prefix}) AND length({prefix}) > 0 "
                f"THEN substr(source_path, length({prefix}) + 1) ELSE source_path END AS source_path) "
                f"FROM {side}_manifest)")
    return f"""
        SELECT m.key, m.source_path,
               row_number() OVER (PARTITION BY m.key, m.source_path ORDER BY m.part, m.row) AS occurrence,
               m.status, m.reason, m.split, m.shard, coalesce(c.caption, r.caption) AS caption, m.sha256
        FROM {relative} m
        LEFT JOIN {side}_inputs r ON r.part = m.part AND r.row = m.row
        LEFT JOIN (SELECT key, caption FROM {side}_plans WHERE caption IS NOT NULL) c
               ON m.status = 'kept' AND c.key = m.key"""


class _RowGroups:
    """Batches written as one parquet file in row groups of ``BATCH_ROWS`` rows, each column of a
    row group one array, however the batches come: the file is the same for the same rows.

    The rows wait as each column's arrays, and a row group is made one column at a time, so
    that making it holds its rows about once, not twice."""

    def __init__(self, write: Callable[[pa.Table], None], schema: pa.Schema):
        self.write, self.schema = write, schema
        self.columns: list[list[pa.Array]] = [[] for _ in schema]
        self.rows = 0

    def add(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            for held, column in zip(self.columns, batch.cast(self.schema).columns, strict=True):
                held.append(column)
            self.rows += batch.num_rows
            while self.rows >= BATCH_ROWS:
                self._flush(BATCH_ROWS)

    def close(self) -> None:
        if self.rows:
            self._flush(self.rows)

    def _flush(self, rows: int) -> None:
        group = []
        for i, held in enumerate(self.columns):
            head, taken = [], 0
            while taken < rows:
                chunk = held.pop(0)
                if taken + len(chunk) > rows:
                    held.insert(0, chunk.slice(rows - taken))
                    chunk = chunk.slice(0, rows - taken)
                head.append(chunk)
                taken += len(chunk)
            group.append(pa.concat_arrays(head))
            del head
        self.rows -= rows
        self.write(pa.Table.from_arrays(group, schema=self.schema))
        del group
        pa.default_memory_pool().release_unused()  # else the next row group can come on top of this one's


@contextlib.contextmanager
def _parquet_writer(store: Store, rel: str, schema: pa.Schema) -> Iterator[_RowGroups]:
    """Row groups written to ``rel`` (atomically, with the fixed writer settings)."""
    with store.write_row_groups(rel, schema) as write:
        groups = _RowGroups(write, schema)
        yield groups
        groups.close()


def _register(con: Any, tables: dict[str, pa.Table]) -> None:
    for name, table in tables.items():
        con.register(name, table)


def keep_previous_version(store: Store, memory_limit: str = "2GB") -> bool:
    """Keep the records and receipt of the version ``store`` holds, for the account of what the
    next build changes. A build keeps its own version when it ends, so the next one finds it
    kept (no task run); at its start it keeps the root's version only where that is not the
    one kept (a build killed after its receipt, a root whose copy was removed).

    Only a finished version counts (its receipt and manifest are there); a build killed and rerun keeps
    the copy it made first (the receipt it copied is still the root's). Returns whether a
    version is kept. ``memory_limit``: DuckDB's, for one range of keys."""
    if not (store.exists(RECEIPT) and _files(store, MANIFEST_DIR)):
        if not store.exists(PREVIOUS_DIR):  # a new root: nothing to keep nor to remove
            return False
        must_compute()
        store.remove(PREVIOUS_DIR)
        return False
    receipt = store.read_bytes(RECEIPT)
    if store.exists(PREVIOUS_RECEIPT) and store.read_bytes(PREVIOUS_RECEIPT) == receipt:
        return True
    must_compute()  # probed by the flow: a copy already made (every rebuild's but the first) is no task run
    store.remove(PREVIOUS_RECEIPT)
    if store.exists(RECEIPT_OUTPUTS):
        store.write_bytes(PREVIOUS_OUTPUTS, store.read_bytes(RECEIPT_OUTPUTS))
    else:
        store.remove(PREVIOUS_OUTPUTS)
    query = records_query("v", source_prefix(json.loads(receipt))) + " ORDER BY 1, 2, 3"
    with spilling_duckdb(memory_limit) as con, _parquet_writer(store, PREVIOUS_RECORDS, RECORD_SCHEMA) as out:
        for tables in key_ranges(_version_tables(store, "v")):  # null keys last, as ORDER BY puts them
            _register(con, tables)
            out.add(con.sql(query).to_arrow_reader(FETCH_ROWS))
    store.write_bytes(PREVIOUS_RECEIPT, receipt)  # last: the copy is whole
    return True


class ChangesSummary(TypedDict):
    """What :func:`diff_versions` found (rendered as CHANGES.md, kept in its step's marker)."""

    records: dict[str, int]  # added, removed, changed, unchanged
    changed_fields: dict[str, int]
    listed: dict[str, list[dict[str, Any]]]  # the first records of each kind of change
    release_shards: dict[str, list[str]]
    licenses: dict[str, list[int]]  # kept records per licence, old and new, where they differ
    statistics: dict[str, Any] | None


def diff_versions(old: Store, new: Store, out: Store, previous_kept: bool = False,
                  memory_limit: str = "2GB") -> ChangesSummary:
    """Compare two versions; write ``changes.parquet`` and ``CHANGES.md`` under ``out``.

    ``previous_kept``: the old version is the copy :func:`keep_previous_version` made under
    ``old`` (a build into the same root). ``memory_limit``: DuckDB's, for one range of keys.
    Returns the summary CHANGES.md renders."""
    old_receipt = old.read_json(PREVIOUS_RECEIPT if previous_kept else RECEIPT)
    old_outputs = PREVIOUS_OUTPUTS if previous_kept else RECEIPT_OUTPUTS
    new_receipt = new.read_json(RECEIPT)
    if previous_kept:
        tables = {"o_records": Table(old, [PREVIOUS_RECORDS], RECORD_SCHEMA)}
        old_records = f"SELECT {', '.join(RECORD_COLUMNS)} FROM o_records"
    else:
        tables, old_records = _version_tables(old, "o"), records_query("o", source_prefix(old_receipt))
    tables.update(_version_tables(new, "n"))
    differs = " OR ".join(f"o.{f} IS DISTINCT FROM n.{f}" for f in FIELDS)
    fields = ", ".join(f"CASE WHEN o.{f} IS DISTINCT FROM n.{f} THEN '{f}' END" for f in FIELDS)
    sides = ", ".join(f"{s}.{f} AS {'old' if s == 'o' else 'new'}_{f}" for s in ("o", "n") for f in FIELDS)
    query = f"""
        WITH o AS ({old_records}), n AS ({records_query("n", source_prefix(new_receipt))})
        SELECT coalesce(n.key, o.key) AS key, coalesce(n.source_path, o.source_path) AS source_path,
               coalesce(n.occurrence, o.occurrence) AS occurrence,
               CASE WHEN o.occurrence IS NULL THEN 'added' WHEN n.occurrence IS NULL THEN 'removed'
                    ELSE 'changed' END AS change,
               CASE WHEN o.occurrence IS NULL OR n.occurrence IS NULL THEN NULL
                    ELSE concat_ws(',', {fields}) END AS fields,
               {sides}
        FROM o FULL OUTER JOIN n ON o.key IS NOT DISTINCT FROM n.key
             AND o.source_path IS NOT DISTINCT FROM n.source_path AND o.occurrence = n.occurrence
        WHERE o.occurrence IS NULL OR n.occurrence IS NULL OR {differs}"""
    order = "ORDER BY 1 NULLS FIRST, 2 NULLS FIRST, 3"
    kinds = ("added", "removed", "changed")
    tallies = ", ".join([f"count(*) FILTER (WHERE change = '{k}')" for k in kinds]
                        + [f"count(*) FILTER (WHERE change = 'changed' AND "
                           f"list_contains(string_split(fields, ','), '{f}'))" for f in FIELDS])
    counts = dict.fromkeys(kinds, 0)
    by_field = dict.fromkeys(FIELDS, 0)
    listed: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    with spilling_duckdb(memory_limit) as con, _parquet_writer(out, CHANGES_TABLE, CHANGES_SCHEMA) as rows:
        # every read of the table orders its rows (one row per key, source path, occurrence):
        # the table needs no order of its own, so neither a sort nor insertion order to keep
        con.execute("SET preserve_insertion_order = false")
        for ranged in key_ranges(tables, nulls_first=True):  # the order of the file: null keys first
            _register(con, ranged)
            con.execute(f"CREATE OR REPLACE TEMP TABLE changes AS {query}")
            rows.add(con.sql(f"SELECT * FROM changes {order}").to_arrow_reader(FETCH_ROWS))
            tally = con.sql(f"SELECT {tallies} FROM changes").fetchall()[0]
            for i, kind in enumerate(kinds):
                counts[kind] += tally[i]
                if tally[i] and len(listed[kind]) < LISTED:
                    listed[kind] += con.sql(f"SELECT * FROM changes WHERE change = '{kind}' {order} "
                                            f"LIMIT {LISTED - len(listed[kind])}").to_arrow_table().to_pylist()
            for i, f in enumerate(FIELDS):
                by_field[f] += tally[len(kinds) + i]
    summary = ChangesSummary(
        records=counts, changed_fields=by_field, listed=listed,
        release_shards=_shard_changes(_release_tars(old, old_outputs), _release_tars(new, RECEIPT_OUTPUTS)),
        licenses=_license_changes(old_receipt, new_receipt), statistics=_stats_changes(old_receipt, new_receipt))
    out.write_bytes(CHANGES_MD, render_changes(summary).encode())
    return summary


def same_version_account(out: Store) -> ChangesSummary:
    """What :func:`diff_versions` writes for a version compared with itself (both receipts the
    same bytes, so the same records, shards, licences and statistics), written without reading
    either: the empty account of a rerun that changed nothing."""
    kinds = ("added", "removed", "changed")
    summary = ChangesSummary(records=dict.fromkeys(kinds, 0), changed_fields=dict.fromkeys(FIELDS, 0),
                             listed={k: [] for k in kinds}, release_shards=_shard_changes({}, {}),
                             licenses={}, statistics=None)
    with _parquet_writer(out, CHANGES_TABLE, CHANGES_SCHEMA):
        pass
    out.write_bytes(CHANGES_MD, render_changes(summary).encode())
    return summary


def _release_tars(store: Store, rel: str) -> dict[str, str]:
    """SHA-256 per release tar from a version's output list (``receipt_outputs.parquet``, or the
    copy kept of the version a build replaced); none when the version has no list."""
    if not store.exists(rel):
        return {}
    table = store.read_parquet(rel, columns=["path", "sha256"])
    return {p: h for p, h in zip(table["path"].to_pylist(), table["sha256"].to_pylist(), strict=True)
            if p.startswith(f"{RELEASE_DIR}/") and p.endswith(".tar")}


def _shard_changes(a: dict[str, str], b: dict[str, str]) -> dict[str, list[str]]:
    """Release shards added, removed and rewritten (same path, other bytes) between the tars
    (path → SHA-256) of the old version ``a`` and the new one ``b``."""
    return {"added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b)),
            "rewritten": sorted(p for p in set(a) & set(b) if a[p] != b[p])}


def _license_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[int]]:
    """Input records per licence family whose count changed: family → [old, new]."""
    a = (old.get("licenses") or {}).get("input_by_family", {})
    b = (new.get("licenses") or {}).get("input_by_family", {})
    return {f: [a.get(f, 0), b.get(f, 0)] for f in sorted(set(a) | set(b)) if a.get(f, 0) != b.get(f, 0)}


def _stats_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """Both versions' statistics provenance, when the statistics changed."""
    a, b = old.get("stats") or {}, new.get("stats") or {}
    if a == b:
        return None
    keep = ("model_id", "n", "counts", "warning")
    return {"old": {k: a[k] for k in keep if k in a}, "new": {k: b[k] for k in keep if k in b},
            "files_changed": sorted(f for f in set(a.get("files", {})) | set(b.get("files", {}))
                                    if a.get("files", {}).get(f) != b.get("files", {}).get(f))
            if isinstance(a.get("files", {}), dict) and isinstance(b.get("files", {}), dict) else None}


def render_changes(summary: dict[str, Any]) -> str:
    """CHANGES.md: counts, the first records of each kind, shards, licences, statistics."""
    r = summary["records"]
    lines = ["# Changes since the previous version", "",
             f"Records: {r['added']} added, {r['removed']} removed, {r['changed']} changed "
             f"(every one in `{CHANGES_TABLE}`).", ""]
    changed = {f: n for f, n in summary["changed_fields"].items() if n}
    if changed:
        lines += ["| field | records changed |", "|---|---|", *[f"| {f} | {n} |" for f, n in changed.items()], ""]
    for kind in ("added", "removed", "changed"):
        rows = summary["listed"][kind]
        if not rows:
            continue
        lines += [f"## {kind.capitalize()} records (first {len(rows)} of {r[kind]})", "",
                  "| key | source path | change |", "|---|---|---|",
                  *[f"| {row['key']} | {row['source_path']} | {_describe(row)} |" for row in rows], ""]
    shards = summary["release_shards"]
    lines += ["## Release shards", "", f"{len(shards['rewritten'])} rewritten, {len(shards['added'])} added, "
              f"{len(shards['removed'])} removed.", ""]
    for kind in ("rewritten", "added", "removed"):
        if shards[kind]:
            lines += [f"- {kind}: " + ", ".join(f"`{p}`" for p in shards[kind][:LISTED])
                      + (f" … ({len(shards[kind])} in all)" if len(shards[kind]) > LISTED else "")]
    lines += ["", "## Licences", ""]
    if summary["licenses"]:
        lines += ["| family | input records before | after |", "|---|---|---|",
                  *[f"| {f} | {a} | {b} |" for f, (a, b) in summary["licenses"].items()]]
    else:
        lines.append("No change in the input records per licence family.")
    lines += ["", "## Statistics", ""]
    stats = summary["statistics"]
    if stats is None:
        lines.append("The reference statistics did not change.")
    else:
        lines += [f"The reference statistics changed. Before: `{json.dumps(stats['old'], sort_keys=True)}`; "
                  f"after: `{json.dumps(stats['new'], sort_keys=True)}`."]
        if stats["files_changed"]:
            lines.append("Files rewritten: " + ", ".join(f"`{f}`" for f in stats["files_changed"]) + ".")
    return "\n".join(lines) + "\n"


def _describe(row: dict[str, Any]) -> str:
    if row["change"] == "added":
        return f"added as {row['new_status']}" + (f" ({row['new_reason']})" if row["new_reason"] else "")
    if row["change"] == "removed":
        return f"removed (was {row['old_status']})"
    said = {"caption": "caption edited", "sha256": "image bytes changed"}
    parts = [said.get(f) or f"{f} {row[f'old_{f}']} → {row[f'new_{f}']}" for f in row["fields"].split(",")]
    return "; ".join(parts).replace("|", "\\|")


# Both read whole manifests (one range of keys at a time): tasks on the cluster, not the flow process.
KEEP_PREVIOUS_VERSION = Unit(keep_previous_version, "keep-previous-version", probe=True)
DIFF_VERSIONS = Unit(diff_versions, "diff-versions")


def remove_changes(store: Store) -> None:
    """A root with no earlier version has no account of changes (a stale one would mislead)."""
    for rel in (CHANGES_MD, CHANGES_TABLE):
        store.remove(rel)

