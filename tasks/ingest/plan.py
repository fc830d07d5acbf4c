"""The ingest package's units planned before a run: ingest partitions, the exact-dedup
exchange and resolve, each judged with the key its unit computes (``corpusforge plan``; how a
unit whose inputs are not yet known is judged: :func:`corpusforge.plans.judge_unit`).
"""

from __future__ import annotations

from corpusforge.contract import SKIPPED, explain, read_marker
from corpusforge.layout import part_name
from tasks.ingest.files import (DEDUP_HASHES_DIR, DEDUP_KEYS_DIR, EXACT_DIR, INGEST_DIR, KEYDUP_DIR, RESOLVED_DIR,
                                bucket_name, dedup_group_name, dedup_hashes_path, dedup_keys_path, exact_path,
                                ingest_path, keydup_path, resolved_path)
from corpusforge.plans import StagePlan, deletions, judge_unit
from corpusforge.storage import Store
from tasks.ingest.exact_dedup import (combine_digests, duplicate_keys_key, exact_duplicates_key, exchange_hashes_key,
                                      exchange_keys_key, partition_groups, resolve_key)
from tasks.ingest.licenses import LicenseConfig
from tasks.ingest.partition import ingest_key
from tasks.ingest.sources import Partition, SourceConfig
from tasks.shared.validate import ValidationConfig

# The config behind the positions of the keys' configs (explain names positions).
INGEST_NAMES = {"[0]": "validation", "[1]": "hash buckets (staging.buckets)", "[2]": "input.allow_roots"}
RESOLVE_NAMES = {"config config": "config staging.shard_size"}
# Exact dedup's keys hold no setting: a group's partition range, a bucket's index and the
# partitions per group. They change when the input has more or fewer partitions.
_REGROUPED = "the input's partitions were regrouped (partitions added or removed)"
EXACT_NAMES = {"config [0], [1]": _REGROUPED, "config [0]": _REGROUPED, "config [1]": _REGROUPED}


def plan_units(store: Store, scratch: Store, parts: list[Partition], src: SourceConfig, val: ValidationConfig,
               lic: LicenseConfig | None, n_buckets: int, shard_size: int,
               fetch: StagePlan | None = None) -> list[StagePlan]:
    """The ingest, exact_dedup and resolve stages' units over ``parts`` (from
    :func:`tasks.ingest.sources.cut_partitions`, whose chunks are in ``scratch``).
    The resolve plan's ``outputs`` are the markers of the partitions it skips. ``fetch``: a URL
    list's fetch plan (:mod:`tasks.ingest.fetch.plan`), whose skipped units' ledger digests the
    ingest keys read."""
    names = [part_name(p.index) for p in parts]
    ingest = StagePlan("ingest", names=INGEST_NAMES)
    for p in parts:
        marker = read_marker(store, ingest_path(p.index))
        fetched = fetch.outputs.get(names[p.index]) if fetch else None  # "?" while a URL list's ledger is unknown
        key = ingest_key(scratch, p, src, val, n_buckets, lic, fetched or "?")  # only a URL list's key reads it
        action, reason = explain(marker, key, inputs_known=p.kind != "urls" or fetched is not None)
        ingest.add(names[p.index], action, reason)
        if action == SKIPPED and marker is not None:
            ingest.outputs[names[p.index]] = marker.digest
    deletions(ingest, store, INGEST_DIR, ".parquet", names)

    # exact dedup's units in the order tasks.ingest.exact_dedup.deduplicate runs them
    digests = [ingest.outputs.get(n) for n in names]
    groups = partition_groups(len(parts), n_buckets)
    size = len(groups[0]) if groups else 0
    inputs = [combined(digests[ps.start:ps.stop]) for ps in groups]
    buckets = [bucket_name(b) for b in range(n_buckets)]
    group_names = [dedup_group_name(g) for g in range(len(groups))]
    exact = StagePlan("exact_dedup", names=EXACT_NAMES)
    keys_x = [judge_unit(exact, store, dedup_keys_path(g), f"key exchange {group_names[g]}", exchange_keys_key, ps,
                         inputs[g]) for g, ps in enumerate(groups)]
    keydup = [judge_unit(exact, store, keydup_path(b), f"keys {buckets[b]}", duplicate_keys_key, b, size,
                         combined(keys_x)) for b in range(n_buckets)]
    hashes_x = [judge_unit(exact, store, dedup_hashes_path(g), f"hash exchange {group_names[g]}",
                           exchange_hashes_key, ps, inputs[g], combined(keydup)) for g, ps in enumerate(groups)]
    exact_out = [judge_unit(exact, store, exact_path(b), f"hashes {buckets[b]}", exact_duplicates_key, b, size,
                            combined(hashes_x)) for b in range(n_buckets)]
    deletions(exact, store, DEDUP_KEYS_DIR, ".parquet", group_names, prefix="key exchange ")
    deletions(exact, store, KEYDUP_DIR, ".parquet", buckets, prefix="keys ")
    deletions(exact, store, DEDUP_HASHES_DIR, ".parquet", group_names, prefix="hash exchange ")
    deletions(exact, store, EXACT_DIR, ".parquet", buckets, prefix="hashes ")

    resolve = StagePlan("resolve", names=RESOLVE_NAMES)
    decisions = combined(keydup + exact_out)
    for i, name in enumerate(names):
        marker = judge_unit(resolve, store, resolved_path(i), name, resolve_key, shard_size, digests[i], decisions,
                            full=True)
        if marker is not None:
            resolve.outputs[name] = marker
    deletions(resolve, store, RESOLVED_DIR, ".parquet", names)
    return [ingest, exact, resolve]


def combined(digests: list[str | None]) -> str | None:
    """The combined digest a task of the run takes (None while any of them is unknown)."""
    return combine_digests(digests) if all(d is not None for d in digests) else None
