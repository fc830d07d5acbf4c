"""The main job: build a benchmark-grade corpus from a raw image–caption collection.

Read top to bottom, :func:`build` is the pipeline's table of contents:

    plan inputs → fetch (a URL list only: host units planned, fetched per host unit, a ledger per
    partition) → ingest (per partition) → duplicate keys, exact duplicates (per hash bucket,
    through a bucketed exchange per partition group) → resolve (per partition group) →
    staging shards (per content-defined shard) → features (per staging shard) →
    near-duplicate graph and two-tier removal (queries per staging shard)
    → release assignment → release shards (per shard) → manifest (per partition) → reference
    statistics → receipt and report

Each "per X" step is one Prefect task per X on the Dask cluster from ``config.dask``.
Every unit follows the stage contract (:mod:`corpusforge.contract`): a rerun into the
same output — after rows were appended, edited or deleted, image bytes replaced, a
setting or the code changed, or a run was killed — writes exactly the bytes a fresh
build would, and recomputes only the units whose inputs changed. Each folder is pruned
to the current plan before anything reads it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import Field, model_validator

from corpusforge.artifacts import publish_run_artifacts
from corpusforge.cluster import DaskConfig, cluster_flow, fan_out, output_concurrency, root_flow_run, run_logger
from corpusforge.config import FlowConfig
from corpusforge.contract import (COMPUTED, SWEEP_TEMP_FILES, forget_step, keyed, prune, remove_tree, run_step,
                                  step_call, summarise)
from corpusforge.feature_files import prune_features
from corpusforge.lease import held_here, holding_output
from corpusforge.ledger import Ledger
from corpusforge.layout import LEDGER_DIR, STAGING_INDEX, STAGING_RECORDS, STAGING_TARS, part_name
from tasks.ingest.files import (DEDUP_HASHES_DIR, DEDUP_KEYS_DIR, EXACT_DIR, FETCH_LEDGER_DIR, HASHES_DIR, INGEST_DIR,
                                KEYDUP_DIR, KEYS_DIR, RESOLVED_DIR, SPILL_DIR, bucket_name, dedup_group_name)
from tasks.release.files import CURRENT
from tasks.report.files import CHANGES_MD, CHANGES_TABLE, PREVIOUS_RECEIPT, RECEIPT, RECEIPT_OUTPUTS
from tasks.stats.files import STATS_DIR
from tasks.captions.files import CAPTIONS_DIR, CAPTION_JOURNAL_DIR, CAPTION_ASSIGNMENT_DIR, EVAL_CAPTIONS
from tasks.graph.files import GRAPH_DIR, GRAPH_WORK
from corpusforge.progress import RunProgress, run_progress
from corpusforge.receipts import BUILD_FLOW, flow_receipt
from corpusforge.storage import Store
from flows.plan import plan_build, plan_data, plan_only
from tasks.captions.config import CaptioningConfig
from tasks.captions.eval_captions import (EVAL_ASSIGNMENTS, WRITE_EVAL_CAPTIONS, EvalCaptionsConfig,
                                          write_test_assignment_list)
from tasks.captions.stage import captioning_stage
from tasks.graph.config import NearDedupConfig
from tasks.graph.stage import near_duplicate_stage
from tasks.ingest.exact_dedup import deduplicate, partition_groups
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.stage import fetch_stage, remove_fetch_work
from tasks.ingest.fetch.unit import fetch_store
from tasks.ingest.licenses import LicenseConfig, license_section
from tasks.ingest.partition import INGEST_PARTITION
from tasks.ingest.sources import CUT_INPUTS, SourceConfig
from tasks.shared.validate import ValidationConfig
from tasks.release.publish import publish, release_section
from tasks.release.versions import ReleaseRefused, current_version, publish_version, refusal
from tasks.release.splits import SplitConfig
from tasks.report.changes import DIFF_VERSIONS, KEEP_PREVIOUS_VERSION, remove_changes, same_version_account
from tasks.report.receipt import INPUT_SNAPSHOT, WRITE_OUTPUT_LIST, count_outcomes, output_stamp
from tasks.report.run_log import StageClock, write_run_log
from tasks.report.write import write_receipt
from tasks.shared.features.config import STATISTICS_PREPROCESSING, FeaturesConfig
from tasks.shared.features.extract import extract_features, receipt_section
from tasks.staging.stage import WRITE_STAGING_SHARD, StagingConfig, cut_staging
from tasks.stats.stage import PARTIALS, SCAN_MANIFEST, ReferenceStatsConfig, reference_stats_stage


class BuildConfig(FlowConfig):
    """Everything a corpus build depends on; the receipt records all of it."""

    source: str = Field(..., title="Source", description="Metadata table, folder of tars or of images; local or s3://.")
    out: str = Field(..., title="Output root", description="Where the corpus is written; local or s3://.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Output storage options",
                                            description="fsspec options for everything under the output root "
                                                        "(client_kwargs, secret_block: NAME); credentials come from the "
                                                        "environment or that Prefect Secret block, never from flow "
                                                        "parameters.")
    input: SourceConfig = Field(default_factory=SourceConfig, title="Input")
    fetch: FetchConfig = Field(default_factory=FetchConfig, title="Fetching a URL list",
                               description="How a source whose table has a `url` column is fetched: User-Agent "
                                           "with a contact (required), politeness, opt-outs, the fetch store.")
    validation: ValidationConfig = Field(default_factory=ValidationConfig, title="Validation and filters")
    licenses: LicenseConfig | None = Field(
        default_factory=LicenseConfig, title="Licence allow-list",
        description="Only these licences enter the corpus (GPIC §2.1: CC BY, CC0, Public Domain, No known "
                    "restrictions); missing or other licences are filtered. null to accept every record.")
    staging: StagingConfig = Field(default_factory=StagingConfig, title="Staging shards")
    features: FeaturesConfig = Field(default_factory=FeaturesConfig, title="Feature extraction",
                                     description="Models run on every staging shard; empty list to skip.")
    near_dedup: NearDedupConfig | None = Field(
        default_factory=NearDedupConfig, title="Near-duplicate removal",
        description="FAISS graph over one extracted model's features and GPIC's two-tier rule; null to skip.")
    splits: SplitConfig = Field(default_factory=SplitConfig, title="Splits, release shards, tiers")
    captioning: CaptioningConfig | None = Field(
        None, title="Captioning and VLM filters",
        description="Captions in GPIC's four formats and yes/no quality and safety filters from a vision-language "
                    "model behind an OpenAI-compatible chat endpoint (GPIC §2.2, §2.4); null to skip.")
    eval_captions: EvalCaptionsConfig | None = Field(
        default_factory=EvalCaptionsConfig, title="Evaluation caption set",
        description="A seeded sample of test-split captions users generate images from (GPIC §3: 50,000); "
                    "null to skip.")
    reference_stats: ReferenceStatsConfig | None = Field(
        None, title="Reference statistics",
        description="FD-DINOv2 statistics of the held-out splits after release (GPIC §3); null to skip.")
    previous: str | None = Field(
        None, title="Previous version",
        description="Output root of an earlier version to describe changes against (CHANGES.md, changes.parquet); "
                    "by default the version the output root held before this build, if any.")
    plan_only: bool = Field(
        False, title="Plan only",
        description="Write nothing: report which units a build would skip, recompute or delete, why, and what "
                    "they cost (the run's result and its 'build-corpus-plan' markdown artifact), like "
                    "`corpusforge plan`.")
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


# The build's code (its receipt's code_version; `corpusforge plan` compares it): a change
# anywhere reaches the whole stages.
BUILD_MODULES = ("tasks.ingest.fetch.stage", "tasks.ingest.partition", "tasks.ingest.exact_dedup", "tasks.staging.stage", "tasks.shared.features.extract",
                 "tasks.graph.stage", "tasks.captions.stage", "tasks.release.publish", "tasks.stats.stage")


# The long stages whose progress people watch (corpusforge.progress): (stage, the Prefect
# task whose finished runs are its units, unit name).
PROGRESS_STAGES = [("fetch", "fetch-host-unit", "host units"),
                   ("ingest", "ingest-partition", "partitions"),
                   ("staging", "write-staging-shard", "staging shards"),
                   ("features", "extract-shard-features", "staging shards"),
                   ("graph queries", "graph-query-shard", "staging shards"),
                   ("captioning", "caption-shard", "staging shards"),
                   ("release", "write-release-shard", "release shards"),
                   ("manifest", "write-manifest-part", "partitions")]


CHANGES = (CHANGES_MD, CHANGES_TABLE)  # the account of changes since the version before


def plan_run(config: BuildConfig) -> dict[str, Any]:
    """The build's plan hook (``corpusforge plan``, ``plan_only``): what it would skip,
    recompute or delete, and why (:mod:`flows.plan`); writes nothing."""
    return plan_data(config, plan_build(config, BUILD_MODULES))


def build(config: BuildConfig) -> dict[str, Any]:
    """Build (or bring up to date) the corpus at ``config.out``; return counts and the work done.
    With ``plan_only``, write nothing and return the plan."""
    if config.plan_only:
        return plan_only(BUILD_FLOW, plan_run(config))
    stages = [s for s in PROGRESS_STAGES if (s[0] != "features" or config.features.models)
              and (s[0] != "fetch" or config.fetch.user_agent is not None)
              and (s[0] != "graph queries" or config.near_dedup) and (s[0] != "captioning" or config.captioning)]
    # one build per output: Prefect queues runs started another way (deployments) into one
    # output, and the lease refuses any other build into it (the CLI took it before the flow
    # started, refusing or with --wait waiting; a CLI run killed would hold a Prefect slot
    # until its concurrency lease expires, so it takes none)
    store = Store(config.out, config.storage_options)
    queue = contextlib.nullcontext() if held_here(store) else output_concurrency(config.out)
    with queue, holding_output(store, flow_run=root_flow_run()), \
            run_progress(BUILD_FLOW, [s[0] for s in stages]) as progress:
        return _build(config, progress, {name: (task, unit) for name, task, unit in stages})


def _fetch_measure(result: Any) -> dict[str, float]:
    """What the fetch progress shows per finished unit: URLs with an outcome, bytes received."""
    return {"URLs fetched": result.info["fetched"],
            "bytes": sum(h["bytes"] for h in result.info["hosts"].values())}


def _build(config: BuildConfig, progress: RunProgress, stages: dict[str, tuple[str, str]]) -> dict[str, Any]:
    def stage(name: str) -> Any:
        measure = _fetch_measure if name == "fetch" else None
        return progress.stage(name, *stages[name], measure=measure) if name in stages else contextlib.nullcontext()

    log = run_logger()
    store = Store(config.out, config.storage_options)
    work: dict[str, Any] = {}
    # before anything is replaced
    kept_previous = config.previous is None and fan_out(KEEP_PREVIOUS_VERSION, [dict(store=store)])[0]
    kind, parts = fan_out(CUT_INPUTS, [dict(src=config.source, store=store, cfg=config.input)])[0]
    names = {part_name(p.index) for p in parts}
    for folder in (INGEST_DIR, SPILL_DIR, HASHES_DIR, KEYS_DIR, RESOLVED_DIR):
        prune(store, folder, names)
    prune(store, FETCH_LEDGER_DIR, names if kind == "urls" else set())
    n_buckets = config.staging.buckets_for(len(parts))
    for folder in (KEYDUP_DIR, EXACT_DIR):
        prune(store, folder, {bucket_name(b) for b in range(n_buckets)})
    for folder in (DEDUP_KEYS_DIR, DEDUP_HASHES_DIR):
        prune(store, folder, {dedup_group_name(g) for g in range(len(partition_groups(len(parts), n_buckets)))})
    log.info("source %s: %s, %d ingest partitions", config.source, kind, len(parts))

    clock = StageClock()
    # unit results go to ledgers (work/ledger/), read back for the few sums the flow keeps
    remove_tree(store, LEDGER_DIR)
    fetch_report = None
    if kind == "urls":
        with stage("fetch"), clock("fetch"):
            work["fetch"], fetch_report = fetch_stage(store, parts, config.fetch, config.licenses, fan_out)
    else:
        remove_fetch_work(store)
    with stage("ingest"), clock("ingest"), Ledger(store, "ingest") as ingested:
        fan_out.stream(INGEST_PARTITION, [dict(store=store, part=p, src=config.input, val=config.validation,
                                               n_buckets=n_buckets, lic=config.licenses,
                                               **({"fetched": fetch_store(store, config.fetch)} if kind == "urls"
                                                  else {}))
                                          for p in parts], ingested.add)
    work["ingest"] = ingested.summary("ingest").counts()
    licenses = license_section(config.licenses, ingested.infos())
    clock.start("exact_dedup")
    with Ledger(store, "resolve") as resolved:
        work["exact_dedup"] = deduplicate(store, ingested.digests(), len(parts), n_buckets, config.staging.shard_size,
                                          resolved.add, fan_out).counts()
    work["resolve"] = resolved.summary("resolve").counts()
    clock.stop()

    staging = cut_staging(resolved.infos(), config.staging.shard_size)
    staged = sorted(s.name for s in staging)
    for folder in (STAGING_TARS, STAGING_INDEX, STAGING_RECORDS):
        prune(store, folder, staged)
    with stage("staging"), clock("staging"), Ledger(store, "staging") as written:
        fan_out.stream(WRITE_STAGING_SHARD, [dict(store=store, shard=s) for s in staging], written.add)
    work["staging"] = written.summary("staging").counts()
    log.info("%d records staged in %d staging shards", sum(i["count"] for i in written.infos()), len(staging))

    with stage("features"), clock("features"):
        features = _features(store, config, staged, work)
    near: dict[str, Any] = {}
    with clock("graph"):
        if config.near_dedup and staged:
            with stage("graph queries"):
                near, work["graph"] = near_duplicate_stage(store, config.near_dedup, staged, fan_out=fan_out,
                                                           features=config.features)
            query_seconds = work["graph"].pop("query_seconds")
        else:
            remove_tree(store, GRAPH_DIR, GRAPH_WORK)

    captions: dict[str, Any] = {}
    if config.captioning is not None and staged:
        with stage("captioning"), clock("captioning"):
            captions, work["captioning"] = captioning_stage(store, config.captioning, staged,
                                                            near_dedup=bool(config.near_dedup), fan_out=fan_out)
    else:
        remove_tree(store, CAPTIONS_DIR, CAPTION_ASSIGNMENT_DIR, CAPTION_JOURNAL_DIR)

    with stage("release"), stage("manifest"), clock("release"):
        release, manifest, work["publish"] = publish(store, staged, len(parts), config.splits,
                                                     near_dedup=bool(config.near_dedup and staged),
                                                     captions=bool(captions), resolved=resolved.digests(),
                                                     fan_out=fan_out)
    samples = sum(s["count"] for s in release["shards"].values())
    before = current_version(store)  # the version readers read now
    refused = refusal(samples, before, config.splits.max_shrink)
    caption_set = None
    if config.eval_captions is not None:
        assignments = write_test_assignment_list(store, release)
        caption_set = fan_out(keyed(WRITE_EVAL_CAPTIONS), [step_call(  # reads the test plans and staging shards
            store, WRITE_EVAL_CAPTIONS, config.eval_captions.model_dump(mode="json"),
            [assignments, {n: p["sha256"] for n, p in release["plans"].items()}, list(written.digests())],
            dict(store=store, assignments=assignments, cfg=config.eval_captions), (EVAL_CAPTIONS,))])[0].info
    else:
        for rel in (EVAL_CAPTIONS, EVAL_ASSIGNMENTS):
            store.remove(rel)
        forget_step(store, WRITE_EVAL_CAPTIONS.name)
    stats = {}
    with clock("statistics"):
        if config.reference_stats is not None:
            stats = _stable_stats(reference_stats_stage(store, config.reference_stats, caption_set,
                                                                 fan_out=fan_out))
        else:
            remove_tree(store, STATS_DIR)
            for step in (SCAN_MANIFEST, PARTIALS):
                forget_step(store, step.name)

    swept = fan_out(SWEEP_TEMP_FILES, [dict(store=store)])[0]
    if swept["removed"]:
        log.warning("removed %d temporary files of killed writers: %s", swept["removed"], swept["first"])
    with clock("receipt"):
        receipt = _receipt(config, store, kind, ingested, release, manifest, features, near, stats, licenses)
        if fetch_report is not None:
            receipt["fetch"] = fetch_report
        if captions:
            receipt["captioning"] = captions
        if caption_set:
            receipt["eval_captions"] = caption_set
        if refused:
            receipt["refused"] = refused
            receipt["warnings"].insert(0, f"not published: {refused}")
        written_receipt, report = write_receipt(store, receipt, fan_out=fan_out)
        publish_run_artifacts(BUILD_FLOW, report, written_receipt["counts"], store.root)
    with clock("changes"):  # keyed by both versions' receipts (each names its outputs' digest)
        if config.previous is not None or kept_previous:
            kept = config.previous is None  # the version this root held, kept under work/previous/
            old = store if kept else Store(config.previous, config.storage_options)
            inputs = [old.sha256(PREVIOUS_RECEIPT if kept else RECEIPT), store.sha256(RECEIPT)]
            call = step_call(store, DIFF_VERSIONS, "kept" if kept else "previous", inputs,
                             dict(old=old, new=store, out=store, previous_kept=kept), CHANGES)
            if inputs[0] == inputs[1]:  # one version twice: its empty account needs no read, so no task
                run_step(store, DIFF_VERSIONS.name, call["key"], same_version_account, dict(out=store), CHANGES)
            else:
                fan_out(keyed(DIFF_VERSIONS), [call])
        else:
            remove_changes(store)
            forget_step(store, DIFF_VERSIONS.name)
        # this version, kept for the next build's account (after the diff, which read the one before):
        # a rerun that changes nothing then finds it kept, and runs no task for it
        fan_out(KEEP_PREVIOUS_VERSION, [dict(store=store)])
    work["seconds"] = clock.seconds()
    if config.near_dedup and staged:
        work["seconds"]["graph_queries"] = query_seconds
    write_run_log(store, BUILD_FLOW, work)
    remove_tree(store, LEDGER_DIR)  # work state of this run only: a rerun's tree equals a fresh build's
    if refused:
        raise ReleaseRefused(f"{refused}; not published: " + (
            f"{store.path(CURRENT)} still names version {before['version']}" if before
            else f"no version of {config.out} is published"))
    published = publish_version(store, samples)
    log.info("corpus written to %s: %s; work done %s", config.out, receipt["counts"]["by_status"], work)
    return {"out": config.out, "counts": receipt["counts"], "release": receipt["release"]["splits"], "work": work,
            "published": published}


def _features(store: Store, config: BuildConfig, staged: list[str], work: dict[str, Any]) -> dict[str, Any]:
    """The feature stage over every staging shard; feature folders of models no longer
    configured (by the build or its statistics) are removed."""
    models = {m.model_id for m in config.features.models}
    if config.reference_stats is not None:
        models.add(config.reference_stats.model.model_id)
    prune_features(store, models, staged)
    if not (config.features.models and staged):
        return {}
    results = extract_features(store, staged, config.features, fan_out=fan_out)
    work["features"] = {m: summarise(f"features.{m}", (r.info["models"][m] for r in results)).counts()
                        for m in sorted(results[0].info["models"])}
    work["images_embedded"] = sum(r.info["images"] for r in results if r.action == COMPUTED)
    return receipt_section(results)


def _receipt(config: BuildConfig, store: Store, kind: str, ingested: Ledger, release: dict[str, Any],
             manifest: Ledger, features: dict[str, Any],
             near: dict[str, Any], stats: dict[str, Any], licenses: dict[str, Any]) -> dict[str, Any]:
    """The receipt; its two steps that read the whole output are units keyed by what they read
    (the ingest markers' digests; the rest of the receipt and the stamps of the output files
    and markers), so a rerun that changed nothing makes no task run for them."""
    n_parts = len(ingested.digests())
    receipt = flow_receipt(
        BUILD_FLOW, BUILD_MODULES, config,
        source=config.source,
        source_kind=kind,
        seeds={"splits": config.splits.seed, "near_dedup": config.near_dedup.seed if config.near_dedup else None},
        thresholds={"validation": config.validation.model_dump(mode="json"),
                    "near_dedup": config.near_dedup.model_dump(mode="json") if config.near_dedup else None},
        input_snapshot_sha256=fan_out(keyed(INPUT_SNAPSHOT), [step_call(
            store, INPUT_SNAPSHOT, n_parts, list(ingested.digests()), dict(store=store, n_parts=n_parts))])[0].info,
        counts=count_outcomes(manifest.infos()),
        licenses=licenses,
        release=release_section(release, config.splits),
        features=_stable_features(features),
        near_duplicates=near,
        stats=stats,
        warnings=[w for w in (features.get("warning"), stats.get("warning")) if w],
        outputs=None,
    )
    receipt["outputs"] = fan_out(keyed(WRITE_OUTPUT_LIST), [step_call(
        store, WRITE_OUTPUT_LIST, receipt, output_stamp(store), dict(store=store), (RECEIPT_OUTPUTS,))])[0].info
    return receipt


def _stable_features(summary: dict[str, Any]) -> dict[str, Any]:
    """What the receipt keeps of the feature stage: facts, not how much work this run redid."""
    if not summary:
        return {}
    keep = ("shards", "ok", "errors", "random_init", "dim", "fingerprint")
    return {"images": summary["images"], "random_init_models": summary["random_init_models"],
            "models": {m: {k: t[k] for k in keep} for m, t in summary["models"].items()}}


def _stable_stats(result: dict[str, Any]) -> dict[str, Any]:
    """What the receipt keeps of the statistics stage (not how much extraction this run redid):
    the feature model's identity (from its markers) and each group's protocol deviations
    are what the reports label the statistics with."""
    kept = {k: result[k] for k in ("model_id", "model", "counts", "n", "files", "protocol_deviations", "oracle")
            if k in result}
    extraction = result.get("extraction") or {}
    if extraction.get("warning"):
        kept["warning"] = "REFERENCE STATISTICS FROM " + extraction["warning"]
    return kept


build_corpus, run_build = cluster_flow(build, BUILD_FLOW)
