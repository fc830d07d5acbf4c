"""Near-duplicate removal on an already built corpus, written as a NEW corpus version.

Reads ``staging/`` and ``features/{model_id}/`` of ``config.source`` (features must be
extracted already) and writes, under ``config.out`` only: ``graph/…`` (index, edges,
decisions, components report, collision models, calibration sheet, summary) and
``lineage.json`` (which corpus, which shards, its receipt's hash, this config), then
the new version's release shards, manifest, receipt and report (:mod:`tasks.release.publish`).
An output root equal to, inside, or around the source is refused.

From Python: ``run_near_dedup(config)`` (starts a Prefect API for the Dask workers when
none is configured) or the flow ``near_dedup_flow(config)`` itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from corpusforge.artifacts import publish_run_artifacts
from corpusforge.cluster import DaskConfig, cluster_flow, fan_out, run_logger
from corpusforge.config import FlowConfig
from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, remove_tree
from corpusforge.layout import LEDGER_DIR, MANIFEST_DIR
from tasks.ingest.files import RESOLVED_DIR
from tasks.release.files import RELEASE_DIR, RELEASE_ASSIGNMENT_DIR
from tasks.graph.files import LINEAGE
from tasks.report.files import RECEIPT
from corpusforge.plans import WHOLE, StagePlan, changed_fields, unfinished
from corpusforge.receipts import flow_receipt
from corpusforge.storage import Store, require_separate
from corpusforge.version import code_version
from flows.plan import feature_estimates, flow_plan_data, plan_only, plan_only_field
from flows.preflight import as_user_error, check_corpus, check_models
from tasks.graph import plan as graph_plan
from tasks.graph.config import NearDedupConfig
from tasks.graph.derived import check_index_size, lineage, staged_with_features
from tasks.graph.stage import near_duplicate_stage
from tasks.release.publish import publish, release_section
from tasks.release.splits import SplitConfig
from tasks.release.versions import publish_version
from tasks.report.receipt import count_outcomes, write_output_list
from tasks.report.write import write_receipt

FLOW = "near-dedup"
CODE_MODULES = ("tasks.graph.stage", "tasks.release.publish")


class NearDedupFlowParams(FlowConfig):
    """Which corpus, where the new version goes, the stage's settings, the cluster."""

    source: str = Field(..., title="Built corpus root",
                        description="Root with staging/ and features/; read only. Local or s3://.")
    out: str = Field(..., title="New version root", description="Where graph/ and lineage.json are written.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Source storage options",
                                            description="fsspec options for the source root.")
    out_storage_options: dict[str, Any] | None = Field(
        None, title="Output storage options", description="fsspec options for the output root; empty: as the source.")
    near_dedup: NearDedupConfig = Field(default_factory=NearDedupConfig, title="Near-duplicate removal")
    splits: SplitConfig | None = Field(None, title="Splits, release shards, tiers",
                                       description="Empty: the source build's settings (from its receipt).")
    plan_only: bool = plan_only_field(FLOW, "stages")
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")


def check_separate(config: NearDedupFlowParams) -> None:
    """Refuse an output root that is the source, inside it, or contains it."""
    require_separate(config.out, [("source corpus", config.source)], "a new version must not write into the old one")


def preflight(config: NearDedupFlowParams) -> None:
    """The CLI's checks before anything starts (read only): the source exists, the output
    root is apart from it, the index fits, the model has weights."""
    check_corpus(config.source, config.storage_options, "source corpus")
    with as_user_error():
        check_separate(config)
        check_index_size(Store(config.source, config.storage_options), config.near_dedup)
    check_models(config)


def plan_run(config: NearDedupFlowParams) -> dict[str, Any]:
    """The plan (``corpusforge plan near-dedup``, ``plan_only``): the graph and the release
    of the new version, each judged as a whole; writes nothing."""
    source = Store(config.source, config.storage_options)
    return flow_plan_data(FLOW, config.source, f"{config.source} into {config.out}",
                          feature_estimates(source, _stage_plans(config, source)))


def _stage_plans(config: NearDedupFlowParams, source: Store) -> list[StagePlan]:
    """Like the build's graph stage: the graph is skipped when the new version's root holds a
    completed graph over the same staging shards with the same feature digests
    (:mod:`tasks.graph.plan`), the same ``near_dedup`` settings and code version (its
    lineage and receipt, judged here); the release (shards, manifest, receipt) likewise
    against the source's receipt and the ``splits``."""
    out = Store(config.out, config.storage_options if config.out_storage_options is None
                else config.out_storage_options)
    receipt = out.read_json(RECEIPT) if out.exists(RECEIPT) else None
    built = out.read_json(LINEAGE) if out.exists(LINEAGE) else None
    code_changed = receipt is not None and receipt.get("code_version") != code_version(*CODE_MODULES)

    recorded = []  # what changed since the graph in out was built, by the flow's record of it
    if built is not None and (fields := changed_fields(built.get("near_dedup"),
                                                        config.near_dedup.model_dump(mode="json"), "near_dedup")):
        recorded.append("config " + ", ".join(fields))
    if code_changed:
        recorded.append("the flow's code version changed")
    plans = graph_plan.plan_units(source, out, config.near_dedup.model_id, recorded)
    graph = plans[0]

    release = StagePlan("release")
    if not source.exists(RECEIPT):
        plans.append(release)  # the flow writes the graph only
        return plans
    source_receipt = source.read_json(RECEIPT)
    reasons = []
    if receipt is None:
        reasons.append("no completed release in the new version's root")
    else:
        if built is None or built.get("source_receipt_sha256") != source.sha256(RECEIPT):
            reasons.append("the source's receipt changed")
        splits = config.splits or SplitConfig.model_validate(source_receipt["config"]["splits"])
        # splits given, or else the source's (whose receipt is compared above)
        before = receipt.get("config", {}).get("splits") or source_receipt["config"]["splits"]
        if fields := changed_fields(before, splits.model_dump(mode="json"), "splits"):
            reasons.append("config " + ", ".join(fields))
        if code_changed:
            reasons.append("the flow's code version changed")
        if unfinished(out, (RELEASE_ASSIGNMENT_DIR, RELEASE_DIR, MANIFEST_DIR), RECEIPT):
            reasons.append("the last near-dedup run did not complete")
    if reasons:
        release.add(WHOLE, COMPUTED, "; ".join(reasons))
    elif graph.units[0].action != SKIPPED:
        release.add(WHOLE, MAYBE, "the graph is recomputed first; the release changes where its decisions do")
    else:
        release.add(WHOLE, SKIPPED, "unchanged")
    plans.append(release)
    return plans


def near_dedup(config: NearDedupFlowParams) -> dict[str, Any]:
    """Near-duplicate removal on a built corpus, written as a new version under ``config.out``;
    with ``plan_only``, write nothing and return the plan."""
    if config.plan_only:
        return plan_only(FLOW, plan_run(config))
    log = run_logger()
    source = Store(config.source, config.storage_options)
    out_options = config.storage_options if config.out_storage_options is None else config.out_storage_options
    check_separate(config)
    out = Store(config.out, out_options)
    shards = staged_with_features(source, config.near_dedup.model_id)
    log.info("%d staging shards of %s; writing the new version to %s", len(shards), config.source, config.out)
    out.write_json(LINEAGE, lineage(source, shards, config.near_dedup))
    summary, _ = near_duplicate_stage(out, config.near_dedup, shards, source=source, fan_out=fan_out)
    d = summary["decisions"]
    log.info("%d images: %d kept, %d removed %s; recall %s", d["images"], d["kept"], d["removed"],
             d["removed_by_rule"], summary["recall"]["recall"])

    if not source.exists(RECEIPT):
        log.warning("%s has no receipt.json (not a finished build): graph outputs only, no release", config.source)
        return summary
    source_receipt = source.read_json(RECEIPT)
    splits = config.splits or SplitConfig.model_validate(source_receipt["config"]["splits"])
    n_parts = sum(1 for n in source.listdir(RESOLVED_DIR) if n.endswith(".parquet"))
    release, manifest, _ = publish(out, shards, n_parts, splits, near_dedup=True, source=source, fan_out=fan_out)
    written, report = write_receipt(out, flow_receipt(
        FLOW, CODE_MODULES, config, config_exclude=("plan_only",),
        source=config.source,
        source_kind=f"corpus version derived from {config.source}",
        lineage=out.read_json(LINEAGE),
        seeds={"splits": splits.seed, "near_dedup": config.near_dedup.seed},
        thresholds={"near_dedup": config.near_dedup.model_dump(mode="json")},
        input_snapshot_sha256=source_receipt["input_snapshot_sha256"],
        counts=count_outcomes(manifest.infos()),
        release=release_section(release, splits),
        near_duplicates=summary,
        warnings=[],
        outputs=write_output_list(out),
    ))
    publish_run_artifacts(FLOW, report, written["counts"], out.root)
    remove_tree(out, LEDGER_DIR)  # publish's ledgers: work state of this run only
    publish_version(out, sum(s["count"] for s in release["shards"].values()))  # last: what readers read
    return summary


near_dedup_flow, run_near_dedup = cluster_flow(near_dedup, FLOW)
