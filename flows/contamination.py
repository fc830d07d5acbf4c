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

import posixpath
from typing import Any, Literal

from pydantic import Field, model_validator

from corpusforge.cluster import DaskConfig, cluster_flow, fan_out, run_logger
from corpusforge.config import FlowConfig
from corpusforge.contract import remove_tree
from corpusforge.feature_files import feature_marker, list_feature_shards, prune_features
from corpusforge.layout import (CONTAMINATION_EVAL, CONTAMINATION_FOUND, CONTAMINATION_IMAGES,
                                CONTAMINATION_ITEM_DECISIONS, CONTAMINATION_JUDGE, CONTAMINATION_LEAKAGE,
                                CONTAMINATION_REPORT, CONTAMINATION_REPORT_HTML, CONTAMINATION_SELECT,
                                CONTAMINATION_SUMMARY, CONTAMINATION_TEXT, CONTAMINATION_TEXT_WORK, EDITION_DIR,
                                RECEIPT)
from corpusforge.storage import Store, is_remote
from corpusforge.version import code_version
from tasks.contamination.canary import NORMALIZATION_PROFILE
from tasks.contamination.config import (EditionConfig, EvalSetConfig, ImageScanConfig, JudgeConfig, LeakageConfig,
                                        TextCanaryConfig)
from tasks.contamination.eval_set import plan_eval_set
from tasks.contamination.receipts import (CLAIM_BOUNDARY, benchmark_identity, corpus_snapshot, output_hashes,
                                          write_receipt)
from tasks.contamination.report import render_html, render_markdown
from tasks.contamination.stage import (edition_stage, image_stage, image_text_stage, leakage_stage, stage_eval_set,
                                       text_canary_stage)
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.extract import extract_features, summarize
from tasks.report.receipt import redact

SCANNER_MODULES = ("tasks.contamination.stage", "tasks.contamination.report", "tasks.contamination.receipts")


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
    dask: DaskConfig = Field(default_factory=DaskConfig, title="Dask cluster")

    @model_validator(mode="after")
    def _judge_needs_images_and_answers(self) -> ContaminationConfig:
        if self.judge is not None and (self.image is None or self.eval_set is None
                                       or not self.eval_set.answer_field):
            raise ValueError("the image–text judge needs image (the matches it retrieves captions for) and "
                             "eval_set.answer_field")
        return self


def _root(uri: str) -> str:
    return uri.rstrip("/") + "/"


def check_separate(out: Store, reads: list[tuple[str, str]]) -> None:
    """Refuse an output root that is, contains or lies inside anything this run reads."""
    mine = _root(out.root)
    for what, uri in reads:
        other = _root(uri if is_remote(uri) else posixpath.abspath(uri))
        if is_remote(uri) == out.remote and (mine.startswith(other) or other.startswith(mine)):
            raise ValueError(f"output root {out.root} overlaps the {what} {uri}: nothing read is ever written to")


def eval_features_config(config: ContaminationConfig, corpus: Store) -> FeaturesConfig:
    """The corpus's feature settings (from its receipt) unless given; must include the image model."""
    if config.features is not None:
        fcfg = config.features
    elif corpus.exists(RECEIPT) and "features" in corpus.read_json(RECEIPT).get("config", {}):
        fcfg = FeaturesConfig.model_validate(corpus.read_json(RECEIPT)["config"]["features"])
    else:
        raise ValueError(f"{corpus.root} has no receipt with feature settings: give `features` explicitly")
    if config.image and config.image.model_id not in {m.model_id for m in fcfg.models}:
        raise ValueError(f"image.model_id {config.image.model_id!r} is not among the evaluation feature models "
                         f"{sorted(m.model_id for m in fcfg.models)}")
    return fcfg


def corpus_decode_size(corpus: Store, model_id: str) -> int | None | Literal["auto"]:
    """The decode size of the corpus's ``model_id`` features (read off one shard's marker;
    the scan compares every shard's), or "auto" when it has none (the scan then says so)."""
    shards = list_feature_shards(corpus, model_id)
    return feature_marker(corpus, model_id, shards[0])["info"].get("decode_size") if shards else "auto"


def embed_eval_set(eval_store: Store, chunks: list[str], fcfg: FeaturesConfig, model_id: str,
                   corpus: Store) -> list[str]:
    """The feature stage over the staged evaluation chunks, for the one model the image scan
    reads (folders of other models removed), decoded at the size the corpus's features of
    that model were: the corpus's other models would change only the decode size, and
    running them would embed every item once per model for nothing. Returns the stage's
    warnings (random-init models). Evaluation images were never validated, so any share
    of them may fail: each failure is that item's error, never a failed chunk."""
    fcfg = fcfg.model_copy(update={"max_error_share": 1.0,
                                   "models": [m for m in fcfg.models if m.model_id == model_id]})
    prune_features(eval_store, {model_id}, chunks)
    extracted = summarize(extract_features(eval_store, chunks, fcfg, draft=corpus_decode_size(corpus, model_id),
                                           fan_out=fan_out))
    return [extracted["warning"]] if extracted.get("warning") else []


def _build_thresholds(corpus: Store) -> list[float]:
    """The build's edge and pair-removal thresholds (from its receipt; a receipt written before
    their renaming has graph_threshold and pair_threshold), else GPIC's."""
    near = (corpus.read_json(RECEIPT).get("thresholds", {}).get("near_dedup") if corpus.exists(RECEIPT) else None)
    if near:
        edge = near.get("edge_min_similarity", near.get("graph_threshold"))
        pair = near.get("pair_removal_above", near.get("pair_threshold"))
        return sorted({float(edge), float(pair)})
    return [0.90, 0.9625]


def contamination(config: ContaminationConfig) -> dict[str, Any]:
    """Contamination rates of an evaluation set against a corpus; results under ``config.out``."""
    log = run_logger()
    corpus = Store(config.corpus, config.corpus_storage_options)
    out = Store(config.out, config.out_storage_options)
    eval_store = out.sub(CONTAMINATION_EVAL)
    against = (Store(config.leakage.against, config.leakage.against_storage_options)
               if config.leakage and config.leakage.against else None)
    reads = [("corpus", corpus.root)] + ([("training corpus", against.root)] if against else [])
    if config.eval_set:
        reads.append(("evaluation set", config.eval_set.source))
    check_separate(out, reads)
    results: dict[str, Any] = {}
    warnings: list[str] = []
    benchmark, chunks, embedded, with_images = None, [], set(), []

    if config.eval_set:
        es = config.eval_set
        plan = plan_eval_set(es)
        chunks = [c.name for c in plan.chunks]
        staged = stage_eval_set(out, eval_store, plan, es, fan_out=fan_out)
        log.info("evaluation set %s: %d items in %d chunks", es.source, sum(m["info"]["items"] for m in staged),
                 len(chunks))
        with_images = [c for c, m in zip(chunks, staged, strict=True) if m["info"]["staged"]]
        if config.image is not None and with_images:
            warnings += embed_eval_set(eval_store, with_images, eval_features_config(config, corpus),
                                       config.image.model_id, corpus)
        benchmark = benchmark_identity(out, plan.name, es.source, plan.kind, chunks, plan.input_files,
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
        for folder in (CONTAMINATION_IMAGES, f"{CONTAMINATION_FOUND}/images"):
            remove_tree(out, folder)

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
        for folder in (CONTAMINATION_TEXT, CONTAMINATION_TEXT_WORK):
            remove_tree(out, folder)

    if config.leakage is not None:
        model = config.leakage.model_id or (config.image.model_id if config.image else "wfd")
        results["leakage"] = leakage_stage(out, corpus, config.leakage, model, against, _build_thresholds(corpus),
                                             fan_out=fan_out)
    else:
        for folder in (CONTAMINATION_LEAKAGE, f"{CONTAMINATION_FOUND}/leakage"):
            remove_tree(out, folder)
    if not results:
        remove_tree(out, CONTAMINATION_SELECT)

    edition = None
    if benchmark is not None:
        edition = edition_stage(out, chunks, config.edition, config.image.flag_above if config.image else None,
                                benchmark, fan_out=fan_out)
    else:
        for folder in (CONTAMINATION_ITEM_DECISIONS, EDITION_DIR):
            remove_tree(out, folder)

    summary = {k: _stable(v) for k, v in results.items()}
    out.write_json(CONTAMINATION_SUMMARY, summary)
    receipt = {
        "corpusforge": "contamination",
        "scanner_version": code_version(*SCANNER_MODULES),
        "claim_boundary": CLAIM_BOUNDARY,
        "benchmark": benchmark,
        "corpus": corpus_snapshot(corpus),
        "against": corpus_snapshot(against) if against else None,
        "config": redact(config.model_dump(mode="json", exclude={"dask"})),
        "normalization_profile": NORMALIZATION_PROFILE,
        "thresholds": _thresholds(config),
        "seeds": _seeds(config),
        "results": summary,
        "edition": edition,
        "warnings": warnings,
        "outputs": output_hashes(out),
    }
    write_receipt(out, receipt)
    markdown = render_markdown(receipt)
    out.write_bytes(CONTAMINATION_REPORT, markdown.encode())
    out.write_bytes(CONTAMINATION_REPORT_HTML, render_html(receipt, markdown, eval_store if chunks else None,
                                                           corpus).encode())
    log.info("contamination results in %s/contamination (receipt, report.md, report.html)", config.out)
    return {"out": config.out, "results": summary, "edition": edition, "warnings": warnings}


def _stable(section: dict[str, Any]) -> dict[str, Any]:
    """A stage summary without how much work this run reused (a rerun's receipt is a fresh run's)."""
    section = dict(section)
    scan = section.get("scan")
    if isinstance(scan, dict):
        section["scan"] = {k: v for k, v in scan.items() if k != "units"}
    return section


def _thresholds(config: ContaminationConfig) -> dict[str, Any]:
    t: dict[str, Any] = {}
    if config.image:
        t["image"] = {"threshold": config.image.flag_above, "comparison": ">", "curve": config.image.curve}
    if config.text:
        t["text"] = {k: getattr(config.text, k) for k in ("exact", "normalized", "direct_jaccard", "signature",
                                                           "review_direct_jaccard", "review_signature")}
    if config.leakage:
        t["leakage"] = {"thresholds": config.leakage.thresholds, "review_threshold": config.leakage.review_min_similarity,
                        "comparison": ">="}
    if config.judge:
        t["image_text"] = {"containment": config.judge.containment, "min_similarity": config.judge.retrieve_above}
    return t


def _seeds(config: ContaminationConfig) -> dict[str, Any]:
    s: dict[str, Any] = {}
    if config.text:
        s.update(signature=config.text.seeds, lsh=config.text.lsh.seed, lsh_recall_sample=config.text.lsh.recall_seed)
    if config.image:
        s["image_ivf"] = config.image.ivf.seed
    if config.leakage:
        s["leakage_ivf"] = config.leakage.ivf.seed
    return s


contamination_flow, run_contamination = cluster_flow(contamination, "contamination")
