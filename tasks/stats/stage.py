"""The reference-statistics stage (GPIC §3): µ, Σ and a feature subsample per split.

Table of contents of :func:`reference_stats_stage`:

    scan the manifest (one task: groups, their staging shards, Test-50K threshold, manifest hash)
    → features of only the groups' records in those shards (the feature stage with a
      selection, one task per shard submitted largest first: docs/statistics.md)
    → partials (n, mean, scatter matrix, sampled rows per group) over contiguous runs of
      staging shards, at most ``max_partials`` tasks
    → pairwise tree merge of the partials → stats/{group}-{model_id}.{npz,features.npy,json}
    → with ``oracle``: real-vs-real metrics against test → stats/oracle.json

Every partial and every merge is a unit run through the flow's fan-out (a task on its Dask
cluster); the runs and the merge tree depend only on the shard list and ``max_partials``,
so results are the same bit for bit on any number of workers.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any, Literal, TypedDict

from pydantic import Field, model_validator

from corpusforge.config import FlowConfig
from corpusforge.contract import (FanOut, Unit, in_process, keyed, prune, record_step, require_markers, step_call,
                                  step_result)
from corpusforge.feature_files import prune_subset
from corpusforge.hashing import fingerprint
from corpusforge.layout import feature_vectors
from tasks.stats.files import GPIC_TEST_STATS, STATS_DIR
from corpusforge.logs import stage_logger
from corpusforge.storage import Store, file_stamp
from corpusforge.version import code_version
from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig
from tasks.shared.features.extract import extract_features, receipt_section
from tasks.stats.config import MetricsConfig, SampleConfig, protocol_model
from tasks.shared.provenance import model_deviations
from tasks.stats.reference import (GroupRule, GroupSelection, ManifestScan, batch_partials, manifest_files,
                                   merge_partials, oracle_groups, oracle_metrics, cut_batches, scan_manifest,
                                   write_group_stats)

ORACLE_PATH = f"{STATS_DIR}/oracle.json"
STATS_SUBSET = "stats"  # features/{model}/subsets/stats/: features of only the summarised groups' records


class ReferenceStatsConfig(FlowConfig):
    """What to summarise and how: splits, oracles, feature model, subsample, metrics.

    The build flow takes these as its ``reference_stats`` section; the standalone flow
    adds the corpus root and the cluster (:class:`ReferenceStatsFlowParams`)."""

    splits: list[Literal["train", "val", "test"]] = Field(["test"], min_length=1, title="Splits",
                                                          description="Splits to summarise (GPIC: test).")
    oracle: bool = Field(False, title="Oracle references",
                         description="Also summarise val, every train tier and a test subset, and write their "
                                     "real-vs-real metrics against test to stats/oracle.json (GPIC Table 2).")
    tiers: list[str] = Field(["nano", "lite", "full"], min_length=1, title="Train tiers",
                             description="Tier names, smallest first, as in the manifest's tier column.")
    test_subset: int = Field(50_000, ge=2, title="Test subset size",
                             description="Size of the oracle's Test-50K (test records with the smallest hash).")
    test_subset_seed: int = Field(1, title="Test subset seed")
    model: ModelSpec = Field(default_factory=protocol_model, title="Feature model",
                             description="Default: DINOv2 ViT-L/14 without registers, gpic_eval preprocessing.")
    feature_dtype: Literal["float32", "float16"] = Field(
        "float32", title="Stored feature dtype", description="float16 rounds features before the statistics.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, title="Model runtime")
    torchscript_allowlist: list[str] = Field(default_factory=list, title="TorchScript allow-list")
    extract: bool = Field(True, title="Extract missing features",
                          description="Run the feature stage on the groups' records first (finished shards are "
                                      "skipped); off: read existing features of every image.")
    sample: SampleConfig = Field(default_factory=SampleConfig, title="Stored feature subsample")
    max_partials: int = Field(256, ge=1, title="Partial tasks",
                              description="At most this many partial tasks, each over a contiguous run of staging "
                                          "shards: bounds the 8 MB (d = 1024) scatter matrices per group in flight.")
    min_shards_per_partial: int = Field(
        16, ge=1, title="Shards per partial task",
        description="At least this many staging shards per partial task (where there are that many): a task "
                    "costs a scheduling round trip (~0.2 s), one shard's partial a few milliseconds per "
                    "hundred records, so a small corpus gets a few partials rather than one per shard.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, title="Oracle metrics")

    @model_validator(mode="after")
    def _oracle_needs_test(self) -> ReferenceStatsConfig:
        if self.oracle and "test" not in self.splits:
            raise ValueError("oracle references are measured against test: add 'test' to splits")
        return self

    def groups(self) -> tuple[str, ...]:
        extra = oracle_groups(self.tiers) if self.oracle else ()
        return tuple(dict.fromkeys([*self.splits, *extra]))

    def features(self) -> FeaturesConfig:
        return FeaturesConfig(models=[self.model], dtype=self.feature_dtype, runtime=self.runtime,
                              torchscript_allowlist=self.torchscript_allowlist)


class ManifestScanJson(TypedDict):
    """:class:`ManifestScan` as JSON, field for field; its rule keeps the key ``plan`` that markers
    written before the rename hold (docs/architecture.md, "One word per meaning")."""

    plan: dict[str, Any]  # ManifestScan.rule
    shards: list[str]
    counts: dict[str, int]
    manifest_sha256: str
    shard_records: dict[str, int]


def scan_manifest_json(store: Store, **kwargs: Any) -> ManifestScanJson:
    """:func:`scan_manifest`'s result as JSON (a global step's result is kept in its marker)."""
    scan = dataclasses.asdict(scan_manifest(store, **kwargs))
    return ManifestScanJson(plan=scan.pop("rule"), **scan)


def _manifest_digests(store: Store) -> list[str]:
    """What the scan's key takes of the manifest: each part's digest from its marker (a build
    wrote it), else, for a manifest written without markers, each file's stamp (size, times,
    inode or ETag: metadata only)."""
    files = manifest_files(store)
    try:
        return [m.digest for m in require_markers(store, files, "manifest part")]
    except FileNotFoundError:
        return [f"{rel}:{file_stamp(store.fs, store.fs._strip_protocol(store.path(rel)))}" for rel in files]


def _scan_of(data: dict[str, Any]) -> ManifestScan:
    rule = data["plan"]
    return ManifestScan(GroupRule(**{**rule, "groups": tuple(rule["groups"]), "tiers": tuple(rule["tiers"])}),
                        data["shards"], data["counts"], data["manifest_sha256"], data["shard_records"])


# the manifest scan is a Python pass over every kept record and hashes the whole manifest:
# a task on the cluster (its result, the scan, is O(staging shards)), keyed by the manifest
# parts' digests, so a rerun over the same manifest reads the scan back (no task run)
SCAN_MANIFEST = Unit(scan_manifest_json, "stats-scan-manifest")
PARTIALS = Unit(batch_partials, "stats-partials")
MERGE = Unit(merge_partials, "stats-merge")


def refuse_thin_splits(config: ReferenceStatsConfig, counts: dict[str, int]) -> None:
    """The stage and its plan refuse alike a split with fewer than 2 kept records (no statistics of one)."""
    if empty := [g for g in config.splits if counts[g] < 2]:
        raise ValueError(f"splits with fewer than 2 kept records in the manifest: {empty}")


def reference_stats_stage(store: Store, config: ReferenceStatsConfig, caption_set: dict[str, Any] | None = None,
                          *, fan_out: FanOut = in_process) -> dict[str, Any]:
    """The stage itself, on the corpus in ``store``; its units run through ``fan_out`` (a
    flow's Dask cluster). Statistics files of groups this run does not write are removed.
    ``caption_set``: the corpus's evaluation caption set (path, SHA-256, …) for the provenance."""
    log = stage_logger()
    model_id = config.model.model_id
    scan = dict(groups=config.groups(), sample=config.sample, tiers=config.tiers, subset_size=config.test_subset,
                subset_seed=config.test_subset_seed)
    manifest = _manifest_digests(store)
    scanned = _scan_of(fan_out(keyed(SCAN_MANIFEST), [step_call(
        store, SCAN_MANIFEST, {**scan, "sample": config.sample.model_dump(mode="json")}, manifest,
        dict(store=store, **scan))])[0].info)
    log.info("groups %s over %d staging shards; model %s", scanned.counts, len(scanned.shards), model_id)
    refuse_thin_splits(config, scanned.counts)
    extraction = None
    subsets: dict[str, str | None] = {}
    if config.extract:
        results = extract_features(store, scanned.largest_first(), config.features(),
                                   GroupSelection(STATS_SUBSET, scanned.rule), fan_out=fan_out)
        subsets = {r.info["shard"]: r.info["models"][model_id]["subset"] for r in results}
        extraction = receipt_section(results)
        if "warning" in extraction:
            log.warning(extraction["warning"])
        prune_subset(store, model_id, STATS_SUBSET, [s for s, sub in subsets.items() if sub == STATS_SUBSET])
    # the partials, their merge and the files written from them: keyed by the scan, the features
    # they read (their markers' digests) and the settings, so a rerun with none changed reads
    # the result back and makes no task run
    features = require_markers(store, [feature_vectors(model_id, s, subsets.get(s)) for s in scanned.shards],
                               f"features of {model_id}")
    key = fingerprint(PARTIALS.name, code_version(__name__), config.model_dump(mode="json"),
                      [dataclasses.asdict(scanned), subsets, [m.digest for m in features], caption_set])
    if (done := step_result(store, PARTIALS.name, key)) is not None and all(map(store.exists, _outputs(done.info))):
        return {**done.info, "extraction": extraction}
    result = _summarise(store, config, scanned, subsets, caption_set, fan_out)
    return {**record_step(store, PARTIALS.name, key, result).info, "extraction": extraction}


def _outputs(result: dict[str, Any]) -> list[str]:
    """The files a recorded statistics result names (each group's files and sidecar, the
    oracle's): one removed by hand is written again, as every keyed step's outputs are."""
    files = [f["path"] for group in result["files"].values() for f in group.values()]
    sidecars = [group["npz"]["path"].removesuffix(".npz") + ".json" for group in result["files"].values()]
    return files + sidecars + ([ORACLE_PATH] if "oracle" in result else [])


def _summarise(store: Store, config: ReferenceStatsConfig, scanned: ManifestScan, subsets: dict[str, str | None],
               caption_set: dict[str, Any] | None, fan_out: FanOut) -> dict[str, Any]:
    """Partials over runs of shards, merged in a fixed tree; each group's statistics (and the
    oracle's metrics) written; statistics files of other groups removed."""
    log = stage_logger()
    model_id = config.model.model_id
    total = fan_out.reduce(PARTIALS, MERGE, [
        dict(store=store, model_id=model_id, shards=run, rule=scanned.rule, subsets={s: subsets.get(s) for s in run})
        for run in cut_batches(scanned.shards, config.max_partials, config.min_shards_per_partial)])
    if len(total.markers) != 1:
        raise ValueError(f"features/{model_id} mixes {len(total.markers)} feature fingerprints: re-extract")
    marker = next(iter(total.markers.values()))
    version = code_version("tasks.stats.reference")
    groups = [g for g in scanned.rule.groups if total.groups[g].moments.n >= 2]
    for g in sorted(set(scanned.rule.groups) - set(groups)):
        log.warning("group %s has fewer than 2 images with features: no statistics written", g)
    if missing := [g for g in config.splits if g not in groups]:
        raise ValueError(f"splits with fewer than 2 images with features: {missing}")
    written = {g: write_group_stats(store, g, model_id, total.groups[g], marker, scanned, version, caption_set)
               for g in groups}
    for d in model_deviations(marker["model"]):
        log.warning("protocol deviation: %s", d)
    result: dict[str, Any] = {"model_id": model_id, "model": marker["model"], "counts": scanned.counts,
                              "n": {g: s["n"] for g, s in written.items()},
                              "files": {g: s["files"] for g, s in written.items()},
                              "protocol_deviations": {g: s["protocol_deviations"] for g, s in written.items()}}
    if config.oracle:
        oracle = {"reference": "test", "model_id": model_id, "model": marker["model"],
                  "manifest_sha256": scanned.manifest_sha256, "code_version": version,
                  "settings": config.metrics.model_dump(mode="json"),
                  "protocol_deviations": written["test"]["protocol_deviations"] + config.metrics.deviations(),
                  "pairs": oracle_metrics({g: total.groups[g] for g in groups}, "test", config.metrics)}
        store.write_json(ORACLE_PATH, oracle)
        result["oracle"] = oracle["pairs"]
    keep = {f"{g}-{model_id}" for g in groups} | ({"oracle"} if config.oracle else set())
    if any("gpic_npz" in w["files"] for w in written.values()):  # gpic-eval's file, named by the test sidecar
        keep.add(posixpath.basename(GPIC_TEST_STATS).split(".", 1)[0])
    prune(store, STATS_DIR, keep)
    return result
