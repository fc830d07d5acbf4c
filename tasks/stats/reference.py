"""Reference statistics of a built corpus: per group, µ, Σ, n and a feature subsample.

A *group* is a set of kept records: a split (``test``, ``val``, ``train``), a train tier
(``train_nano`` ⊂ ``train_lite`` ⊂ ``train_full``: the manifest's ``tier`` column names
the smallest tier holding a record) or ``test_subset`` (GPIC's Test-50K: the test records
with the smallest ``blake2b(seed:key)``). Work per staging shard, so no process ever
holds more than one shard's features plus the partials:

1. :func:`scan_manifest` streams the manifest once and fixes everything row-dependent;
2. :func:`shard_partials` summarises one staging shard's features per group (:class:`Moments`,
   8 MB at d = 1024, and its sampled rows), reading only the manifest row groups of that shard's
   records; :func:`batch_partials` folds a contiguous run of shards into one partial, so the
   number of partials in flight is bounded however many shards there are;
3. partials merge pairwise in a fixed tree (:func:`merge_partials`), identically on any worker
   count, and :func:`write_group_stats` writes each group's files (tasks/stats/files.py), the
   provenance sidecar last.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpusforge.contract import Marker
from corpusforge.feature_files import read_shard_errors, read_shard_features, require_features
from corpusforge.hashing import fingerprint, stable_uniform
from corpusforge.layout import MANIFEST_DIR, manifest_path, staging_records
from tasks.stats.files import GPIC_TEST_STATS
from corpusforge.records import Status
from corpusforge.storage import Store
from tasks.shared.features.extract import Selection
from tasks.stats.compare import compare
from tasks.stats.config import MetricsConfig, SampleConfig
from tasks.stats.gpic_stats import gpic_stats_bytes, npz_bytes
from tasks.stats.moments import Moments
from tasks.shared.provenance import model_deviations
from tasks.shared.sampling import SmallestKeys
from tasks.stats.subsample import KeyedSample

SPLITS = ("train", "val", "test")
TEST_SUBSET = "test_subset"
FORMAT = "corpusforge-reference-stats/1"
MANIFEST_COLUMNS = ["key", "status", "split", "tier", "staging_shard"]


def stats_path(group: str, model_id: str) -> str:
    """Path stem of a group's statistics files (add .npz, .json, .features.npy)."""
    return f"stats/{group}-{model_id}"


@dataclass(frozen=True)
class GroupRule:
    """Which groups to summarise, how a manifest row maps to them, which rows are sampled."""

    groups: tuple[str, ...]
    tiers: tuple[str, ...] = ("nano", "lite", "full")  # smallest first; the last is all of train
    subset_seed: int = 1
    subset_threshold: float | None = None  # test_subset: test rows with priority ≤ threshold
    sample_rows: int = 10_000
    sample_seed: int = 0
    # per group: rows with blake2b(sample_seed:key) ≤ threshold form the stored subsample
    sample_thresholds: dict[str, float] = field(default_factory=dict)

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
class ManifestScan:
    rule: GroupRule
    shards: list[str]  # staging shards holding a record of some group
    counts: dict[str, int]  # kept records per group in the manifest
    manifest_sha256: str
    # kept records of the summarised splits per staging shard: the extraction's work per shard
    shard_records: dict[str, int] = field(default_factory=dict)

    def largest_first(self) -> list[str]:
        """The shards by decreasing work (name breaks ties): submitted in this order, a few
        workers finish together instead of one embedding the largest shard last while the
        others idle (greedy longest-first scheduling; the outputs do not depend on the order)."""
        return sorted(self.shards, key=lambda s: (-self.shard_records.get(s, 0), s))


def manifest_files(store: Store) -> list[str]:
    return [f"{MANIFEST_DIR}/{n}" for n in store.listdir(MANIFEST_DIR) if n.endswith(".parquet")]


def manifest_sha256(store: Store) -> str:
    """One hash over the manifest files' names and contents (reads them once)."""
    h = hashlib.sha256()
    for rel in manifest_files(store):
        h.update(f"{rel}:{store.sha256(rel)}\n".encode())
    return h.hexdigest()


def _kept_rows(store: Store, files: list[str], splits: pa.Array) -> Iterator[pa.RecordBatch]:
    """The kept rows of ``splits`` in the manifest files, in batches, one file open at a time: a
    ``pyarrow.dataset`` over every file kept each file's metadata once read (~0.1 MB per manifest
    part measured, O(partitions): 20 GB at 10⁸ records)."""
    for rel in files:
        with store.open(rel) as f:
            for batch in pq.ParquetFile(f).iter_batches(columns=MANIFEST_COLUMNS, use_threads=False):
                yield batch.filter(pc.and_(pc.equal(batch["status"], Status.KEPT.value),
                                           pc.is_in(batch["split"], value_set=splits)))


def scan_manifest(store: Store, groups: Sequence[str], sample: SampleConfig = SampleConfig(),
                  tiers: Sequence[str] = ("nano", "lite", "full"), subset_size: int = 50_000,
                  subset_seed: int = 1) -> ManifestScan:
    """Stream the manifest once (batches, a few columns) and fix everything row-dependent.

    Counts per group, the staging shards to read, the Test-50K threshold and, per group,
    the priority threshold of its ``sample.max_rows`` stored rows. Knowing the sample
    thresholds up front keeps shard partials small: together they hold at most
    ``max_rows`` sampled rows per group, however many shards there are. Memory is
    O(shards + groups × max_rows + subset_size); time is one Python pass over the rows.
    """
    base = GroupRule(tuple(groups), tuple(tiers), subset_seed, None, sample.max_rows, sample.seed)
    files = manifest_files(store)
    if not files:
        raise FileNotFoundError(f"no manifest parquet files under {store.path('manifest')}")
    splits = pa.array(sorted(base.splits()), pa.string())
    shards: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    samples = {g: SmallestKeys(sample.max_rows, sample.seed) for g in base.groups}
    subset = SmallestKeys(subset_size, subset_seed) if TEST_SUBSET in base.groups else None
    for batch in _kept_rows(store, files, splits):
        cols = batch.to_pydict()
        shards.update(s for s in cols["staging_shard"] if s is not None)  # records per shard
        members: dict[str, tuple[list[str], list[float]]] = {g: ([], []) for g in base.groups}
        for key, split, tier in zip(cols["key"], cols["split"], cols["tier"], strict=True):
            in_groups = base.groups_of(key, split, tier)
            counts.update(in_groups)
            if in_groups:
                priority = stable_uniform(sample.seed, key)  # once per row, not once per group
                for g in in_groups:
                    members[g][0].append(key)
                    members[g][1].append(priority)
        for g, (keys, priorities) in members.items():
            samples[g].add(keys, np.array(priorities, np.float64))
        if subset is not None:
            subset.add([k for k, split in zip(cols["key"], cols["split"], strict=True) if split == "test"])
    threshold = None
    if subset is not None:
        threshold = subset.threshold()
        chosen = sorted(subset.keys())
        counts[TEST_SUBSET] = len(chosen)
        samples[TEST_SUBSET].add(chosen)
    rule = GroupRule(base.groups, base.tiers, subset_seed, threshold, sample.max_rows, sample.seed,
                     {g: h.threshold() for g, h in samples.items()})
    return ManifestScan(rule, sorted(shards), {g: counts.get(g, 0) for g in rule.groups}, manifest_sha256(store),
                        dict(sorted(shards.items())))


def cut_batches(shards: Sequence[str], max_tasks: int, min_shards: int = 1) -> list[list[str]]:
    """Contiguous runs of shards, at most ``max_tasks`` of them and of at least ``min_shards``
    shards each where there are enough, sizes differing by ≤ 1."""
    n = len(shards)
    tasks = max(1, min(max_tasks, n // max(min_shards, 1)))
    bounds = [n * i // tasks for i in range(tasks + 1)]
    return [list(shards[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def shard_membership(store: Store, shard: str) -> list[tuple[str, str | None, str | None]]:
    """``(key, split, tier)`` of the shard's kept records, read from the manifest: only the parts named
    in the shard's records file, and in each only the row groups whose ``row`` range overlaps the shard's."""
    records = store.read_parquet(staging_records(shard), columns=["key", "part", "row"])
    out: list[tuple[str, str | None, str | None]] = []
    for part in sorted(set(records["part"].to_pylist())):
        rows = pc.filter(records["row"], pc.equal(records["part"], part))
        lo, hi = pc.min(rows).as_py(), pc.max(rows).as_py()
        with store.open(manifest_path(part)) as f:
            table = pq.read_table(f, columns=MANIFEST_COLUMNS, filters=[("row", ">=", lo), ("row", "<=", hi)])
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


def _marker_facts(marker: Marker) -> dict[str, Any]:
    """What the statistics depend on of a shard's features: the same for every shard of one run."""
    facts = {k: marker.info.get(k) for k in ("model", "dtype", "decode_size", "random_init")}
    return {"fingerprint": fingerprint(facts), **facts}


@dataclass(frozen=True)
class GroupSelection(Selection):
    """The records of a shard in some group of ``rule``: what the statistics embed."""

    rule: GroupRule = field(default_factory=lambda: GroupRule(()))

    def keys(self, store: Store, shard: str) -> set[str]:
        return {k for k, s, t in shard_membership(store, shard) if self.rule.groups_of(k, s, t)}


def shard_partials(store: Store, model_id: str, shard: str, rule: GroupRule, subset: str | None = None
                   ) -> ShardPartial:
    """Summarise one staging shard's features (of every image, or of ``subset``) for every group of ``rule``."""
    members = [(k, rule.groups_of(k, s, t)) for k, s, t in shard_membership(store, shard)]
    members = [(k, g) for k, g in members if g]
    marker = require_features(store, model_id, shard, subset)
    keys, feats = read_shard_features(store, model_id, shard, subset)
    row_of = {k: i for i, k in enumerate(keys)}
    errors = read_shard_errors(store, model_id, shard, subset)
    priority = {k: stable_uniform(rule.sample_seed, k) for k, _ in members}
    dim = feats.shape[1]
    out: dict[str, GroupPartial] = {}
    for group in rule.groups:
        in_group = [k for k, g in members if group in g]
        present = [k for k in in_group if k in row_of]
        missing = Counter(errors.get(k, "no feature row").split(":", 1)[0] for k in in_group if k not in row_of)
        rows = feats[[row_of[k] for k in present]] if present else np.zeros((0, dim), feats.dtype)
        limit = rule.sample_thresholds.get(group, -1.0)
        sampled = [i for i, k in enumerate(present) if priority[k] <= limit]
        out[group] = GroupPartial(Moments.of(rows),
                                  KeyedSample.of([present[i] for i in sampled], rows[sampled], rule.sample_rows,
                                                 rule.sample_seed), missing)
    facts = _marker_facts(marker)
    return ShardPartial(out, {facts["fingerprint"]: facts})


def batch_partials(store: Store, model_id: str, shards: Sequence[str], rule: GroupRule,
                   subsets: dict[str, str | None] | None = None) -> ShardPartial:
    """One task's work: a contiguous run of shards, summarised and merged in order
    (``subsets``: where each shard's features are, see :func:`shard_partials`)."""
    where = subsets or {}
    total = shard_partials(store, model_id, shards[0], rule, where.get(shards[0]))
    for shard in shards[1:]:
        total = merge_partials(total, shard_partials(store, model_id, shard, rule, where.get(shard)))
    return total


def merge_partials(a: ShardPartial, b: ShardPartial) -> ShardPartial:
    """Union of two partials (associative; merge in a fixed tree for bitwise stability)."""
    return ShardPartial({g: a.groups[g].merge(b.groups[g]) for g in a.groups}, {**a.markers, **b.markers})


def reference_deviations(marker: dict[str, Any], rule: GroupRule, missing: int) -> list[str]:
    """How a reference departs from GPIC's protocol, beyond the model itself."""
    out = model_deviations(marker["model"])
    if marker.get("dtype") != "float32":
        out.append(f"features stored as {marker.get('dtype')} (statistics of rounded features)")
    if marker.get("decode_size"):
        out.append(f"JPEGs decoded with draft scaling to ≥ {marker['decode_size']} px before the gpic_eval "
                   "resize (GPIC resizes from full resolution)")
    if rule.sample_rows != 10_000:
        out.append(f"{rule.sample_rows} stored reference rows for PRDC/MMD instead of 10,000")
    if missing:
        out.append(f"{missing} records of the group have no features (undecodable) and are excluded")
    return out


def write_group_stats(store: Store, group: str, model_id: str, partial: GroupPartial,
                      marker: dict[str, Any], scan: ManifestScan, code_version: str,
                      caption_set: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write a group's npz and feature sample, then its provenance sidecar (last); the
    corpus's evaluation caption set, when given, is named in it (what generation should use)."""
    m = partial.moments
    if m.n < 2:
        raise ValueError(f"group {group}: {m.n} feature rows, need at least 2 for a covariance")
    stem = stats_path(group, model_id)
    npz_sha = store.write_bytes(f"{stem}.npz", npz_bytes(mu=m.mean, sigma=m.covariance(), n=np.int64(m.n)))
    feats_sha = store.write_npy(f"{stem}.features.npy", partial.sample.features.astype(np.float32))
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
        "n": int(m.n),
        "dim": m.dim,
        "manifest_records": scan.counts.get(group, 0),
        "missing_features": dict(sorted(partial.missing.items())),
        "manifest_sha256": scan.manifest_sha256,
        "code_version": code_version,
        "subsample": {"rows": len(partial.sample.keys), "max_rows": scan.rule.sample_rows,
                      "seed": scan.rule.sample_seed,
                      "method": "the max_rows records of the group with the smallest blake2b(seed:key) priority "
                                "(those without features left out), sorted by priority"},
        "selection": _selection(group, scan.rule),
        "files": {"npz": {"path": f"{stem}.npz", "sha256": npz_sha},
                  "features": {"path": f"{stem}.features.npy", "sha256": feats_sha}},
        "protocol_deviations": reference_deviations(marker, scan.rule, missing),
    }
    if caption_set is not None:
        sidecar["eval_captions"] = caption_set
    if group == "test" and "dinov2" in str(marker["model"].get("arch")):
        sidecar["files"]["gpic_npz"] = {
            "path": GPIC_TEST_STATS, "embeddings": len(partial.sample.keys),
            "sha256": store.write_bytes(GPIC_TEST_STATS, gpic_stats_bytes(
                m.mean, m.covariance(), partial.sample.features.astype(np.float32))),
            "note": "gpic-eval's key names for this sidecar's µ, Σ and subsample (dino_embeddings = the "
                    "subsample above, sample.max_rows rows, seeded)"}
    store.write_json(f"{stem}.json", sidecar)
    return sidecar


def _selection(group: str, rule: GroupRule) -> str:
    if group == TEST_SUBSET:
        return (f"test records with blake2b({rule.subset_seed}:key) priority ≤ {rule.subset_threshold!r} "
                "(the smallest priorities)")
    if group.startswith("train_"):
        tier = group.removeprefix("train_")
        return f"train records in tier {tier} (manifest tier ∈ {list(rule.tiers[:rule.tiers.index(tier) + 1])})"
    return f"kept records of split {group}"


def oracle_metrics(groups: dict[str, GroupPartial], reference: str, cfg: MetricsConfig) -> dict[str, Any]:
    """Real-vs-real metrics of every other group against ``reference`` (GPIC Table 2, B.2), PRDC and
    MMD on the groups' stored subsamples. Rows shared by two groups (Test-50K is part of test) are
    not removed, as GPIC does not say it removes them."""
    ref = groups[reference]
    out: dict[str, Any] = {}
    for name, part in groups.items():
        if name == reference or part.moments.n < 2:
            continue
        m = part.moments
        out[name] = {"n": m.n, **compare(m.mean, m.covariance(), part.sample.features, ref.moments.mean,
                                         ref.moments.covariance(), ref.sample.features, cfg)}
    return out
