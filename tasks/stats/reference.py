"""Reference statistics of a built corpus: per group, µ, Σ, n and a feature subsample.

A *group* is a set of kept records: a split (``test``, ``val``, ``train``), a train tier
(``train_nano`` ⊂ ``train_lite`` ⊂ ``train_full``: the manifest's ``tier`` column names
the smallest tier holding a record) or ``test_subset`` (GPIC's Test-50K: the test records
with the smallest ``blake2b(seed:key)``). Work per staging shard, so no process ever
holds more than one shard's features plus the partials:

1. :func:`scan_manifest` streams the manifest once: records per group, the staging shards
   that hold them, the Test-50K hash threshold and the manifest's hash.
2. :func:`shard_partials` reads one staging shard's features and, through
   ``staging/{shard}.records.parquet`` (key, part, row), only the manifest row groups of
   that shard's records; it returns per group the shard's :class:`Moments`, its
   :class:`KeyedSample` and the group's records that have no features (undecodable).
3. Partials merge pairwise in a tree (:func:`merge_partials`), identically on any worker
   count, and :func:`write_group_stats` writes per group::

    stats/{group}-{model_id}.npz           mu (d,), sigma (d, d) float64, n
    stats/{group}-{model_id}.features.npy  float32 [≤ sample.max_rows, d]: the deterministic subsample
    stats/{group}-{model_id}.json          provenance sidecar, written last
"""

from __future__ import annotations

import hashlib
import heapq
import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from corpusforge.hashing import stable_uniform
from corpusforge.records import Status
from corpusforge.storage import Store
from tasks.features.layout import feature_path, read_shard_errors, read_shard_features
from tasks.manifest import manifest_path
from tasks.stats.compare import compare
from tasks.stats.config import MetricsConfig, SampleConfig
from tasks.stats.moments import Moments
from tasks.stats.provenance import model_deviations
from tasks.stats.subsample import KeyedSample

SPLITS = ("train", "val", "test")
TEST_SUBSET = "test_subset"
FORMAT = "corpusforge-reference-stats/1"
MANIFEST_COLUMNS = ["key", "status", "split", "tier", "staging_shard"]


def stats_path(group: str, model_id: str) -> str:
    """Path stem of a group's statistics files (add .npz, .json, .features.npy)."""
    return f"stats/{group}-{model_id}"


@dataclass(frozen=True)
class GroupPlan:
    """Which groups to summarise and how a manifest row maps to them."""

    groups: tuple[str, ...]
    tiers: tuple[str, ...] = ("nano", "lite", "full")  # smallest first; the last is all of train
    subset_seed: int = 1
    subset_threshold: float | None = None  # test_subset: test rows with priority ≤ threshold

    def groups_of(self, key: str, split: str | None, tier: str | None) -> list[str]:
        out = [split] if split in self.groups else []
        if split == "train" and tier in self.tiers:
            out += [g for t in self.tiers[self.tiers.index(tier):] if (g := f"train_{t}") in self.groups]
        if (split == "test" and TEST_SUBSET in self.groups and self.subset_threshold is not None
                and stable_uniform(self.subset_seed, key) <= self.subset_threshold):
            out.append(TEST_SUBSET)
        return out

    def splits(self) -> set[str]:
        """Manifest splits any requested group draws from."""
        out = {g for g in self.groups if g in SPLITS}
        out |= {"train" for g in self.groups if g.startswith("train_")}
        out |= {"test" for g in self.groups if g == TEST_SUBSET}
        return out


def oracle_groups(tiers: Sequence[str]) -> tuple[str, ...]:
    """Real-vs-real groups compared with the test split (GPIC Table 2)."""
    return ("val", *(f"train_{t}" for t in tiers), TEST_SUBSET)


@dataclass
class ReferencePlan:
    plan: GroupPlan
    shards: list[str]  # staging shards holding a record of some group
    counts: dict[str, int]  # kept records per group in the manifest
    manifest_sha256: str


def manifest_files(store: Store) -> list[str]:
    return [f"manifest/{n}" for n in store.listdir("manifest") if n.endswith(".parquet")]


def manifest_sha256(store: Store) -> str:
    """One hash over the manifest files' names and contents (reads them once)."""
    h = hashlib.sha256()
    for rel in manifest_files(store):
        h.update(f"{rel}:{store.sha256(rel)}\n".encode())
    return h.hexdigest()


def scan_manifest(store: Store, groups: Sequence[str], tiers: Sequence[str] = ("nano", "lite", "full"),
                  subset_size: int = 50_000, subset_seed: int = 1) -> ReferencePlan:
    """Stream the manifest once (batches, a few columns): counts, shards, Test-50K threshold."""
    base = GroupPlan(tuple(groups), tuple(tiers), subset_seed)
    files = manifest_files(store)
    if not files:
        raise FileNotFoundError(f"no manifest parquet files under {store.path('manifest')}")
    dataset = ds.dataset([store.fs._strip_protocol(store.path(f)) for f in files], format="parquet",
                         filesystem=store.fs)
    wanted = ds.field("status") == Status.KEPT.value
    wanted &= ds.field("split").isin(sorted(base.splits()))
    shards: set[str] = set()
    counts: Counter[str] = Counter()
    heap: list[float] = []  # negated priorities of the subset_size smallest test keys
    subset = TEST_SUBSET in base.groups
    for batch in dataset.to_batches(columns=MANIFEST_COLUMNS, filter=wanted):
        cols = batch.to_pydict()
        shards.update(s for s in cols["staging_shard"] if s is not None)
        for key, split, tier in zip(cols["key"], cols["split"], cols["tier"], strict=True):
            counts.update(base.groups_of(key, split, tier))
            if subset and split == "test":
                p = -stable_uniform(subset_seed, key)
                if len(heap) < subset_size:
                    heapq.heappush(heap, p)
                elif p > heap[0]:
                    heapq.heapreplace(heap, p)
    threshold = -heap[0] if subset and heap else None
    if subset:
        counts[TEST_SUBSET] = len(heap)
    plan = GroupPlan(base.groups, base.tiers, subset_seed, threshold)
    return ReferencePlan(plan, sorted(shards), {g: counts.get(g, 0) for g in plan.groups}, manifest_sha256(store))


def shard_membership(store: Store, shard: str) -> list[tuple[str, str | None, str | None]]:
    """``(key, split, tier)`` of the shard's kept records, read from the manifest.

    Only the manifest parts named in the shard's records file are opened, and in each
    only the row groups whose ``row`` range overlaps the shard's rows.
    """
    records = store.read_parquet(f"staging/{shard}.records.parquet", columns=["key", "part", "row"])
    out: list[tuple[str, str | None, str | None]] = []
    for part in sorted(set(records["part"].to_pylist())):
        rows = pc.filter(records["row"], pc.equal(records["part"], part))
        lo, hi = pc.min(rows).as_py(), pc.max(rows).as_py()
        with store.open(manifest_path(part)) as f:
            table = pq.read_table(f, columns=["key", "status", "split", "tier", "staging_shard"],
                                  filters=[("row", ">=", lo), ("row", "<=", hi)])
        for key, status, split, tier, sshard in zip(*(table[c].to_pylist() for c in table.column_names),
                                                   strict=True):
            if sshard == shard and status == Status.KEPT.value:
                out.append((key, split, tier))
    return out


@dataclass
class GroupPartial:
    """One group's summary over some shards."""

    moments: Moments
    sample: KeyedSample
    missing: Counter[str] = field(default_factory=Counter)  # records without features, by reason

    def merge(self, other: GroupPartial) -> GroupPartial:
        return GroupPartial(self.moments.merge(other.moments), self.sample.merge(other.sample),
                            self.missing + other.missing)


@dataclass
class ShardPartial:
    """Per-group partials of one or more shards, plus the feature markers they came from."""

    groups: dict[str, GroupPartial]
    markers: dict[str, dict[str, Any]]  # fingerprint -> marker facts (one entry unless features are mixed)


def _marker_facts(marker: dict[str, Any]) -> dict[str, Any]:
    return {k: marker.get(k) for k in ("fingerprint", "model", "dtype", "decode_size", "code_version", "random_init")}


def shard_partials(store: Store, model_id: str, shard: str, plan: GroupPlan, sample: SampleConfig) -> ShardPartial:
    """Summarise one staging shard's features for every group of ``plan``."""
    members = [(k, plan.groups_of(k, s, t)) for k, s, t in shard_membership(store, shard)]
    members = [(k, g) for k, g in members if g]
    marker = store.read_done(feature_path(model_id, shard))
    if marker is None:
        raise FileNotFoundError(f"features/{model_id}/{shard} is not complete: extract features first")
    keys, feats = read_shard_features(store, model_id, shard)
    row_of = {k: i for i, k in enumerate(keys)}
    errors = read_shard_errors(store, model_id, shard)
    dim = feats.shape[1]
    out: dict[str, GroupPartial] = {}
    for group in plan.groups:
        in_group = [k for k, g in members if group in g]
        present = [k for k in in_group if k in row_of]
        missing = Counter(errors.get(k, "no feature row").split(":", 1)[0] for k in in_group if k not in row_of)
        rows = feats[[row_of[k] for k in present]] if present else np.zeros((0, dim), feats.dtype)
        out[group] = GroupPartial(Moments.of(rows) if present else Moments.empty(dim),
                                  KeyedSample.of(present, rows, sample.max_rows, sample.seed), missing)
    return ShardPartial(out, {marker["fingerprint"]: _marker_facts(marker)})


def merge_partials(a: ShardPartial, b: ShardPartial) -> ShardPartial:
    """Union of two shard partials (associative; merge in a fixed tree for bitwise stability)."""
    return ShardPartial({g: a.groups[g].merge(b.groups[g]) for g in a.groups}, {**a.markers, **b.markers})


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # zip members get the fixed 1980 timestamp: same arrays, same bytes
    return buf.getvalue()


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def reference_deviations(marker: dict[str, Any], sample: SampleConfig, missing: int) -> list[str]:
    """How a reference departs from GPIC's protocol, beyond the model itself."""
    out = model_deviations(marker["model"])
    if marker.get("dtype") != "float32":
        out.append(f"features stored as {marker.get('dtype')} (statistics of rounded features)")
    if marker.get("decode_size"):
        out.append(f"JPEGs decoded with draft scaling to ≥ {marker['decode_size']} px before the gpic_eval "
                   "resize (GPIC resizes from full resolution)")
    if sample.max_rows != 10_000:
        out.append(f"{sample.max_rows} stored reference rows for PRDC/MMD instead of 10,000")
    if missing:
        out.append(f"{missing} records of the group have no features (undecodable) and are excluded")
    return out


def write_group_stats(store: Store, group: str, model_id: str, partial: GroupPartial,
                      marker: dict[str, Any], plan: ReferencePlan, sample: SampleConfig,
                      code_version: str) -> dict[str, Any]:
    """Write a group's npz and feature sample, then its provenance sidecar (last)."""
    m = partial.moments
    if m.n < 2:
        raise ValueError(f"group {group}: {m.n} feature rows, need at least 2 for a covariance")
    stem = stats_path(group, model_id)
    npz_sha = store.write_bytes(f"{stem}.npz", _npz_bytes(mu=m.mean, sigma=m.covariance(), n=np.int64(m.n)))
    feats_sha = store.write_bytes(f"{stem}.features.npy", _npy_bytes(partial.sample.features.astype(np.float32)))
    missing = sum(partial.missing.values())
    sidecar = {
        "format": FORMAT,
        "group": group,
        "model_id": model_id,
        "model": marker["model"],
        "random_init": bool(marker["model"].get("random_init")),
        "preprocessing": marker["model"].get("preprocessing"),
        "feature_fingerprint": marker["fingerprint"],
        "feature_dtype": marker.get("dtype"),
        "decode_size": marker.get("decode_size"),
        "feature_code_version": marker.get("code_version"),
        "n": m.n,
        "dim": m.dim,
        "manifest_records": plan.counts.get(group, 0),
        "missing_features": dict(sorted(partial.missing.items())),
        "manifest_sha256": plan.manifest_sha256,
        "code_version": code_version,
        "subsample": {"rows": len(partial.sample.keys), "max_rows": sample.max_rows, "seed": sample.seed,
                      "method": "rows with the smallest blake2b(seed:key) priority, sorted by priority"},
        "selection": _selection(group, plan.plan),
        "files": {"npz": {"path": f"{stem}.npz", "sha256": npz_sha},
                  "features": {"path": f"{stem}.features.npy", "sha256": feats_sha}},
        "protocol_deviations": reference_deviations(marker, sample, missing),
    }
    store.write_json(f"{stem}.json", sidecar)
    return sidecar


def _selection(group: str, plan: GroupPlan) -> str:
    if group == TEST_SUBSET:
        return (f"test records with blake2b({plan.subset_seed}:key) priority ≤ {plan.subset_threshold!r} "
                "(the smallest priorities)")
    if group.startswith("train_"):
        tier = group.removeprefix("train_")
        return f"train records in tier {tier} (manifest tier ∈ {list(plan.tiers[:plan.tiers.index(tier) + 1])})"
    return f"kept records of split {group}"


def oracle_metrics(groups: dict[str, GroupPartial], reference: str, cfg: MetricsConfig) -> dict[str, Any]:
    """Real-vs-real metrics of every other group against ``reference`` (GPIC Table 2, B.2).

    PRDC and MMD use the groups' stored subsamples. Rows shared by two groups (Test-50K
    is part of test) are not removed, as GPIC does not say it removes them.
    """
    ref = groups[reference]
    out: dict[str, Any] = {}
    for name, part in groups.items():
        if name == reference or part.moments.n < 2:
            continue
        m = part.moments
        out[name] = {"n": m.n, **compare(m.mean, m.covariance(), part.sample.features, ref.moments.mean,
                                         ref.moments.covariance(), ref.sample.features, cfg)}
    return out
