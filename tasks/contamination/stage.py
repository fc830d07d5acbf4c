"""The contamination stages' entry points, built from thin Prefect tasks: each fans its units
(evaluation chunks, scan shards, text units, join buckets, verify groups) out through ``fan_out``,
the flow's task runner (Dask) inside a flow run and in order here outside one. Every folder is
pruned to the current plan before it is read, and every unit follows the stage contract
(:mod:`corpusforge.contract`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from corpusforge.contract import (FanOut, Unit, UnitResult, completed_units, in_process, prune, remove_tree,
                                  require_marker, summarise)
from corpusforge.feature_files import feature_marker, list_feature_shards, require_features
from corpusforge.layout import STAGING_INDEX, STAGING_RECORDS, STAGING_TARS, staging_tar
from tasks.contamination.files import (CONTAMINATION_FOUND, CONTAMINATION_IMAGES, CONTAMINATION_ITEMS,
                                       CONTAMINATION_ITEM_DECISIONS, CONTAMINATION_JUDGE, CONTAMINATION_LEAKAGE,
                                       CONTAMINATION_TEXT, CONTAMINATION_TEXT_WORK, EDITION_DIR, eval_items_path,
                                       text_work_path)
from corpusforge.hashing import fingerprint
from corpusforge.storage import Store
from tasks.contamination import image_scan as scan
from tasks.contamination import text_scan as ts
from tasks.contamination.config import (EditionConfig, EvalSetConfig, ImageScanConfig, JudgeConfig, LeakageConfig,
                                        TextCanaryConfig)
from tasks.contamination.editions import item_decisions, write_edition
from tasks.contamination.image_text import judge_chunk, summarize_judge
from tasks.contamination.judge import make_judge
from tasks.contamination.eval_set import EvalCuts, stage_chunk
from tasks.contamination.image_rates import image_rows, summarize_images
from tasks.contamination.leakage import leakage_rows, summarize_leakage
from tasks.contamination.receipts import file_sha256
from tasks.contamination.selection import select_splits, selection_name, write_shard_list
from tasks.contamination.text_sources import caption_texts, item_texts, cut_table_parts, table_texts

STAGE_CHUNK = Unit(stage_chunk, "contamination-stage-eval-chunk")
SELECT = Unit(select_splits, "contamination-select-splits")
SCAN_EXACT = Unit(scan.scan_shard_exact, "contamination-scan-exact")
BUILD_INDEX = Unit(scan.build_scan_index, "contamination-build-index")
SCAN_IVF = Unit(scan.scan_shard_ivf, "contamination-scan-ivf")
RECALL = Unit(scan.scan_recall, "contamination-scan-recall")
IMAGE_ROWS = Unit(image_rows, "contamination-image-rows")
LEAKAGE_ROWS = Unit(leakage_rows, "contamination-leakage-rows")
CUT_TEXT_TABLE = Unit(cut_table_parts, "contamination-text-table-parts")
TEXT_UNIT = Unit(ts.text_unit, "contamination-text-unit")
JOIN = Unit(ts.join_bucket, "contamination-text-join")
VERIFY = Unit(ts.verify_group, "contamination-text-verify")
DECIDE = Unit(ts.decide_chunk, "contamination-text-decide")
SAMPLE = Unit(ts.sample_queries, "contamination-text-sample")
BRUTE = Unit(ts.brute_unit, "contamination-text-brute")
JUDGE = Unit(judge_chunk, "contamination-judge-chunk")
ITEMS = Unit(item_decisions, "contamination-item-decisions")
EDITION = Unit(write_edition, "contamination-edition")

BAND_ROWS_PER_BUCKET = 4_000_000
TEXTS_PER_VERIFY_GROUP = 500_000


def stage_eval_set(out: Store, eval_store: Store, cuts: EvalCuts, cfg: EvalSetConfig, *,
                   fan_out: FanOut = in_process) -> list[UnitResult]:
    """Stage every chunk of the evaluation set (images → staging shard, rows → items)."""
    names = [c.name for c in cuts.chunks]
    prune(out, CONTAMINATION_ITEMS, names)
    for folder in (STAGING_TARS, STAGING_INDEX, STAGING_RECORDS):
        prune(eval_store, folder, names)
    return fan_out(STAGE_CHUNK, [dict(out=out, eval_store=eval_store, chunk=c, cfg=cfg) for c in cuts.chunks])


def _selection(corpus: Store, out: Store, label: str, splits: list[str] | None, shards: list[str], *,
               fan_out: FanOut = in_process) -> tuple[str | None, dict[str, str], dict[str, Any]]:
    if splits is None:
        return None, {}, {}
    name = selection_name(label, splits)
    marker = fan_out(SELECT, [dict(corpus=corpus, out=out, name=name, splits=splits,
                                   shards=write_shard_list(out, name, shards))])[0]
    return name, marker.info["digests"], marker.info["counts"]


def run_scan(out: Store, name: str, query: scan.ScanSide, target: scan.ScanSide, k: int, search: str,
             exact_max_pairs: float, ivf_cfg: Any, recall_queries: int, threshold: float, *,
             fan_out: FanOut = in_process) -> dict[str, Any]:
    """Top-k matches of every query shard (exact or IVF); returns what was done and its recall."""
    prune(out, f"{CONTAMINATION_FOUND}/{name}", query.shards)
    n_q = sum(scan.n_selected(query, s) for s in query.shards)
    n_t = sum(scan.n_selected(target, s) for s in target.shards)
    mode = scan.choose_search(search, n_q, n_t, exact_max_pairs)
    rule = scan.pair_rule(query, target)
    if mode == "ivf":
        dim = int(require_features(target.store, target.model_id, target.shards[0]).info["dim"])
        scan.check_index_size(name, n_t, rule.form_dim(dim), ivf_cfg.storage)
    target_digest = target.digest()
    result: dict[str, Any] = {"search": mode, "queries": n_q, "targets": n_t, "k": k,
                              "targets_digest": target_digest, "pair_score": rule.to_json()}
    if mode == "exact":
        markers = fan_out(SCAN_EXACT, [dict(out=out, scan=name, query=query, shard=s, target=target,
                                                   target_digest=target_digest, k=k, rule=rule)
                                              for s in query.shards])
        result["recall"] = {"recall_flagged": 1.0, "method": "exhaustive scan: every pair compared"}
    else:
        built = fan_out(BUILD_INDEX, [dict(out=out, name=name, target=target, target_digest=target_digest,
                                                  cfg=ivf_cfg, rule=rule)])[0]
        markers = fan_out(SCAN_IVF, [dict(out=out, scan=name, query=query, shard=s, target=target,
                                                 index_name=name, built=built, k=k, rule=rule)
                                            for s in query.shards])
        result["index"] = {k2: built.info[k2] for k2 in ("plan", "dim", "n_vectors")}
        result["recall"] = fan_out(RECALL, [dict(
            out=out, scan=name, query=query, target=target, target_digest=target_digest, k=k, threshold=threshold,
            n_sample=recall_queries, seed=ivf_cfg.seed, found_digests=[m.digest for m in markers],
            rule=rule)])[0].info
    result["units"] = summarise(f"contamination.{name}", markers).counts()
    return result


def corpus_feature_shards(corpus: Store, model_id: str) -> list[str]:
    """Every staging shard of the corpus, each with completed ``model_id`` features (else a
    clear error: a scan over part of a corpus would under-report overlap)."""
    staged = completed_units(corpus, STAGING_TARS, ".tar")
    have = set(list_feature_shards(corpus, model_id))
    missing = [s for s in staged if s not in have]
    if not staged or missing:
        raise ValueError(f"{corpus.root}: {len(missing) if staged else 'all'} staging shards have no "
                         f"features/{model_id} ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}): "
                         f"run `corpusforge extract-features` with that model first")
    return staged


def image_stage(out: Store, corpus: Store, eval_store: Store, chunks: list[str], cfg: ImageScanConfig,
                identity_check: bool = True, *, fan_out: FanOut = in_process) -> dict[str, Any]:
    """Image-only contamination of the embedded evaluation chunks against the corpus."""
    corpus_shards = corpus_feature_shards(corpus, cfg.model_id)
    embedded = [c for c in chunks if feature_marker(eval_store, cfg.model_id, c) is not None]
    sel, digests, counts = _selection(corpus, out, "corpus", cfg.corpus_splits, corpus_shards, fan_out=fan_out)
    target = scan.write_side(out, "images-target", corpus, cfg.model_id, corpus_shards, sel, digests)
    query = scan.write_side(out, "images-query", eval_store, cfg.model_id, embedded)
    identity = scan.check_same_features(query, target) if identity_check else scan.feature_identity(target)
    result = run_scan(out, "images", query, target, cfg.k, cfg.search, cfg.exact_max_pairs, cfg.ivf,
                      cfg.recall_queries, cfg.flag_above, fan_out=fan_out) if embedded else {"search": None, "queries": 0}
    prune(out, CONTAMINATION_IMAGES, chunks)
    fan_out(IMAGE_ROWS, [dict(out=out, eval_store=eval_store, chunk=c, model_id=cfg.model_id, scan="images",
                                     threshold=cfg.flag_above) for c in chunks])
    summary = summarize_images(out, chunks, cfg.flag_above, cfg.curve, cfg.top_pairs)
    return {**summary, "model_id": cfg.model_id, "feature_identity": identity, "corpus_splits": cfg.corpus_splits,
            "training_images_by_split": counts, "scan": result}


def leakage_stage(out: Store, corpus: Store, cfg: LeakageConfig, model_id: str, against: Store | None,
                  build_thresholds: list[float], *, fan_out: FanOut = in_process) -> dict[str, Any]:
    """Held-out images of ``corpus`` against the training split of ``against`` (default: itself)."""
    train_corpus = against or corpus
    held_shards = corpus_feature_shards(corpus, model_id)
    train_shards = corpus_feature_shards(train_corpus, model_id)
    held_sel, held_digests, held_counts = _selection(corpus, out, "held-out", cfg.held_out, held_shards,
                                                     fan_out=fan_out)
    label = "train" if against is None else "against-train"
    train_sel, train_digests, train_counts = _selection(train_corpus, out, label, cfg.train, train_shards,
                                                        fan_out=fan_out)
    if against is not None and train_sel == held_sel:
        raise ValueError("held-out and training selections must differ")
    held = scan.write_side(out, "leakage-held", corpus, model_id, held_shards, held_sel, held_digests)
    with_held = [s for s in held_shards if scan.n_selected(held, s)]
    query = scan.write_side(out, "leakage-query", corpus, model_id, with_held, held_sel, held_digests)
    target = scan.write_side(out, "leakage-target", train_corpus, model_id, train_shards, train_sel, train_digests)
    identity = scan.check_same_features(query, target)
    thresholds = sorted(set(cfg.thresholds or build_thresholds) | {cfg.review_min_similarity})
    result = run_scan(out, "leakage", query, target, cfg.k, cfg.search, cfg.exact_max_pairs, cfg.ivf, 200,
                      min(thresholds), fan_out=fan_out) if with_held else {"search": None}
    prune(out, CONTAMINATION_LEAKAGE, with_held)
    markers = fan_out(LEAKAGE_ROWS, [dict(out=out, scan="leakage", selection=held_sel, shard=s,
                                                 thresholds=thresholds, review_threshold=cfg.review_min_similarity)
                                            for s in with_held])
    source = {"corpus": corpus.root, "against": train_corpus.root, "held_out_splits": cfg.held_out,
              "train_splits": cfg.train, "model_id": model_id, "build_thresholds": build_thresholds,
              "held_out_images": held_counts, "training_images": train_counts, "feature_identity": identity,
              "scan": result}
    return summarize_leakage(markers, thresholds, cfg.review_min_similarity, source)


def _doc_units(out: Store, corpus: Store | None, cfg: TextCanaryConfig, *, fan_out: FanOut = in_process
               ) -> tuple[list[dict[str, Any]], dict]:
    """The corpus side's text units: one per staging shard (captions) or table part."""
    c = cfg.corpus
    if c.kind == "table":
        marker = fan_out(CUT_TEXT_TABLE, [dict(out=out, cfg=c)])[0]
        calls = [dict(out=out, kind=ts.DOCS, unit=p, read=partial(_no_fields, table_texts, out, p), cfg=cfg,
                      inputs=marker.outputs[text_work_path("source", p)]) for p in marker.info["parts"]]
        return calls, {"kind": "table", "path": c.path, "texts": marker.info["texts"],
                       "sha256": file_sha256(c.path, c.storage_options)}
    if corpus is None:
        raise ValueError("text corpus kind corpus_captions needs a built corpus")
    shards = completed_units(corpus, STAGING_TARS, ".tar")
    sel, digests, counts = _selection(corpus, out, "captions", c.splits, shards, fan_out=fan_out)
    calls = [dict(out=out, kind=ts.DOCS, unit=s, read=partial(_no_fields, caption_texts, corpus, s, out, sel), cfg=cfg,
                  inputs=[require_marker(corpus, staging_tar(s), "staging shard").digest, digests.get(s)])
             for s in shards]
    return calls, {"kind": "corpus_captions", "corpus": corpus.root, "splits": c.splits, "captions_by_split": counts}


def _no_fields(read: Callable[..., tuple[list[str], list[str]]], *args: Any
               ) -> tuple[list[str], list[str | None], list[str]]:
    """A corpus side's ``read(*args)`` as a text unit reads it: its texts belong to no field.
    Bound with :func:`functools.partial`, it pickles to the Dask workers."""
    ids, texts = read(*args)
    return ids, [None] * len(ids), texts


def text_canary_stage(out: Store, corpus: Store | None, chunks: list[str], fields: list[str],
                      cfg: TextCanaryConfig, *, fan_out: FanOut = in_process) -> dict[str, Any]:
    """Text canaries of the evaluation items' ``fields`` against the configured text corpus."""
    if not fields:
        raise ValueError("text canaries need eval_set.text_fields")
    doc_calls, source = _doc_units(out, corpus, cfg, fan_out=fan_out)
    doc_units = [c["unit"] for c in doc_calls]
    for kind in (ts.DOCS, ts.DOC_BANDS, ts.BRUTE):
        prune(out, f"{CONTAMINATION_TEXT_WORK}/{kind}", doc_units)
    for kind in (ts.QUERIES, ts.QUERY_BANDS):
        prune(out, f"{CONTAMINATION_TEXT_WORK}/{kind}", chunks)
    q_calls = [dict(out=out, kind=ts.QUERIES, unit=ch, read=partial(item_texts, out, ch, list(fields)), cfg=cfg,
                    inputs=[require_marker(out, eval_items_path(ch), "evaluation items").digest, fields])
               for ch in chunks]
    doc_markers = fan_out(TEXT_UNIT, doc_calls)
    q_markers = fan_out(TEXT_UNIT, q_calls)
    n_docs = sum(m.info["texts"] - m.info["empty"] for m in doc_markers)
    n_q = sum(m.info["texts"] - m.info["empty"] for m in q_markers)
    lsh = cfg.lsh
    mode = lsh.mode if lsh.mode != "auto" else ("exhaustive" if n_docs * n_q <= lsh.exhaustive_max_pairs else "lsh")
    d_bands = ts.digest_of_units(out, ts.DOCS, doc_units)
    source["texts_digest"] = fingerprint(sorted(d_bands.items()))
    q_digests = ts.digest_of_units(out, ts.QUERIES, chunks)
    candidates: dict[str, str] | None = None
    join_info: dict[str, Any] = {}
    if mode == "lsh":
        band_rows = sum(m.info["band_rows"] for m in doc_markers + q_markers)
        buckets = lsh.buckets or max(1, math.ceil(band_rows / BAND_ROWS_PER_BUCKET))
        prune(out, f"{CONTAMINATION_TEXT_WORK}/{ts.CANDIDATES}", {f"{b:05d}" for b in range(buckets)})
        joins = fan_out(JOIN, [dict(out=out, bucket=b, buckets=buckets, doc_units=d_bands,
                                           query_units=q_digests, max_docs_per_key=lsh.max_docs_per_key)
                                      for b in range(buckets)])
        candidates = {text_work_path(ts.CANDIDATES, f"{b:05d}"): m.digest for b, m in enumerate(joins)}
        join_info = {"buckets": buckets, "candidate_pairs": sum(m.info["pairs"] for m in joins),
                     "truncated_band_values": sum(m.info["truncated_keys"] for m in joins)}
    else:
        prune(out, f"{CONTAMINATION_TEXT_WORK}/{ts.CANDIDATES}", set())
    groups = _groups(doc_units, [m.info["texts"] for m in doc_markers])
    prune(out, f"{CONTAMINATION_TEXT_WORK}/{ts.SCORES}", set(groups))
    verified = fan_out(VERIFY, [dict(out=out, group=g, d_units={u: d_bands[u] for u in units},
                                            q_units=q_digests, candidates=candidates) for g, units in groups.items()])
    prune(out, CONTAMINATION_TEXT, chunks)
    scores = {g: m.digest for g, m in zip(groups, verified, strict=True)}
    decided = fan_out(DECIDE, [dict(out=out, chunk=ch, groups=scores, cfg=cfg) for ch in chunks])
    counts = {k: sum(m.info[k] for m in decided) for k in ("quarantine", "review", "retain", "empty")}
    recall: dict[str, Any] = {"mode": mode, "sampled_queries": 0}
    if lsh.recall_sample and doc_units and chunks:
        sample = fan_out(SAMPLE, [dict(out=out, q_units=q_digests, n_sample=lsh.recall_sample,
                                              seed=lsh.recall_seed)])[0]
        fan_out(BRUTE, [dict(out=out, d_unit=u, d_digest=d_bands[u], sample_digest=sample.digest, cfg=cfg)
                               for u in doc_units])
        recall = ts.lsh_recall(out, mode, doc_units, sorted(candidates or {}), sample.info["sampled"])
    return {"source": source, "fields": list(fields), "mode": mode, "corpus_texts": n_docs, "item_texts": n_q,
            "pairs_compared": sum(m.info["compared"] for m in verified), "all_pairs": n_docs * n_q,
            "join": join_info, "decisions": counts, "recall": recall, **ts.canary_receipt_fields(cfg)}


def _groups(units: list[str], sizes: list[int]) -> dict[str, list[str]]:
    """Contiguous groups of doc units of about TEXTS_PER_VERIFY_GROUP texts (one verify task each)."""
    groups: dict[str, list[str]] = {}
    current: list[str] = []
    total = 0
    for unit, n in zip(units, sizes, strict=True):
        if current and total + n > TEXTS_PER_VERIFY_GROUP:
            groups[f"g{len(groups):05d}"] = current
            current, total = [], 0
        current.append(unit)
        total += n
    if current:
        groups[f"g{len(groups):05d}"] = current
    return groups


def image_text_stage(out: Store, corpus: Store, chunks: list[str], embedded: set[str], cfg: JudgeConfig,
                     question_fields: list[str], *, fan_out: FanOut = in_process) -> dict[str, Any]:
    """The judge's verdict for every item with an answer and an embedded image."""
    prune(out, CONTAMINATION_JUDGE, chunks)
    markers = fan_out(JUDGE, [dict(out=out, corpus=corpus, chunk=c, cfg=cfg, question_fields=question_fields,
                                          has_matches=c in embedded) for c in chunks])
    return summarize_judge(markers, make_judge(cfg).identity())


def edition_stage(out: Store, chunks: list[str], cfg: EditionConfig, image_threshold: float | None,
                  benchmark: dict[str, Any], *, fan_out: FanOut = in_process) -> dict[str, Any] | None:
    """Per-item decisions, then the new edition (or none, when switched off)."""
    prune(out, CONTAMINATION_ITEM_DECISIONS, chunks)
    fan_out(ITEMS, [dict(out=out, chunk=c, cfg=cfg, image_threshold=image_threshold) for c in chunks])
    if not cfg.enabled:
        remove_tree(out, EDITION_DIR)
        return None
    return fan_out(EDITION, [dict(out=out, chunks=chunks, benchmark=benchmark, cfg=cfg)])[0].info
