"""Key uniqueness and exact deduplication by SHA-256: a bucketed exchange, bounded per task.

Both checks are group-bys over the whole corpus, so the rows ingest writes per partition
(:func:`write_dedup_tables`) go through a two-level exchange by partition group and hash bucket,
like datatrove's and NeMo Curator's dedup shuffles, instead of every bucket task opening every
partition's files (P·B opens, every footer read B times). The steps, the files each opens and the
rules (first key wins, case-folded keys, the highest-resolution copy kept): docs/exact-dedup.md.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from corpusforge.chunking import cut_name
from corpusforge.contract import (COMPUTED, SKIPPED, FanOut, Sink, StageSummary, Unit, UnitKey, UnitResult, in_process,
                                  require_markers, run_unit, unit_fingerprint)
from corpusforge.hashing import fingerprint, stable_int
from corpusforge.layout import RESOLVED_SCHEMA
from tasks.ingest.files import (DEDUP_HASHES_DIR, DEDUP_KEYS_DIR, DUPLICATE_SCHEMA, EXACT_DIR, HASH_SCHEMA, KEYDUP_DIR,
                                KEY_SCHEMA, dedup_hashes_path, dedup_keys_path, exact_path, hashes_path, ingest_path,
                                keydup_path, keys_table_path, resolved_path)
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.tarshard import folded_key, is_safe_key
from corpusforge.version import code_version


# A group has at least this many partitions: fewer, larger exchange tasks for small corpora.
MIN_GROUP = 16


def _code() -> str:
    return code_version("tasks.ingest.exact_dedup")


def partition_groups(n_parts: int, n_buckets: int) -> list[range]:
    """Consecutive partitions per exchange group: max(n_buckets, MIN_GROUP) each, so that
    groups × buckets stays near the number of partitions (files opened ∝ corpus size)."""
    size = max(n_buckets, MIN_GROUP)
    return [range(lo, min(lo + size, n_parts)) for lo in range(0, n_parts, size)]


# One fingerprint function per unit kind: the run and ``corpusforge plan`` share them.

def exchange_keys_key(parts: range, ingested: str) -> UnitKey:
    """A group's key exchange: its partitions and their ingest units' combined digest."""
    return unit_fingerprint("exchange-keys", _code(), [parts.start, parts.stop], ingested)


def duplicate_keys_key(bucket: int, group_size: int, exchanged: str) -> UnitKey:
    """A key bucket: the combined digest of every group's key exchange."""
    return unit_fingerprint("duplicate-keys", _code(), [bucket, group_size], exchanged)


def exchange_hashes_key(parts: range, ingested: str, keydup: str) -> UnitKey:
    """A group's hash exchange: its ingest units and the key decisions it filters by."""
    return unit_fingerprint("exchange-hashes", _code(), [parts.start, parts.stop], [ingested, keydup])


def exact_duplicates_key(bucket: int, group_size: int, exchanged: str) -> UnitKey:
    """A hash bucket: the combined digest of every group's hash exchange."""
    return unit_fingerprint("exact-duplicates", _code(), [bucket, group_size], exchanged)


def resolve_key(shard_size: int, ingest_digest: str, decisions: str) -> UnitKey:
    """A partition's resolve: its ingest digest and the combined digest of every decision file."""
    return unit_fingerprint("resolve", _code(), shard_size, [ingest_digest, decisions])


def combine_digests(digests: list[str]) -> str:
    """One digest over several units' output digests (a task's parameter instead of the list)."""
    return fingerprint(digests)


def write_dedup_tables(store: Store, part: int, records: list[dict[str, Any]], n_buckets: int) -> dict[str, str]:
    """Write a partition's hash rows (its kept records) and key rows (every safe key, bucketed
    by its case-folded form so case variants meet), each sorted by bucket, as ingest leaves
    them for this stage; return their SHA-256s."""
    hashes = sorted(
        ({"bucket": stable_int(0, r["sha256"], n_buckets), "sha256": r["sha256"], "key": r["key"],
          "part": r["part"], "row": r["row"], "pixels": int(r["width"]) * int(r["height"])}
         for r in records if r["status"] == Status.KEPT.value),
        key=lambda r: (r["bucket"], r["sha256"], r["row"]))
    keys = sorted(
        ({"bucket": stable_int(0, folded_key(r["key"]), n_buckets), "key": r["key"], "part": r["part"], "row": r["row"]}
         for r in records if r["key"] and is_safe_key(r["key"])),
        key=lambda r: (r["bucket"], r["key"], r["row"]))
    return {hashes_path(part): store.write_parquet(hashes_path(part), pa.Table.from_pylist(hashes, schema=HASH_SCHEMA)),
            keys_table_path(part): store.write_parquet(keys_table_path(part),
                                                       pa.Table.from_pylist(keys, schema=KEY_SCHEMA))}


def _in_group(group: range) -> pc.Expression:
    return (pc.field("part") >= group.start) & (pc.field("part") < group.stop)


def _by_bucket(store: Store, rel: str, table: pa.Table, within: str) -> dict[str, str]:
    """``table`` sorted by bucket, then ``within`` and input order, one row group per bucket."""
    table = table.sort_by([(c, "ascending") for c in ("bucket", within, "part", "row")])
    return {rel: store.write_parquet(rel, table, row_groups=table["bucket"].to_numpy())}


def _write_decisions(store: Store, rel: str, rows: list[dict[str, Any]], group_size: int) -> dict[str, str]:
    """Decisions in (part, row) order, one row group per partition group."""
    rows.sort(key=lambda r: (r["part"], r["row"]))
    table = pa.Table.from_pylist(rows, schema=DUPLICATE_SCHEMA)
    return {rel: store.write_parquet(rel, table, row_groups=[r["part"] // group_size for r in rows])}


def exchange_keys(store: Store, group: int, parts: range, ingested: str) -> UnitResult:
    """A group's key rows in one file, one row group per bucket (``ingested``: the combined
    digest of the group's ingest units, whose outputs hold the ``work/keys`` it reads)."""
    rel = dedup_keys_path(group)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        table = pa.concat_tables([store.read_parquet(keys_table_path(p)) for p in parts])
        return _by_bucket(store, rel, table, "key"), {"rows": table.num_rows}

    return run_unit(store, rel, exchange_keys_key(parts, ingested), compute)


def find_duplicate_keys(store: Store, bucket: int, exchanged: str, group_size: int) -> UnitResult:
    """Records reusing a key seen earlier in input order, or one differing only in case from
    it (``exchanged``: the combined digest of every group's key file, what this bucket reads)."""
    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        table = store.dataset(DEDUP_KEYS_DIR, KEY_SCHEMA).to_table(filter=pc.field("bucket") == bucket).to_pylist()
        table.sort(key=lambda r: (folded_key(r["key"]), r["part"], r["row"]))
        decisions: list[dict[str, Any]] = []
        first, seen = None, set()
        for r in table:
            if first is None or folded_key(first["key"]) != folded_key(r["key"]):
                first, seen = r, {r["key"]}
                continue
            # the same key again, or one differing only in case from the first of its group
            decisions.append({"part": r["part"], "row": r["row"],
                              "duplicate_of": r["key"] if r["key"] in seen else first["key"]})
            seen.add(r["key"])
        return _write_decisions(store, keydup_path(bucket), decisions, group_size), {"duplicates": len(decisions)}

    return run_unit(store, keydup_path(bucket), duplicate_keys_key(bucket, group_size, exchanged), compute)


def exchange_hashes(store: Store, group: int, parts: range, ingested: str, keydup: str) -> UnitResult:
    """A group's hash rows without the records that reuse a key, one row group per bucket
    (``ingested``: as for :func:`exchange_keys`; ``keydup``: the combined digest of the key
    decisions)."""
    rel = dedup_hashes_path(group)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        table = pa.concat_tables([store.read_parquet(hashes_path(p)) for p in parts])
        bad = store.dataset(KEYDUP_DIR, DUPLICATE_SCHEMA).to_table(filter=_in_group(parts), columns=["part", "row"])
        table = table.join(bad, ["part", "row"], join_type="left anti", use_threads=False)  # _by_bucket sorts it
        return _by_bucket(store, rel, table, "sha256"), {"rows": table.num_rows}

    return run_unit(store, rel, exchange_hashes_key(parts, ingested, keydup), compute)


def find_exact_duplicates(store: Store, bucket: int, exchanged: str, group_size: int) -> UnitResult:
    """Byte-identical images in one hash bucket (``exchanged``: the combined digest of every
    group's hash file; records with a reused key were dropped there)."""
    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        by_hash: dict[str, list[dict[str, Any]]] = {}
        for r in store.dataset(DEDUP_HASHES_DIR, HASH_SCHEMA).to_table(filter=pc.field("bucket") == bucket).to_pylist():
            by_hash.setdefault(r["sha256"], []).append(r)
        decisions = []
        for group in by_hash.values():
            if len(group) < 2:
                continue
            winner = min(group, key=lambda r: (-r["pixels"], r["key"]))
            decisions += [{"part": r["part"], "row": r["row"], "duplicate_of": winner["key"]}
                          for r in group if r is not winner]
        return _write_decisions(store, exact_path(bucket), decisions, group_size), {"duplicates": len(decisions)}

    return run_unit(store, exact_path(bucket), exact_duplicates_key(bucket, group_size, exchanged), compute)


def deduplicate(store: Store, ingested: Iterable[str], n_parts: int, n_buckets: int, shard_size: int,
                resolved: Sink, fan_out: FanOut = in_process) -> StageSummary:
    """The whole stage over ingested partitions ``0..n_parts-1`` (``ingested``: their ingest
    digests, in order, read once): exchange and decide by bucket, then resolve. Each resolved
    partition's result goes to ``resolved(part, result)`` as its group finishes (a ledger:
    the flow holds none of them). Returns what was done with the exchange and decision units,
    of which only the digests are kept (O(groups + buckets) strings)."""
    groups = partition_groups(n_parts, n_buckets)
    size = len(groups[0])  # partitions per group (the last may have fewer)
    digests, inputs = iter(ingested), []
    for ps in groups:
        if len(chunk := list(itertools.islice(digests, len(ps)))) < len(ps):
            raise ValueError(f"ingest digests of {n_parts} partitions expected, {ps.start + len(chunk)} given")
        inputs.append(combine_digests(chunk))
    actions: Counter[str] = Counter()
    keys_x = combine_digests(_digests(fan_out, EXCHANGE_KEYS, [dict(store=store, group=g, parts=ps, ingested=inputs[g])
                                                               for g, ps in enumerate(groups)], actions))
    keydup = _digests(fan_out, DUPLICATE_KEYS, [dict(store=store, bucket=b, exchanged=keys_x, group_size=size)
                                                for b in range(n_buckets)], actions)
    keydup_digest = combine_digests(keydup)
    hashes_x = combine_digests(_digests(fan_out, EXCHANGE_HASHES, [
        dict(store=store, group=g, parts=ps, ingested=inputs[g], keydup=keydup_digest) for g, ps in enumerate(groups)],
        actions))
    exact = _digests(fan_out, EXACT_DUPLICATES, [dict(store=store, bucket=b, exchanged=hashes_x, group_size=size)
                                                 for b in range(n_buckets)], actions)
    decisions = combine_digests(keydup + exact)

    def each_partition(g: int, results: list[UnitResult]) -> None:
        for part, result in zip(groups[g], results, strict=True):
            resolved(part, result)

    fan_out.stream(RESOLVE, [dict(store=store, parts=ps, decisions=decisions, shard_size=shard_size) for ps in groups],
                   each_partition)
    return StageSummary("exact_dedup", actions[COMPUTED], actions[SKIPPED])


def _digests(fan_out: FanOut, unit: Unit, calls: list[dict[str, Any]], actions: Counter[str]) -> list[str]:
    """The digest of each unit of a fan-out, in order (its actions counted into ``actions``)."""
    digests = [""] * len(calls)

    def keep(i: int, result: UnitResult) -> None:
        digests[i] = result.digest
        actions[result.action] += 1

    fan_out.stream(unit, calls, keep)
    return digests


# (key decisions, exact-duplicate decisions) of a group: part -> row -> duplicate_of
GroupDecisions = tuple[dict[int, dict[int, str]], dict[int, dict[int, str]]]


def _decisions_by_part(store: Store, folder: str, parts: range) -> dict[int, dict[int, str]]:
    t = store.dataset(folder, DUPLICATE_SCHEMA).to_table(filter=_in_group(parts))
    found: dict[int, dict[int, str]] = {}
    for part, row, of in zip(t["part"].to_pylist(), t["row"].to_pylist(), t["duplicate_of"].to_pylist(), strict=True):
        found.setdefault(part, {})[row] = of
    return found


class ResolvedInfo(TypedDict):
    """A resolved partition's marker info: what the staging planner reads instead of rows."""

    part: int
    survivors: int
    candidates: list[list[Any]]  # [position among the survivors, staging shard name]


def resolve_group(store: Store, parts: range, decisions: str, shard_size: int) -> list[UnitResult[ResolvedInfo]]:
    """Fold the key and exact-duplicate decisions into each partition of a group (one unit
    per partition, fingerprinted with its ingest digest from its marker; ``decisions``: the
    combined digest of every decision file). The group's rows of the decision files are
    read once, and only when some partition is not current."""
    @functools.cache
    def group_decisions() -> GroupDecisions:
        return _decisions_by_part(store, KEYDUP_DIR, parts), _decisions_by_part(store, EXACT_DIR, parts)

    ingested = require_markers(store, [ingest_path(p) for p in parts], "ingest")  # read side by side
    return [_resolve_partition(store, p, marker.digest, decisions, shard_size, group_decisions)
            for p, marker in zip(parts, ingested, strict=True)]


def _resolve_partition(store: Store, part: int, ingest_digest: str, decisions: str, shard_size: int,
                       group_decisions: Callable[[], GroupDecisions]) -> UnitResult[ResolvedInfo]:
    """Fold key and exact-duplicate decisions into a partition's rows.

    The marker's info gives the staging planner what it needs without reading rows: the
    number of surviving records (valid, unique key, not a duplicate) and the staging cut
    candidates among them (:mod:`corpusforge.chunking`), as (position, name).
    """
    def compute() -> tuple[dict[str, str], ResolvedInfo]:
        rows = store.read_parquet(ingest_path(part)).to_pylist()
        keydups, exacts = group_decisions()
        dup_keys, dup_bytes = keydups.get(part, {}), exacts.get(part, {})
        survivors = 0
        candidates = []
        for r in rows:
            r["duplicate_of"] = None
            if dup_keys.get(r["row"]) == r["key"]:
                r["status"], r["reason"] = Status.ERROR.value, f"duplicate_key: {r['key']} appeared earlier in the input"
            elif r["row"] in dup_keys:
                r["status"], r["reason"] = Status.ERROR.value, (
                    f"key_case_collision: {r['key']} differs only in case from {dup_keys[r['row']]} earlier in the "
                    "input (their files would overwrite each other on a case-insensitive filesystem)")
            elif r["row"] in dup_bytes:
                r["status"], r["reason"] = Status.EXACT_DUPLICATE.value, "sha256_match"
                r["duplicate_of"] = dup_bytes[r["row"]]
            if r["status"] == Status.KEPT.value:
                if (name := cut_name(r["key"], shard_size)) is not None:
                    candidates.append([survivors, name])
                survivors += 1
        rel = resolved_path(part)
        sha = store.write_parquet(rel, pa.Table.from_pylist(rows, schema=RESOLVED_SCHEMA))
        return {rel: sha}, {"part": part, "survivors": survivors, "candidates": candidates}

    return run_unit(store, resolved_path(part), resolve_key(shard_size, ingest_digest, decisions), compute)


# The units of the stage, in the order :func:`deduplicate` runs them (all probed: their checks
# read markers only).
EXCHANGE_KEYS = Unit(exchange_keys, "exchange-keys", probe=True)
DUPLICATE_KEYS = Unit(find_duplicate_keys, "duplicate-keys", probe=True)
EXCHANGE_HASHES = Unit(exchange_hashes, "exchange-hashes", probe=True)
EXACT_DUPLICATES = Unit(find_exact_duplicates, "exact-duplicates", probe=True)
RESOLVE = Unit(resolve_group, "resolve-partitions", probe=True)
