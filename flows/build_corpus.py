"""The main job: build a benchmark-grade corpus from a raw image–caption collection.

Read top to bottom, :func:`build_on_dask` is the pipeline's table of contents:

    plan inputs → ingest (per partition) → duplicate keys, exact duplicates (per hash bucket)
    → resolve (per partition) → staging shards (per shard) → features (per staging shard)
    → near-duplicate graph and two-tier removal (per staging shard) → release plan → release shards (per shard)
    → manifest (per partition) → reference statistics → receipt and report

Each "per X" step is one Prefect task per X on the Dask cluster from ``config.dask``.
Every step is resumable: a rerun of a finished build skips finished shards and rewrites
no byte differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field, model_validator

from corpusforge.cluster import DaskConfig, prefect_api, task_runner
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.features.base import CODE_VERSION as FEATURES_CODE_VERSION
from tasks.features.config import STATISTICS_PREPROCESSING, FeaturesConfig
from tasks.features.extract import extract_features, summarize
from tasks.features.layout import feature_path
from tasks.exact_dedup import find_duplicate_keys, find_exact_duplicates, resolve_partition
from tasks.graph.config import NearDedupConfig
from tasks.graph.stage import near_duplicate_stage
from tasks.ingest import ingest_partition
from tasks.manifest import write_manifest_part
from tasks.receipt import count_outcomes, input_snapshot_hash, output_hashes, redact, render_report
from tasks.release import plan_release_files, write_release_shard
from tasks.sources import SourceConfig, plan_partitions
from tasks.splits import SplitConfig, tier_counts
from tasks.staging import StagingConfig, plan_staging, write_staging_shard
from tasks.validate import ValidationConfig


class BuildConfig(BaseModel):
    """Everything a corpus build depends on; the receipt records all of it."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(..., title="Source", description="Metadata table, folder of tars or of images; local or s3://.")
    out: str = Field(..., title="Output root", description="Where the corpus is written; local or s3://.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Output storage options",
                                            description="fsspec options for the output root (endpoint, keys).")
    input: SourceConfig = Field(default_factory=SourceConfig, title="Input")
    validation: ValidationConfig = Field(default_factory=ValidationConfig, title="Validation and filters")
    staging: StagingConfig = Field(default_factory=StagingConfig, title="Staging shards")
    features: FeaturesConfig = Field(default_factory=FeaturesConfig, title="Feature extraction",
                                     description="Models run on every staging shard; empty list to skip.")
    near_dedup: NearDedupConfig | None = Field(
        default_factory=NearDedupConfig, title="Near-duplicate removal",
        description="FAISS graph over one extracted model's features and GPIC's two-tier rule; null to skip.")
    splits: SplitConfig = Field(default_factory=SplitConfig, title="Splits, release shards, tiers")
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")

    @model_validator(mode="after")
    def _graph_model_is_extracted(self) -> BuildConfig:
        extracted = {m.model_id: m for m in self.features.models}
        if self.near_dedup is None:
            return self
        spec = extracted.get(self.near_dedup.model_id)
        if spec is None:
            raise ValueError(f"near_dedup.model_id {self.near_dedup.model_id!r} is not among the extracted "
                             f"feature models {sorted(extracted)}")
        if spec.resolved_preprocessing in STATISTICS_PREPROCESSING:
            raise ValueError(f"{spec.model_id} gives raw (un-normalised) statistics features; "
                             "the similarity graph needs a dedup model (sscd, clip, dinov2_eval, wfd)")
        return self

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> BuildConfig:
        """Load a YAML config; keyword overrides (e.g. source, out) win over the file."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)


def _run(t, calls: list[dict[str, Any]]) -> list[Any]:
    """Submit one task run per call (fanned out by the task runner) and wait for all."""
    futures = [t.submit(**kwargs) for kwargs in calls]
    return [f.result() for f in futures]


def _task(fn, name: str):
    return task(fn, name=name, cache_policy=NO_CACHE, persist_result=False)


plan_inputs_task = _task(plan_partitions, "plan-inputs")
ingest_task = _task(ingest_partition, "ingest-partition")
duplicate_keys_task = _task(find_duplicate_keys, "duplicate-keys")
exact_duplicates_task = _task(find_exact_duplicates, "exact-duplicates")
resolve_task = _task(resolve_partition, "resolve-partition")
staging_task = _task(write_staging_shard, "write-staging-shard")
release_plan_task = _task(plan_release_files, "plan-release")
release_task = _task(write_release_shard, "write-release-shard")
manifest_task = _task(write_manifest_part, "write-manifest-part")


def _prune(store: Store, folder: str, keep: set[str]) -> None:
    """Remove files of an earlier build that the current plan no longer contains."""
    for name in store.listdir(folder):
        if name.split(".", 1)[0] not in keep:
            store.remove(f"{folder}/{name}")


@flow(name="build-corpus-on-dask")
def build_on_dask(config: BuildConfig) -> dict[str, Any]:
    log = get_run_logger()
    version = code_version()
    store = Store(config.out, config.storage_options)
    kind, parts = plan_inputs_task.submit(config.source, store, config.input).result()
    buckets = range(config.staging.buckets_for(len(parts)))
    log.info("source %s: %s, %d ingest partitions", config.source, kind, len(parts))
    _run(ingest_task, [dict(store=store, part=p, src=config.input, val=config.validation,
                            n_buckets=len(buckets), code_version=version) for p in parts])
    _run(duplicate_keys_task, [dict(store=store, bucket=b) for b in buckets])
    _run(exact_duplicates_task, [dict(store=store, bucket=b) for b in buckets])
    survivors = [r["survivors"] for r in _run(resolve_task, [dict(store=store, part=p.index) for p in parts])]

    staging = plan_staging(survivors, config.staging.shard_size)
    _prune(store, "staging", {s.name for s in staging})
    _run(staging_task, [dict(store=store, shard=s, storage_options=config.input.storage_options,
                             code_version=version) for s in staging])
    log.info("%d records staged in %d staging shards", sum(survivors), len(staging))
    staged = [s.name for s in staging]

    features = {}
    if config.features.models and staged:
        features = summarize(extract_features(store, staged, config.features, FEATURES_CODE_VERSION))
        features["fingerprints"] = {m: store.read_done(feature_path(m, staged[0]))["model"] for m in features["models"]}

    near = near_duplicate_stage(store, config.near_dedup, staged) if config.near_dedup and staged else {}

    release = release_plan_task.submit(store, staged, config.splits).result()
    for split in ("train", "val", "test"):
        _prune(store, f"shards/{split}", {n for n, s in release["shards"].items() if s["split"] == split})
    _run(release_task, [dict(store=store, split=s["split"], shard=s["index"], cfg=config.splits,
                             code_version=version) for s in release["shards"].values()])
    manifest = _run(manifest_task, [dict(store=store, part=p.index) for p in parts])

    receipt = _receipt(config, store, kind, len(parts), release, manifest, version, features, near)
    store.write_json("receipt.json", receipt)
    store.write_bytes("report.md", render_report(receipt).encode())
    log.info("corpus written to %s: %s", config.out, receipt["counts"]["by_status"])
    return {"out": config.out, "counts": receipt["counts"], "release": receipt["release"]["splits"]}


def _receipt(config: BuildConfig, store: Store, kind: str, n_parts: int, release: dict[str, Any],
             manifest: list[dict[str, Any]], version: str, features: dict[str, Any],
             near: dict[str, Any]) -> dict[str, Any]:
    shards = release["shards"]
    n_train = sum(1 for s in shards.values() if s["split"] == "train")
    splits = {sp: {"samples": sum(s["count"] for s in shards.values() if s["split"] == sp),
                   "shards": sum(1 for s in shards.values() if s["split"] == sp)} for sp in ("train", "val", "test")}
    return {
        "corpusforge": "build_corpus",
        "code_version": version,
        "source": config.source,
        "source_kind": kind,
        "config": redact(config.model_dump(mode="json")),
        "seeds": {"splits": config.splits.seed, "near_dedup": config.near_dedup.seed if config.near_dedup else None},
        "thresholds": {"validation": config.validation.model_dump(mode="json"),
                       "near_dedup": config.near_dedup.model_dump(mode="json") if config.near_dedup else None},
        "input_snapshot_sha256": input_snapshot_hash(store, n_parts),
        "counts": count_outcomes(manifest),
        "release": {"splits": splits, "tiers": tier_counts(n_train, config.splits.tiers), "shards": shards},
        "features": _stable_features(features),
        "near_duplicates": near,
        "warnings": [features["warning"]] if features.get("warning") else [],
        "outputs": output_hashes(store),
    }


def _stable_features(summary: dict[str, Any]) -> dict[str, Any]:
    """What the receipt keeps of the feature stage: facts, not how much work this run redid."""
    if not summary:
        return {}
    keep = ("shards", "ok", "errors", "random_init", "dim")
    return {"images": summary["images"], "random_init_models": summary["random_init_models"],
            "models": {m: {**{k: t[k] for k in keep}, "fingerprint": summary["fingerprints"][m]}
                       for m, t in summary["models"].items()}}


@flow(name="build-corpus")
def build_corpus(config: BuildConfig) -> dict[str, Any]:
    """Build a corpus; the work runs on the Dask cluster named in ``config.dask``."""
    return build_on_dask.with_options(task_runner=task_runner(config.dask))(config)


def run_build(config: BuildConfig) -> dict[str, Any]:
    """Run the build from Python or the CLI, with a Prefect API available to Dask workers."""
    with prefect_api():
        return build_corpus(config)
