"""Contamination rates: how much of an evaluation set is already in a training corpus?

Table of contents of :func:`contamination`:

    stage the evaluation set (1 task per chunk: eval/staging + eval/items)
    → embed its images for the scan's model with the corpus's feature settings and decode
      size (the feature stage, 1 task per chunk)
    → image-only rate: best training match per image (exact scan or IVF) → per-image rows
    → image–text: captions of the top matches → judge (canary overlap, or a chat endpoint)
    → text canaries: corpus texts and item texts → LSH join or exhaustive → verify → decide
    → cross-split leakage: held-out vs training images of a built corpus (or of two corpora)
    → per-item decisions → new benchmark edition (never an edited original)
    → summary.json, receipt.json, report.md, report.html under contamination/

Reads ``config.corpus`` (and ``leakage.against``, the evaluation set) and never writes
them: an output root equal to, inside or around any of them is refused. Every unit
follows the stage contract, so a rerun into the same output redoes only what changed.

From Python: ``run_contamination(config)``; the Prefect flow is ``contamination_flow``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from corpusforge.cluster import DaskConfig, cluster_flow, fan_out, run_logger
from corpusforge.config import FlowConfig
from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, remove_tree
from corpusforge.feature_files import feature_marker, prune_features
from corpusforge.layout import features_dir
from tasks.contamination.files import (CONTAMINATION_DIR, CONTAMINATION_EVAL, CONTAMINATION_FOUND, CONTAMINATION_IMAGES,
                                       CONTAMINATION_INDEX, CONTAMINATION_ITEM_DECISIONS, CONTAMINATION_JUDGE,
                                       CONTAMINATION_LEAKAGE, CONTAMINATION_RECEIPT, CONTAMINATION_REPORT,
                                       CONTAMINATION_REPORT_HTML, CONTAMINATION_SELECT, CONTAMINATION_SUMMARY,
                                       CONTAMINATION_TEXT, CONTAMINATION_TEXT_WORK, EDITION_DIR)
from corpusforge.plans import (DELETE, EVERY_RUN, WHOLE, StagePlan, changed_fields, changes, marker_files, mtime,
                               newest_marker)
from corpusforge.receipts import flow_receipt, redact
from corpusforge.storage import Store, require_separate
from corpusforge.version import code_version
from flows.plan import flow_plan_data, plan_only, plan_only_field, size_estimate
from flows.preflight import as_user_error, check_corpus, check_models, require_exists
from tasks.contamination import plan as contamination_plan
from tasks.contamination.canary import NORMALIZATION_PROFILE
from tasks.contamination.config import (EditionConfig, EvalSetConfig, ImageScanConfig, JudgeConfig, LeakageConfig,
                                        TextCanaryConfig)
from tasks.contamination.eval_features import corpus_decode_size, eval_features_config, scan_model_only
from tasks.contamination.eval_set import cut_eval_set
from tasks.contamination.image_scan import remove_sides
from tasks.contamination.receipts import (CLAIM_BOUNDARY, benchmark_identity, build_thresholds, corpus_snapshot,
                                          seeds, stable_results, thresholds, write_receipt)
from tasks.contamination.report import render_html, render_markdown
from tasks.contamination.stage import (edition_stage, image_stage, image_text_stage, leakage_stage, stage_eval_set,
                                       text_canary_stage)
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.extract import extract_features, receipt_section
from tasks.shared.output_hashes import output_hashes

FLOW = "contamination"
CODE_MODULES = ("tasks.contamination.stage", "tasks.contamination.report", "tasks.contamination.receipts",
                "tasks.contamination.eval_features")


class ContaminationConfig(FlowConfig):
    """The corpus, the evaluation set, what to measure, where results go, the cluster."""

    corpus: str = Field(..., title="Training corpus root",
                        description="A corpus built by corpusforge (staging/, features/, manifest/); read only.")
    corpus_storage_options: dict[str, Any] = Field(default_factory=dict, title="Corpus storage options")
    out: str = Field(..., title="Output root", description="Where eval/, contamination/ and edition/ are written.")
    out_storage_options: dict[str, Any] = Field(default_factory=dict, title="Output storage options")
    eval_set: EvalSetConfig | None = Field(None, title="Evaluation set",
                                           description="Empty: only cross-split leakage of the corpus.")
    features: FeaturesConfig | None = Field(
        None, title="Evaluation feature settings",
        description="How evaluation images are embedded. Empty: the corpus's own features section (from its "
                    "receipt), which guarantees the same model, weights, preprocessing, dtype and decode size.")
    image: ImageScanConfig | None = Field(default_factory=ImageScanConfig, title="Image-only rate")
    judge: JudgeConfig | None = Field(None, title="Image–text judge",
                                      description="Empty: no image–text rate. Needs eval_set.answer_field.")
    text: TextCanaryConfig | None = Field(default_factory=TextCanaryConfig, title="Text canaries",
                                          description="Runs when eval_set.text_fields is set.")
    leakage: LeakageConfig | None = Field(default_factory=LeakageConfig, title="Cross-split leakage")
    edition: EditionConfig = Field(default_factory=EditionConfig, title="New benchmark edition")
    plan_only: bool = plan_only_field(FLOW)
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")

    @model_validator(mode="after")
    def _judge_needs_images_and_answers(self) -> ContaminationConfig:
        if self.judge is not None and (self.image is None or self.eval_set is None
                                       or not self.eval_set.answer_field):
            raise ValueError("the image–text judge needs image (the matches it retrieves captions for) and "
                             "eval_set.answer_field")
        return self


def check_separate(config: ContaminationConfig) -> None:
    """Refuse an output root that is, contains or lies inside anything this run reads."""
    reads = [("corpus", config.corpus)]
    if config.leakage and config.leakage.against:
        reads.append(("training corpus", config.leakage.against))
    if config.eval_set:
        reads.append(("evaluation set", config.eval_set.source))
    require_separate(config.out, reads)


def preflight(config: ContaminationConfig) -> None:
    """The CLI's checks before anything starts (read only): the corpus and the evaluation set
    exist, the output root is apart from everything read, the models have weights."""
    check_corpus(config.corpus, config.corpus_storage_options)
    if config.eval_set is not None:
        require_exists(config.eval_set.source, config.eval_set.storage_options, "evaluation set",
                       "a table, a folder of images or tars")
    with as_user_error():
        check_separate(config)
    check_models(config)


def embed_eval_set(eval_store: Store, chunks: list[str], config: ContaminationConfig, corpus: Store) -> list[str]:
    """The feature stage over the staged evaluation chunks, for the image scan's model only,
    at the corpus's decode size (:mod:`tasks.contamination.eval_features`); returns the
    stage's warnings (random-init models)."""
    model_id = config.image.model_id
    fcfg = scan_model_only(eval_features_config(config.features, corpus, model_id), model_id)
    prune_features(eval_store, {model_id}, chunks)
    extracted = receipt_section(extract_features(eval_store, chunks, fcfg,
                                                 draft=corpus_decode_size(corpus, model_id), fan_out=fan_out))
    return [extracted["warning"]] if extracted.get("warning") else []


def contamination(config: ContaminationConfig) -> dict[str, Any]:
    """Contamination rates of an evaluation set against a corpus; results under ``config.out``;
    with ``plan_only``, write nothing and return the plan (:func:`plan_run`)."""
    if config.plan_only:
        return plan_only(FLOW, plan_run(config))
    log = run_logger()
    check_separate(config)
    corpus = Store(config.corpus, config.corpus_storage_options)
    out = Store(config.out, config.out_storage_options)
    eval_store = out.sub(CONTAMINATION_EVAL)
    against = (Store(config.leakage.against, config.leakage.against_storage_options)
               if config.leakage and config.leakage.against else None)
    results: dict[str, Any] = {}
    warnings: list[str] = []
    benchmark, chunks, embedded, with_images = None, [], set(), []

    if config.eval_set:
        es = config.eval_set
        cuts = cut_eval_set(es)
        chunks = [c.name for c in cuts.chunks]
        staged = stage_eval_set(out, eval_store, cuts, es, fan_out=fan_out)
        log.info("evaluation set %s: %d items in %d chunks", es.source, sum(m.info["items"] for m in staged),
                 len(chunks))
        with_images = [c for c, m in zip(chunks, staged, strict=True) if m.info["staged"]]
        if config.image is not None and with_images:
            warnings += embed_eval_set(eval_store, with_images, config, corpus)
        benchmark = benchmark_identity(out, cuts.name, es.source, cuts.kind, chunks, cuts.input_files,
                                       es.storage_options)
    else:
        remove_tree(out, CONTAMINATION_EVAL)

    if config.image is not None and with_images:
        results["images"] = image_stage(out, corpus, eval_store, chunks, config.image, fan_out=fan_out)
        embedded = {c for c in chunks if feature_marker(eval_store, config.image.model_id, c) is not None}
        if results["images"]["feature_identity"].get("random_init"):
            warnings.append(f"RANDOM-INIT FEATURES ({config.image.model_id}): image similarities carry no meaning")
    else:
        if config.image is not None and config.eval_set:
            warnings.append("the evaluation set has no readable images: no image-only rate")
        remove_tree(out, CONTAMINATION_IMAGES, f"{CONTAMINATION_FOUND}/images")
        remove_sides(out, "images")

    if config.judge is not None:
        es = config.eval_set
        questions = [f for f in es.text_fields if f != es.answer_field]
        results["image_text"] = image_text_stage(out, corpus, chunks, embedded, config.judge, questions,
                                                    fan_out=fan_out)
    else:
        remove_tree(out, CONTAMINATION_JUDGE)

    if config.text is not None and config.eval_set and config.eval_set.text_fields:
        results["text"] = text_canary_stage(out, corpus, chunks, config.eval_set.text_fields, config.text,
                                            fan_out=fan_out)
    else:
        remove_tree(out, CONTAMINATION_TEXT, CONTAMINATION_TEXT_WORK)

    if config.leakage is not None:
        model = config.leakage.model_id or (config.image.model_id if config.image else "wfd")
        results["leakage"] = leakage_stage(out, corpus, config.leakage, model, against, build_thresholds(corpus),
                                             fan_out=fan_out)
    else:
        remove_tree(out, CONTAMINATION_LEAKAGE, f"{CONTAMINATION_FOUND}/leakage")
        remove_sides(out, "leakage")
    if not results:
        remove_tree(out, CONTAMINATION_SELECT)

    edition = None
    if benchmark is not None:
        edition = edition_stage(out, chunks, config.edition, config.image.flag_above if config.image else None,
                                benchmark, fan_out=fan_out)
    else:
        remove_tree(out, CONTAMINATION_ITEM_DECISIONS, EDITION_DIR)

    summary = stable_results(results)
    out.write_json(CONTAMINATION_SUMMARY, summary)
    receipt = flow_receipt(
        FLOW, CODE_MODULES, config, config_exclude={"dask", "plan_only"},
        claim_boundary=CLAIM_BOUNDARY,
        benchmark=benchmark,
        corpus=corpus_snapshot(corpus),
        against=corpus_snapshot(against) if against else None,
        normalization_profile=NORMALIZATION_PROFILE,
        thresholds=thresholds(config.image, config.text, config.leakage, config.judge),
        seeds=seeds(config.image, config.text, config.leakage),
        results=summary,
        edition=edition,
        warnings=warnings,
        outputs=output_hashes(out, (CONTAMINATION_DIR, EDITION_DIR),
                              skip=(CONTAMINATION_RECEIPT, CONTAMINATION_REPORT, CONTAMINATION_REPORT_HTML)),
    )
    write_receipt(out, receipt)
    markdown = render_markdown(receipt)
    out.write_bytes(CONTAMINATION_REPORT, markdown.encode())
    out.write_bytes(CONTAMINATION_REPORT_HTML, render_html(receipt, markdown, eval_store if chunks else None,
                                                           corpus).encode())
    log.info("contamination results in %s/contamination (receipt, report.md, report.html)", config.out)
    return {"out": config.out, "results": summary, "edition": edition, "warnings": warnings}


contamination_flow, run_contamination = cluster_flow(contamination, FLOW)


# ---- the plan (`corpusforge plan contamination`, plan_only) -------------------------------

def plan_run(config: ContaminationConfig) -> dict[str, Any]:
    """What a run would skip or recompute, and why; writes nothing: per unit for the evaluation
    set's staging chunks and their features (the GPU work), per stage for the scans after them,
    whose units are planned from their own outputs (docs/contamination.md, "Plan"). The estimate
    is the size of the work (no run log): units, and the images of the evaluation chunks to embed."""
    corpus = Store(config.corpus, config.corpus_storage_options)
    out = Store(config.out, config.out_storage_options)
    eval_stages = contamination_plan.plan_units(out, corpus, config.eval_set, config.image, config.features)
    receipt = out.read_json(CONTAMINATION_RECEIPT) if out.exists(CONTAMINATION_RECEIPT) else None
    judged = _ContaminationJudge(config, out, receipt, code_version(*CODE_MODULES))
    es = config.eval_set
    image = judged.stage("image", config.image is not None and es is not None,
                         _scan_folders("images", ("corpus",)) + (CONTAMINATION_IMAGES,), ("image", "features"),
                         eval_stages, model=config.image.model_id if config.image else None)
    judge = judged.stage("image_text", config.judge is not None, (CONTAMINATION_JUDGE,), ("judge", "eval_set"),
                         [*eval_stages, image])
    text = judged.stage("text", config.text is not None and es is not None and bool(es.text_fields),
                        (CONTAMINATION_TEXT_WORK, CONTAMINATION_TEXT, *_selections(("captions",))),
                        ("text", "eval_set"), eval_stages[:1], table=config.text.corpus.path if config.text and
                        config.text.corpus.kind == "table" else None)
    leakage_model = (config.leakage.model_id if config.leakage and config.leakage.model_id
                     else config.image.model_id if config.image else "wfd")
    leakage = judged.stage("leakage", config.leakage is not None,
                           _scan_folders("leakage", ("held-out", "train", "against-train")) + (CONTAMINATION_LEAKAGE,),
                           ("leakage", "image"), [], model=leakage_model,
                           against=config.leakage.against if config.leakage else None)
    edition = judged.stage("edition", es is not None, (CONTAMINATION_ITEM_DECISIONS, EDITION_DIR),
                           ("edition", "image"), [*eval_stages, image, judge, text, leakage])
    report = StagePlan("report")
    report.add("summary, receipt, reports", COMPUTED, EVERY_RUN)
    staged = out.sub(CONTAMINATION_EVAL)
    return flow_plan_data(FLOW, config.out, f"{config.corpus} into {config.out}", [
        (s, size_estimate(s, staged if s.stage.startswith("eval.features.") else None))
        for s in [*eval_stages, image, judge, text, leakage, edition, report]])


def _scan_folders(scan: str, selections: tuple[str, ...]) -> tuple[str, ...]:
    return (f"{CONTAMINATION_FOUND}/{scan}", f"{CONTAMINATION_INDEX}/{scan}.faiss", *_selections(selections))


def _selections(labels: tuple[str, ...]) -> tuple[str, ...]:
    """Marker prefixes of the split selections a stage writes (``{label}-{splits}``)."""
    return tuple(f"{CONTAMINATION_SELECT}/{label}-" for label in labels)


class _ContaminationJudge:
    """Judges the contamination stages after the evaluation set's features as a whole."""

    def __init__(self, config: Any, out: Store, receipt: dict[str, Any] | None, code: str):
        self.config, self.out, self.receipt, self.code = config, out, receipt, code
        self.now = redact(config.model_dump(mode="json"))  # as the receipt keeps it
        self.finished = mtime(out, CONTAMINATION_RECEIPT)

    def _markers(self, prefixes: tuple[str, ...]) -> list[str]:
        """Output paths of the units under ``prefixes`` (folders, files, or name prefixes)."""
        found: list[str] = []
        for prefix in prefixes:
            folder = prefix.rsplit("/", 1)[0] if prefix.endswith("-") or prefix.endswith(".faiss") else prefix
            found += [rel for rel in marker_files(self.out, folder) if rel.startswith(prefix)]
        return found

    def stage(self, name: str, active: bool, prefixes: tuple[str, ...], sections: tuple[str, ...],
              upstream: list[StagePlan], model: str | None = None, against: str | None = None,
              table: str | None = None) -> StagePlan:
        stage = StagePlan(name)
        units = self._markers(prefixes)
        if not active:
            for rel in units:
                stage.add(rel, DELETE, f"{name} is switched off")
            return stage
        if not units:
            stage.add(WHOLE, COMPUTED, "no completed output")
            return stage
        reasons = []
        if changes(upstream):
            reasons.append("an upstream unit is recomputed or deleted")
        if self.receipt is None:
            reasons.append("no earlier completed run")
        else:
            old = self.receipt.get("config", {})
            if fields := changed_fields({s: old.get(s) for s in sections}, {s: self.now.get(s) for s in sections}):
                reasons.append("config " + ", ".join(fields))
            if self.receipt.get("code_version") != self.code:
                reasons.append("the flow's code version changed")
            reasons += self._inputs_changed(model, against, table)
            if self.finished is None or newest_marker(self.out, units) > self.finished:
                reasons.append("the last run did not complete")
        if reasons:
            stage.add(WHOLE, MAYBE, "; ".join(reasons))
            stage.open = True
        else:
            stage.add(WHOLE, SKIPPED, "unchanged")
        return stage

    def _inputs_changed(self, model: str | None, against: str | None, table: str | None) -> list[str]:
        """What the stage reads outside this output that changed since the last receipt."""
        reasons = []
        for label, root, options, recorded in (
                ("corpus", self.config.corpus, self.config.corpus_storage_options, self.receipt.get("corpus")),
                ("training corpus", against, self.config.leakage.against_storage_options if against else {},
                 self.receipt.get("against"))):
            if root is None:
                continue
            store = Store(root, options)
            if corpus_snapshot(store) != recorded:
                reasons.append(f"the {label}'s receipt changed")
            elif model is not None and (newest_marker(store, marker_files(store, f"{features_dir(model)}/vectors"))
                                        > self.finished):
                reasons.append(f"the {label}'s {model} features were rewritten since")
        if table is not None:
            stamp = mtime(Store(table.rsplit("/", 1)[0], self.config.text.corpus.storage_options),
                          table.rsplit("/", 1)[1])
            if stamp is None or stamp > self.finished:
                reasons.append("the text table changed since")
        return reasons
