"""Release shards: the kept records, placed by :mod:`tasks.release.splits`, read back from staging.

:func:`assign_release_files` gathers every staged record's fate (kept, or removed as a
near-duplicate by the graph stage when it ran), assigns splits/shards/tiers to the kept
ones and writes two kinds of small files:

* ``work/release/{split}-{shard}.parquet`` — the samples of one release shard in order,
  with the (staging shard, offset, size, SHA-256) spans of their members and the shard's
  tier (one task per release shard reads it, and no staging index);
* ``work/late/{part}.parquet`` — per ingest partition, the facts decided after staging
  (staging shard, near-duplicate decision, component, split, shard, tier), joined into
  the manifest by row.

The staging shards to assign from are a file too, ``work/release_staged.parquet``, which
the publishing flow writes (:func:`write_staged_list`) and the assignment task reads back by
its SHA-256: that task's parameters stay a few names and digests at any shard count.

A release shard's fingerprint holds its assignment file's bytes, and so the SHA-256 of each
staging member it copies: a caption edited in staging reaches exactly the release tar
holding it.

The assignment is columnar and out of core, one range of keys at a time (:mod:`corpusforge.key_ranges`):
one pass over the staging shards, then five DuckDB passes that place the kept records exactly as
:mod:`tasks.release.splits` states the rule (docs/release.md, "Release assignment"). What passes from
one range to the next is a few counters per stratum, so the task's memory follows the range size, not
N; no per-record Python object outlives its staging shard, release shard or partition.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any, TypedDict

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpusforge.contract import (SKIPPED, UnitResult, must_compute, prune, read_marker, read_pinned, run_unit,
                                  unit_fingerprint)
from corpusforge.faults import fault_point
from corpusforge.hashing import stable_uniform
from corpusforge.key_ranges import ROWS_PER_RANGE, Table, key_ranges
from corpusforge.layout import part_name, staging_index, staging_records, staging_tar
from tasks.release.files import (GPIC_JSON_FIELDS, LATE_DIR, LATE_SCHEMA, MEMBER_SPAN, RELEASE_ASSIGNMENT_DIR,
                                 RELEASE_ASSIGNMENT_SCHEMA, RELEASE_DIR, RELEASE_STAGED, RELEASE_STAGED_SCHEMA,
                                 late_path, release_assignment_path, release_shard_name, release_tar)
from tasks.captions.files import captions_path
from tasks.graph.files import decisions_path
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.tarshard import Sample, write_tar
from corpusforge.version import code_version
from tasks.release.release_image import COPIED, FORMAT_OF_EXT, member_for, pillow_version, reencode, resolve_rule
from tasks.release.splits import SPLITS, SplitConfig, apportion, held_out_sizes, tier_counts, tiers_of
from tasks.shared.samples import sample_json

# DuckDB's budget for one range's queries (beyond it, it spills to disk): a ceiling a range of
# key_ranges.ROWS_PER_RANGE records stays far below. Before the ranged passes one query over every
# record filled it as N grew (1.12 GB above start at 1M records; 94 GB at 1e8 by the line).
ASSIGN_MEMORY_LIMIT = "2GB"
_CAPTION_FIELDS = ("caption", "caption_type", "caption_origin", "vlm_model", "vlm_answers")


def gpic_json(meta: dict[str, Any], caption: str, tiers: list[str]) -> bytes:
    """A sample's JSON in GPIC's release format: exactly its field names and types (strings
    never null: a missing value is ""; ``split`` is the list of tiers holding the sample)."""
    text = {f: str(meta.get(f) or "") for f in ("retrieved_at", "license", "license_url", "attribution",
                                                "key", "caption_type")}
    values = {**text, "img_width": int(meta["width"]), "img_height": int(meta["height"]),
              "split": list(tiers), "caption": caption}
    return json.dumps({f: values[f] for f in GPIC_JSON_FIELDS}, ensure_ascii=False,
                      separators=(",", ":")).encode()


def release_sample(key: str, data: dict[str, bytes], split: str, tiers: list[str], release_ext: str,
                   encoding: str, layout: str, captioned: dict[str, Any] | None = None) -> Sample:
    """One release sample from its staged members. Default layout: image, .txt, .json (the
    staged JSON plus split, tiers and the image member's true format); gpic: .json first,
    then the image, caption inside the JSON. ``captioned`` (a row of its assignment file): when the
    captioning stage ran, its caption replaces the staged one and its type and origin go
    into the JSON."""
    staged_ext = next(e for e in data if e not in ("txt", "json"))
    image = reencode(data[staged_ext], encoding)
    meta = json.loads(data["json"])
    text = data["txt"]
    extra: dict[str, Any] = {}
    if captioned and captioned.get("caption_origin"):
        extra = {"caption_type": captioned["caption_type"], "caption_origin": captioned["caption_origin"]}
        if captioned.get("caption") is not None:
            text = captioned["caption"].encode("utf-8")
    if layout == "gpic":
        meta.update(caption_type=extra.get("caption_type", meta.get("caption_type")))
        return Sample(key, {"json": gpic_json(meta, text.decode("utf-8"), tiers), release_ext: image})
    extra.update(split=split, tiers=tiers, format=FORMAT_OF_EXT[release_ext])
    return Sample(key, {release_ext: image, "txt": text, "json": sample_json(meta, extra)})


def _facts_schema(n_strata: int) -> pa.Schema:
    """One staged record's facts in the assignment's first pass: everything the assignment and late files
    need, its strata (``s_0``…: each stratify field as a string, "" when empty), its group
    and its seeded priorities (``u0``: split order, ``u1``: shard deal, ``u2``: order in shard)."""
    return pa.schema([
        ("key", pa.string()), ("part", pa.int32()), ("row", pa.int32()), ("staging_shard", pa.string()),
        ("ext", pa.string()), *[LATE_SCHEMA.field(c) for c in (
            "status", "reason", "duplicate_of", "component_id", "component_size", "max_similarity")],
        *[(f, pa.string()) for f in _CAPTION_FIELDS],
        ("grp", pa.string()), *[(f"s_{i}", pa.string()) for i in range(n_strata)],
        ("u0", pa.float64()), ("u1", pa.float64()), ("u2", pa.float64()), ("members", pa.list_(MEMBER_SPAN))])


def shard_facts(store: Store, shard: str, source: Store, near_dedup: bool, captions: bool,
                cfg: SplitConfig) -> pa.Table:
    """The facts of one staging shard's records (from ``source``) with their near-duplicate
    decisions (from ``store``, when the near-duplicate stage ran: then every record must
    have one) and, when the captioning stage ran, their caption rows (every surviving
    record must have one)."""
    decisions = ({d["key"]: d for d in store.read_parquet(decisions_path(shard)).to_pylist()}
                 if near_dedup else {})
    captioned = {c["key"]: c for c in store.read_parquet(captions_path(shard)).to_pylist()} if captions else {}
    spans: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in source.read_parquet(staging_index(shard), columns=["key", "ext", "offset", "size", "sha256"]
                                 ).to_pylist():
        spans[m.pop("key")].append(m)
    rows = []
    for r in source.read_parquet(staging_records(shard)).to_pylist():
        if near_dedup and r["key"] not in decisions:
            raise ValueError(f"no near-duplicate decision for {r['key']} of staging shard {shard}")
        d = decisions.get(r["key"], {})
        r.update(staging_shard=shard, status=d.get("status", Status.KEPT.value), reason=d.get("reason") or "",
                 duplicate_of=d.get("duplicate_of"), component_id=d.get("component_id"),
                 component_size=d.get("component_size"), max_similarity=d.get("max_similarity"))
        if captions and r["status"] == Status.KEPT.value:
            c = captioned.get(r["key"])
            if c is None:
                raise ValueError(f"no caption row for {r['key']} of staging shard {shard}")
            r.update({f: c[f] for f in _CAPTION_FIELDS})
            if c["status"] != Status.KEPT.value:
                r.update(status=c["status"], reason=c["reason"])
        r["grp"] = str(r["component_id"]) if r["component_id"] is not None else f"{r['part']}:{r['row']}"
        r.update({f"s_{i}": str(r.get(f) or "") for i, f in enumerate(cfg.stratify_by)})
        if r["status"] == Status.KEPT.value:
            r.update(u0=stable_uniform(cfg.seed, r["key"]), u1=stable_uniform(cfg.seed + 1, r["key"]),
                     u2=stable_uniform(cfg.seed + 2, r["key"]), members=spans[r["key"]])
        rows.append(r)
    return pa.Table.from_pylist(rows, schema=_facts_schema(len(cfg.stratify_by)))


# The kept records' columns the passes carry to the assignment files (and ``part``, to the late files).
_CARRIED = "key, part, staging_shard, ext, caption, caption_type, caption_origin, members"
# Each placed record, for the late files (:func:`_write_late`).
_PLACED = pa.schema([("key", pa.string()), ("part", pa.int32()), ("split", pa.string()), ("shard", pa.int32())])


class _Pass:
    """One ranged pass's output, the next pass's input: a local parquet file per range."""

    def __init__(self, local: Store, name: str, schema: pa.Schema = pa.schema([])):
        self.local, self.name, self.files, self.schema = local, name, [], schema

    def add(self, table: pa.Table) -> None:
        self.files.append(f"{self.name}/{len(self.files):08d}.parquet")
        self.local.write_parquet(self.files[-1], table)
        self.schema = table.schema

    def table(self) -> Table:
        return Table(self.local, self.files, self.schema)


def _ranges(con: duckdb.DuckDBPyConnection, tables: dict[str, Table], key: str, rows: int,
            drop: bool = True) -> Iterator[None]:
    """Each range of ``tables`` by ``key`` (:func:`corpusforge.key_ranges.key_ranges`), in key
    order, registered in ``con`` under the tables' names while the caller's loop body runs.
    ``drop``: then delete the tables' files, which no later pass reads (so the local disk holds
    the facts and two passes' rows, not every pass's)."""
    for ranged in key_ranges(tables, rows_per_range=rows, key=key):
        for name, rows_in_range in ranged.items():
            con.register(name, rows_in_range)
        yield
        for name in ranged:
            con.unregister(name)
    for table in tables.values() if drop else ():
        for rel in table.files:
            table.store.remove(rel)


def _register_counters(con: duckdb.DuckDBPyConnection, name: str, keys: list[str], values: list[str],
                       state: dict[tuple[str, ...], list[int]]) -> None:
    """Register carried counters as table ``name``: per key of ``state``, its ``keys`` columns and ``values``."""
    schema = pa.schema([(c, pa.string()) for c in keys] + [(c, pa.int64()) for c in values])
    con.register(name, pa.Table.from_pylist([dict(zip(keys + values, (*k, *v), strict=True))
                                             for k, v in state.items()], schema=schema))


def _grouped(con: duckdb.DuckDBPyConnection, facts: Table, local: Store, s_cols: list[str],
             rows: int) -> tuple[Table, Counter[tuple[str, ...]]]:
    """Pass 1, by group: each kept record with its group's size ``n``, smallest key ``gkey``,
    seeded priority ``gu`` and strata ``g_s_…`` (those of its smallest key's record); and the
    kept records per group stratum (without ``s_c``, as :func:`tasks.release.splits.apportion` keys them)."""
    out = _Pass(local, "grouped")
    sizes: Counter[tuple[str, ...]] = Counter()
    g_cols = [f"g_{c}" for c in s_cols]
    sql = f"""WITH kept AS (SELECT *, '' AS s_c FROM facts WHERE status = '{Status.KEPT.value}'),
                   groups AS (SELECT grp, count(*) AS n, min(key) AS gkey, arg_min(u0, key) AS gu,
                                     {", ".join(f"arg_min({c}, key) AS g_{c}" for c in s_cols)}
                              FROM kept GROUP BY grp)
              SELECT {_CARRIED}, {", ".join(s_cols)}, u1, u2, grp, n, gkey, gu, {", ".join(g_cols)}
              FROM kept JOIN groups USING (grp)"""
    for _ in _ranges(con, {"facts": facts}, "grp", rows, drop=False):  # the late files read the facts again
        table = con.sql(sql).to_arrow_table()
        out.add(table)
        for r in table.group_by(g_cols).aggregate([("key", "count")]).to_pylist():
            sizes[tuple(r[c] for c in g_cols[1:])] += r["key_count"]
    return out.table(), sizes


def _split_groups(con: duckdb.DuckDBPyConnection, grouped: Table, local: Store, s_cols: list[str],
                  quotas: dict[tuple[str, ...], tuple[int, int]], rows: int) -> tuple[Table, Counter[tuple[str, ...]]]:
    """Pass 2, by group priority: per group stratum, groups in (``gu``, ``gkey``) order take test
    while the sizes of the stratum's groups before them are under its test quota (``quotas``:
    test, val), then val likewise (a window sum of group sizes, plus ``done`` and ``tested``: the
    sizes of the stratum's groups in earlier ranges, and of those in test). Returns the records
    with their split, and the count per split and record stratum (``s_c`` left out)."""
    out = _Pass(local, "split")
    g_cols = [f"g_{c}" for c in s_cols]
    g = ", ".join(g_cols)
    state = {("", *s): [tq, vq, 0, 0] for s, (tq, vq) in quotas.items()}  # tq, vq, done, tested
    counts: Counter[tuple[str, ...]] = Counter()
    groups_sql = f"""WITH groups AS (SELECT DISTINCT grp, n, gkey, gu, {g} FROM grouped),
        ordered AS (
            SELECT grp, n, tq, vq, tested, {g}, done + sum(n) OVER (PARTITION BY {g} ORDER BY gu, gkey
                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - n AS before
            FROM groups JOIN quota USING ({g})),
        flagged AS (SELECT *, before < tq AS is_test FROM ordered),
        totals AS (SELECT *, tested + sum(CASE WHEN is_test THEN n ELSE 0 END) OVER (PARTITION BY {g}) AS test_total
                   FROM flagged)
        SELECT grp, n, is_test, {g},
               CASE WHEN is_test THEN 'test' WHEN before - test_total < vq THEN 'val' ELSE 'train' END AS split
        FROM totals"""
    records_sql = f"SELECT {_CARRIED}, {', '.join(s_cols)}, u1, u2, split FROM grouped JOIN group_split USING (grp)"
    for _ in _ranges(con, {"grouped": grouped}, "gu", rows):
        _register_counters(con, "quota", g_cols, ["tq", "vq", "done", "tested"], state)
        con.register("group_split", con.sql(groups_sql).to_arrow_table())
        table = con.sql(records_sql).to_arrow_table()
        out.add(table)
        for *key, n, tested in con.execute(f"""SELECT {g}, sum(n), sum(CASE WHEN is_test THEN n ELSE 0 END)
                                               FROM group_split GROUP BY {g}""").fetchall():
            counters = state[tuple(key)]
            counters[2] += n
            counters[3] += tested
        for r in table.group_by(["split", *s_cols[1:]]).aggregate([("key", "count")]).to_pylist():
            counts[(r["split"], *(r[c] for c in s_cols[1:]))] += r["key_count"]
    return out.table(), counts


def _deal(con: duckdb.DuckDBPyConnection, records: Table, local: Store, s_cols: list[str],
          counts: Counter[tuple[str, ...]], n_shards: dict[str, int], rows: int) -> dict[str, Table]:
    """Pass 3, by deal priority: each split's records in (stratum, ``u1``, key) order are dealt
    round-robin to its ``n_shards`` shards. A record's place in that order is where its split's
    stratum starts (the split's records in smaller strata, from ``counts``) plus the records of
    its split and stratum in earlier ranges, plus its rank in this range: ``start`` carries the sum.
    Returns each split's dealt records."""
    out = {split: _Pass(local, f"dealt-{split}") for split in sorted(n_shards)}
    state: dict[tuple[str, ...], list[int]] = {}
    start: Counter[str] = Counter()
    for split, *stratum in sorted(counts):
        state[(split, "", *stratum)] = [start[split], n_shards[split]]
        start[split] += counts[(split, *stratum)]
    s = ", ".join(s_cols)
    sql = f"""SELECT {_CARRIED}, u2, split,
                     ((start + row_number() OVER (PARTITION BY split, {s} ORDER BY u1, key) - 1) % n_shards)::INTEGER
                         AS shard
              FROM records JOIN deal USING (split, {s})"""
    for _ in _ranges(con, {"records": records}, "u1", rows):
        _register_counters(con, "deal", ["split", *s_cols], ["start", "n_shards"], state)
        table = con.sql(sql).to_arrow_table()
        for split, dealt in out.items():
            dealt.add(table.filter(pc.equal(table["split"], split)))
        for *key, n in con.execute(f"SELECT split, {s}, count(*) FROM records GROUP BY split, {s}").fetchall():
            state[tuple(key)][0] += n
    return {split: dealt.table() for split, dealt in out.items()}


def write_staged_list(store: Store, shards: list[str]) -> str:
    """Write the staging shards a release is assigned from, in order; return the SHA-256
    that :func:`assign_release_files` gets."""
    return store.write_parquet(RELEASE_STAGED, pa.table({"shard": list(shards)}, schema=RELEASE_STAGED_SCHEMA))


def read_staged_list(store: Store, digest: str) -> list[str]:
    """The staging shards written as ``digest`` (refused if the file changed since)."""
    data = read_pinned(store, RELEASE_STAGED, digest, "release assignment")
    return pq.read_table(io.BytesIO(data))["shard"].to_pylist()


class ReleaseAssignment(TypedDict):
    """The release assignment step's result (:func:`assign_release_files`), as its marker keeps it (JSON)."""

    shards: dict[str, dict[str, Any]]
    plans: dict[str, dict[str, str]]
    late: dict[str, str]
    removed_near_duplicates: int
    split_rule: str
    images: dict[str, Any]


def assign_release_files(store: Store, staged: str, cfg: SplitConfig, near_dedup: bool,
                         source: Store | None = None, captions: bool = False,
                         memory_limit: str = ASSIGN_MEMORY_LIMIT,
                         rows_per_range: int = ROWS_PER_RANGE) -> ReleaseAssignment:
    """Assign splits/shards/tiers and write the assignment files; return each release shard's
    size, caption mix and assignment-file digest, and each partition's late-facts digest.

    ``staged``: SHA-256 of the staging-shard list (:func:`write_staged_list`, in ``store``).
    ``source`` holds the staging shards (default ``store``; another corpus version's root
    when a near-dedup pass writes a new version). ``memory_limit``: DuckDB's budget for
    one range's queries (it spills to a local temporary folder beyond it). ``rows_per_range``:
    the records (of every table a pass reads) one range holds at most, unless one key holds more."""
    source = source or store
    shards = read_staged_list(store, staged)
    s_cols = ["s_c", *(f"s_{i}" for i in range(len(cfg.stratify_by)))]
    with tempfile.TemporaryDirectory(prefix="corpusforge-plan-") as tmp:
        local = Store(tmp, fsync=False)
        facts = _Pass(local, "facts", _facts_schema(len(cfg.stratify_by)))
        exts: set[str] = set()
        n_records = 0
        for shard in shards:
            table = shard_facts(store, shard, source, near_dedup, captions, cfg)
            exts.update(table.filter(pc.equal(table["status"], Status.KEPT.value))["ext"].unique().to_pylist())
            n_records += table.num_rows
            facts.add(table)
        with duckdb.connect() as con:
            con.execute(f"SET memory_limit = '{memory_limit}'")
            con.execute(f"SET temp_directory = '{os.path.join(tmp, 'spill')}'")
            con.execute("SET preserve_insertion_order = false")
            con.execute("SET enable_progress_bar = false")
            con.execute("SET threads = 1")  # a range is small: more threads only add their buffers (~9 MB)
            grouped, sizes = _grouped(con, facts.table(), local, s_cols, rows_per_range)
            n_kept = sum(sizes.values())
            val_n, test_n, _ = held_out_sizes(n_kept, cfg)
            test_q, val_q = apportion(test_n, sizes), apportion(val_n, sizes)
            records, counts = _split_groups(con, grouped, local, s_cols, {s: (test_q[s], val_q[s]) for s in sizes},
                                            rows_per_range)
            per_split: Counter[str] = Counter()
            for (split, *_), n in counts.items():
                per_split[split] += n
            n_shards = {split: max(1, math.ceil(n / cfg.shard_size)) for split, n in per_split.items()}
            dealt = _deal(con, records, local, s_cols, counts, n_shards, rows_per_range)
            rule = resolve_rule(sorted(exts), cfg.layout, cfg.image_format)
            image_of = {e: dict(zip(("release_ext", "image_encoding"),
                                    member_for(e, cfg.layout, rule, cfg.jpeg_quality))) for e in exts}
            tier_of = {split: tier_counts(n, cfg.tiers, cfg.preset == "gpic") if split == "train" else []
                       for split, n in n_shards.items()}
            shards_info, assignments, placed = _write_assignments(store, con, dealt, local, cfg, image_of, tier_of,
                                                                  rows_per_range)
            late_digests = _write_late(store, con, facts.table(), placed, cfg, image_of, tier_of, rows_per_range)
    prune(store, RELEASE_ASSIGNMENT_DIR, assignments)
    prune(store, LATE_DIR, {part_name(p) for p in late_digests})
    for split in SPLITS:
        prune(store, f"{RELEASE_DIR}/{split}", {n for n, s in shards_info.items() if s["split"] == split})
    encodings: Counter[str] = Counter()
    for s in shards_info.values():
        encodings.update(s.pop("encodings"))
    return {
        "shards": shards_info,
        "plans": {name: {"sha256": sha} for name, sha in assignments.items()},
        "late": late_digests,
        "removed_near_duplicates": n_records - n_kept,  # (and, with captioning, its filters)
        "split_rule": held_out_sizes(n_kept, cfg)[2],
        "images": {"layout": cfg.layout, "image_format": cfg.image_format, "rule": rule,
                   "encodings": dict(sorted(encodings.items()))},
    }


def _tier(tiers: list[tuple[str, int]], shard: int) -> str | None:
    return next((name for name, count in tiers if shard < count), None)


def _arrow_runs(con: duckdb.DuckDBPyConnection, sql: str, key: tuple[str, ...]) -> Iterator[pa.Table]:
    """A query ordered by ``key``: its rows as one Arrow table per run of equal ``key`` (one
    chunk per column), read in batches of 4096 rows: only the run being gathered is held."""
    parts: list[pa.Table] = []
    current: tuple[Any, ...] | None = None
    for batch in con.sql(sql).to_arrow_reader(4096):
        table = pa.Table.from_batches([batch])
        start = 0
        for i, k in enumerate(zip(*(table[c].to_pylist() for c in key), strict=True)):
            if k != current:
                if i > start:
                    parts.append(table.slice(start, i - start))
                if parts:
                    yield pa.concat_tables(parts).combine_chunks()
                parts, start, current = [], i, k
        parts.append(table.slice(start))
    if parts:
        yield pa.concat_tables(parts).combine_chunks()


def _by_ext(ext: pa.ChunkedArray, image_of: dict[str, dict[str, str]], field: str) -> pa.Array:
    """``image_of[e][field]`` for each record's staged extension ``e``."""
    exts = sorted(image_of)
    return pa.array([image_of[e][field] for e in exts], pa.string()).take(pc.index_in(ext, pa.array(exts)))


def _write_assignments(store: Store, con: duckdb.DuckDBPyConnection, dealt: dict[str, Table], local: Store,
                       cfg: SplitConfig, image_of: dict[str, dict[str, str]], tier_of: dict[str, list[tuple[str, int]]],
                       rows: int) -> tuple[dict[str, Any], dict[str, str], Table]:
    """Pass 4, each split's records by shard: one assignment file per release shard, its samples in
    (``u2``, key) order; (summary, digest) per shard in split and shard order, and each placed
    record's (key, part, split, shard) for the late files.
    A shard's rows stay Arrow columns (~0.2 KB a row; Python dicts of them took ~4 KB)."""
    info: dict[str, Any] = {}
    assignments: dict[str, str] = {}
    placed = _Pass(local, "placed", _PLACED)
    sql = """SELECT shard, key, staging_shard, caption, caption_type, caption_origin, ext, members
             FROM dealt ORDER BY shard, u2, key"""
    for split in sorted(dealt):
        for _ in _ranges(con, {"dealt": dealt[split]}, "shard", rows):
            placed.add(con.sql("SELECT key, part, split, shard FROM dealt").to_arrow_table().cast(_PLACED))
            for run in _arrow_runs(con, sql, ("shard",)):
                shard = run["shard"][0].as_py()
                name = release_shard_name(split, shard, cfg.layout)
                tier = _tier(tier_of[split], shard)
                columns = {"tier": pa.array([tier] * len(run), pa.string()),
                           "release_ext": _by_ext(run["ext"], image_of, "release_ext"),
                           "image_encoding": _by_ext(run["ext"], image_of, "image_encoding")}
                assignment = pa.table({f.name: columns[f.name] if f.name in columns else run[f.name].cast(f.type)
                                       for f in RELEASE_ASSIGNMENT_SCHEMA}, schema=RELEASE_ASSIGNMENT_SCHEMA)
                assignments[name] = store.write_parquet(release_assignment_path(name), assignment)
                info[name] = {"split": split, "index": shard, "count": len(run),
                              "caption_type": dict(sorted(Counter(assignment["caption_type"].to_pylist()).items())),
                              "image_ext": dict(sorted(Counter(assignment["release_ext"].to_pylist()).items())),
                              "encodings": Counter(assignment["image_encoding"].to_pylist())}
    return info, assignments, placed.table()


def _write_late(store: Store, con: duckdb.DuckDBPyConnection, facts: Table, placed: Table, cfg: SplitConfig,
                image_of: dict[str, dict[str, str]], tier_of: dict[str, list[tuple[str, int]]],
                rows: int) -> dict[int, str]:
    """Pass 5, by ingest partition: one late-facts file per partition, in row order; its digest per partition."""
    digests: dict[int, str] = {}
    columns = ", ".join(f"f.{c}" for c in LATE_SCHEMA.names if c not in ("split", "shard", "tier", "release_ext",
                                                                        "image_encoding"))
    sql = f"""SELECT f.part, f.ext, {columns}, p.split, p.shard AS shard_index
              FROM facts f LEFT JOIN placed p USING (key) ORDER BY f.part, f.row"""
    for _ in _ranges(con, {"facts": facts, "placed": placed}, "part", rows):
        for run in map(pa.Table.to_pylist, _arrow_runs(con, sql, ("part",))):
            for r in run:
                split, index = r.pop("split"), r.pop("shard_index")
                is_placed = split is not None
                r.update(image_of[r["ext"]] if is_placed else {"release_ext": None, "image_encoding": None},
                         split=split, tier=_tier(tier_of[split], index) if is_placed else None,
                         shard=release_shard_name(split, index, cfg.layout) if is_placed else None)
            digests[run[0]["part"]] = store.write_parquet(late_path(run[0]["part"]),
                                                          pa.Table.from_pylist(run, schema=LATE_SCHEMA))
    return digests


def write_release_shard(store: Store, split: str, shard: int, cfg: SplitConfig, assignment_sha256: str,
                        source: Store | None = None) -> UnitResult:
    """Write one release shard from staging (in ``source``, default ``store``) with ranged reads.

    ``assignment_sha256``: the digest of the shard's assignment file (:func:`assign_release_files`), its
    fingerprint (module docstring); the writer reads that file in batches and only the spans it lists.

    Whether the shard re-encodes (and so depends on Pillow's version) is a fact of the
    assignment file, fixed by its digest: a marker whose fingerprint is the key for either answer is
    current, so the check reads the marker alone and the flow probes it (no assignment file is read)."""
    source = source or store
    name = release_shard_name(split, shard, cfg.layout)
    tar = release_tar(split, shard, cfg.layout)
    marker = read_marker(store, tar)
    if marker is not None and marker.fingerprint in (_release_key(cfg, assignment_sha256, reencodes=False),
                                                     _release_key(cfg, assignment_sha256, reencodes=True)):
        return UnitResult.of(marker, SKIPPED)
    must_compute()
    with store.open(release_assignment_path(name)) as assignment_file:
        assignment = pq.ParquetFile(assignment_file)
        encodings = assignment.read(columns=["image_encoding"], use_threads=False)["image_encoding"]
        fp = _release_key(cfg, assignment_sha256, reencodes=any(e != COPIED for e in encodings.unique().to_pylist()))

        def compute() -> tuple[dict[str, str], dict[str, Any]]:
            def samples():
                for i, entry in enumerate(_assignment_rows(assignment)):
                    if i == 1:
                        fault_point("release.write", name)  # tests only: off unless CORPUSFORGE_FAULT
                    spans = entry["members"]
                    start = min(m["offset"] for m in spans)
                    end = max(m["offset"] + m["size"] for m in spans)
                    blob = source.read_range(staging_tar(entry["staging_shard"]), start, end - start)
                    data = {m["ext"]: blob[m["offset"] - start:m["offset"] - start + m["size"]] for m in spans}
                    yield release_sample(entry["key"], data, split, tiers_of(entry["tier"], cfg),
                                         entry["release_ext"], entry["image_encoding"], cfg.layout, captioned=entry)

            with store.atomic_write(tar) as f:
                result = write_tar(f, samples())
            return {tar: result.sha256}, {"shard": name, "count": result.count, "bytes": result.bytes}

        return run_unit(store, tar, fp, compute)


def _assignment_rows(assignment: pq.ParquetFile, rows: int = 1024) -> Iterator[dict[str, Any]]:
    """A release assignment's rows in order, ``rows`` of them alive as Python objects at a time:
    a writer's memory follows the batch, not its shard (a shard's size is a config field)."""
    for batch in assignment.iter_batches(batch_size=rows, use_threads=False):
        yield from batch.to_pylist()


def _release_key(cfg: SplitConfig, assignment_sha256: str, reencodes: bool) -> str:
    """A release shard's fingerprint: its assignment file's digest, tiers, layout and, when it
    re-encodes images, Pillow's version."""
    return unit_fingerprint("release", code_version(__name__),
                            [cfg.tiers, cfg.layout, pillow_version() if reencodes else None], [assignment_sha256])
