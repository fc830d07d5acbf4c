"""The main job: build a benchmark-grade corpus from a raw image–caption collection.

Read top to bottom, :func:`build_on_dask` is the pipeline's table of contents:

    plan inputs → ingest (per partition) → duplicate keys, exact duplicates (per hash bucket)
    → resolve (per partition) → staging shards (per shard) → features (per staging shard)
    → near-duplicate graph and two-tier removal (queries per staging shard) → release plan
    → release shards (per shard) → manifest (per partition) → reference statistics → receipt and report

Each "per X" step is one Prefect task per X on the Dask cluster from ``config.dask``.
Every step is resumable: a rerun of a finished build skips finished shards and rewrites
no byte differently.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from pydantic import Field, model_validator

from corpusforge.cluster import DaskConfig, as_task, on_cluster, prefect_api, run_tasks
from corpusforge.config import FlowConfig
from corpusforge.storage import Store
from corpusforge.version import code_version
from flows.publish import prune, publish, release_section, write_receipt
from flows.reference_stats import ReferenceStatsConfig, ReferenceStatsSettings, reference_stats_stage
from tasks.features.base import CODE_VERSION as FEATURES_CODE_VERSION
from tasks.features.config import STATISTICS_PREPROCESSING, FeaturesConfig
from tasks.features.extract import extract_features, summarize
from tasks.features.layout import feature_path
from tasks.exact_dedup import find_duplicate_keys, find_exact_duplicates, resolve_partition
from tasks.graph.config import NearDedupConfig
from tasks.graph.stage import near_duplicate_stage
from tasks.ingest import ingest_partition
from tasks.receipt import count_outcomes, input_snapshot_hash, output_hashes, redact
from tasks.sources import SourceConfig, plan_partitions
from tasks.splits import SplitConfig
from tasks.staging import StagingConfig, plan_staging, write_staging_shard
from tasks.validate import ValidationConfig


class BuildConfig(FlowConfig):
    """Everything a corpus build depends on; the receipt records all of it."""

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
    reference_stats: ReferenceStatsSettings | None = Field(
        None, title="Reference statistics",
        description="FD-DINOv2 statistics of the held-out splits after release (GPIC §3); null to skip.")
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


plan_inputs_task = as_task(plan_partitions, "plan-inputs")
ingest_task = as_task(ingest_partition, "ingest-partition")
duplicate_keys_task = as_task(find_duplicate_keys, "duplicate-keys")
exact_duplicates_task = as_task(find_exact_duplicates, "exact-duplicates")
resolve_task = as_task(resolve_partition, "resolve-partition")
staging_task = as_task(write_staging_shard, "write-staging-shard")


@flow(name="build-corpus-on-dask")
def build_on_dask(config: BuildConfig) -> dict[str, Any]:
    log = get_run_logger()
    version = code_version()
    store = Store(config.out, config.storage_options)
    kind, parts = plan_inputs_task.submit(config.source, store, config.input).result()
    buckets = range(config.staging.buckets_for(len(parts)))
    log.info("source %s: %s, %d ingest partitions", config.source, kind, len(parts))
    run_tasks(ingest_task, [dict(store=store, part=p, src=config.input, val=config.validation,
                                 n_buckets=len(buckets), code_version=version) for p in parts])
    run_tasks(duplicate_keys_task, [dict(store=store, bucket=b) for b in buckets])
    run_tasks(exact_duplicates_task, [dict(store=store, bucket=b) for b in buckets])
    survivors = [r["survivors"] for r in run_tasks(resolve_task, [dict(store=store, part=p.index) for p in parts])]

    staging = plan_staging(survivors, config.staging.shard_size)
    prune(store, "staging", {s.name for s in staging})
    run_tasks(staging_task, [dict(store=store, shard=s, storage_options=config.input.storage_options,
                                  code_version=version) for s in staging])
    log.info("%d records staged in %d staging shards", sum(survivors), len(staging))
    staged = [s.name for s in staging]

    features = {}
    if config.features.models and staged:
        features = summarize(extract_features(store, staged, config.features, FEATURES_CODE_VERSION))
        features["fingerprints"] = {m: store.read_done(feature_path(m, staged[0]))["model"] for m in features["models"]}

    near = near_duplicate_stage(store, config.near_dedup, staged) if config.near_dedup and staged else {}

    release, manifest = publish(store, staged, len(parts), config.splits, version)

    stats = {}
    if config.reference_stats is not None:
        stats_config = ReferenceStatsConfig(**config.reference_stats.model_dump(), corpus=config.out,
                                            storage_options=config.storage_options, dask=config.dask)
        stats = _stable_stats(reference_stats_stage(stats_config))

    receipt = _receipt(config, store, kind, len(parts), release, manifest, version, features, near, stats)
    write_receipt(store, receipt)
    log.info("corpus written to %s: %s", config.out, receipt["counts"]["by_status"])
    return {"out": config.out, "counts": receipt["counts"], "release": receipt["release"]["splits"]}


def _receipt(config: BuildConfig, store: Store, kind: str, n_parts: int, release: dict[str, Any],
             manifest: list[dict[str, Any]], version: str, features: dict[str, Any],
             near: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
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
        "release": release_section(release, config.splits),
        "features": _stable_features(features),
        "near_duplicates": near,
        "stats": stats,
        "warnings": [w for w in (features.get("warning"), stats.get("warning")) if w],
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


def _stable_stats(result: dict[str, Any]) -> dict[str, Any]:
    """What the receipt keeps of the statistics stage (not how much extraction this run redid)."""
    kept = {k: result[k] for k in ("model_id", "counts", "n", "files", "oracle") if k in result}
    extraction = result.get("extraction") or {}
    if extraction.get("warning"):
        kept["warning"] = "REFERENCE STATISTICS FROM " + extraction["warning"]
    return kept


@flow(name="build-corpus")
def build_corpus(config: BuildConfig) -> dict[str, Any]:
    """Build a corpus; the work runs on the Dask cluster named in ``config.dask``."""
    return on_cluster(build_on_dask, config)


def run_build(config: BuildConfig) -> dict[str, Any]:
    """Run the build from Python or the CLI, with a Prefect API available to Dask workers."""
    with prefect_api():
        return build_corpus(config)
