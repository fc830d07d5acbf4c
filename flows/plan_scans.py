"""``corpusforge plan`` for the scans of a built corpus: contamination, qualify-prompts, evaluate.

Like :mod:`flows.plan_corpus`, it writes nothing and judges every unit with the function the
run's unit itself calls to decide, so the two cannot disagree:

- ``contamination``: per unit for the evaluation set's staging chunks
  (:func:`tasks.contamination.eval_set.judge_chunk`) and their features for the image
  scan's model (:func:`tasks.shared.features.extract.judge_shard`, at the corpus's decode
  size) — the GPU work. A chunk restaged first makes its features "recompute if upstream
  output changes" (its images are known after). The stages after it (image scan, image–text
  judge, text canaries, cross-split leakage, per-item decisions and edition) are judged per
  stage: their units are planned from the scans' own outputs (matches, selections, LSH
  buckets), known only after the run. A stage is skipped when nothing it reads changed (no
  upstream unit recomputes, its config sections and the flow's code version equal the last
  receipt's, the corpus's receipt and features are those it scanned, the last run completed);
  "recompute" when it has no completed output; otherwise "recompute if upstream output
  changes", with the reasons; switched off, its units are deleted.
- ``qualify-prompts``: per unit throughout: the caption sample, its embeddings per staging
  shard (known exactly when the sample is current, else "if upstream output changes"),
  the prompt, pool and taxonomy embeddings, and one output-variance unit per (model, chunk
  of prompts). The signals, decisions and ledger are recomputed on every run (no model).
- ``evaluate``: per chunk of generated images
  (:func:`tasks.stats.evaluate.judge_generated_chunk`): read back when the listing is the
  one embedded, else the files are hashed, as the run does, and re-embedded only when their
  bytes changed. The metrics are recomputed on every run from the features (no model).

Costs: these flows keep no run log; the estimate is the size of the work (units, and the
images of the evaluation chunks to embed).
"""

from __future__ import annotations

from typing import Any

from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, completed_units, explain, read_marker
from corpusforge.layout import (CONTAMINATION_EVAL, CONTAMINATION_FOUND, CONTAMINATION_IMAGES, CONTAMINATION_INDEX,
                                CONTAMINATION_ITEM_DECISIONS, CONTAMINATION_ITEMS, CONTAMINATION_JUDGE,
                                CONTAMINATION_LEAKAGE, CONTAMINATION_RECEIPT, CONTAMINATION_SELECT, CONTAMINATION_TEXT,
                                CONTAMINATION_TEXT_WORK, EDITION_DIR, FEATURES_DIR, MARKERS, PROMPTS_CAPTION_SAMPLE,
                                PROMPTS_CAPTIONS, PROMPTS_GENERATED, PROMPTS_TEXTS, QUALIFICATION_CATEGORIES,
                                caption_embeddings_path, eval_items_path, feature_vectors, features_dir,
                                generated_variance_path, staging_tar, text_embeddings_path)
from corpusforge.receipts import redact
from corpusforge.storage import Store
from corpusforge.version import code_version
from flows.plan import DELETE, StagePlan, changed_fields, marker_files, mtime

WHOLE = "(whole stage)"
EVERY_RUN = "recomputed on every run from the units' outputs (no model)"


def _deleted(stage: StagePlan, store: Store, folder: str, suffix: str, keep: set[str], reason: str,
             prefix: str = "") -> None:
    """Completed units of ``folder`` the run's pruning removes (not in ``keep``)."""
    for name in completed_units(store, folder, suffix):
        if name not in keep:
            stage.add(prefix + name, DELETE, reason)


def _switched_off(stage: StagePlan, store: Store, folders: tuple[str, ...], reason: str) -> StagePlan:
    for folder in folders:
        for rel in marker_files(store, folder):
            stage.add(rel, DELETE, reason)
    return stage


def _changes(stages: list[StagePlan]) -> bool:
    return any(u.action != SKIPPED for s in stages for u in s.units) or any(s.open for s in stages)


# ---- contamination ------------------------------------------------------------------------

def plan_contamination(config: Any) -> list[StagePlan]:
    """The evaluation set's chunks and features per unit, the scans after them per stage."""
    from flows.contamination import CODE_MODULES
    from tasks.contamination.eval_set import judge_chunk, plan_eval_set

    corpus = Store(config.corpus, config.corpus_storage_options)
    out = Store(config.out, config.out_storage_options)
    eval_store = out.sub(CONTAMINATION_EVAL)
    plans: list[StagePlan] = []
    eval_stages: list[StagePlan] = []
    if config.eval_set is not None:
        staging = StagePlan("eval.staging")
        staged: dict[str, dict[str, Any] | None] = {}
        for chunk in plan_eval_set(config.eval_set).chunks:
            action, reason, _ = judge_chunk(out, eval_store, chunk, config.eval_set)
            staging.add(chunk.name, action, reason)
            staged[chunk.name] = read_marker(out, eval_items_path(chunk.name)) if action == SKIPPED else None
        _deleted(staging, out, CONTAMINATION_ITEMS, ".parquet", set(staged), "no longer in the evaluation set")
        eval_stages.append(staging)
        if config.image is not None:
            eval_stages.append(_eval_features(eval_store, corpus, config, staged))
    else:
        eval_stages.append(_switched_off(StagePlan("eval.staging"), out, (CONTAMINATION_EVAL,),
                                         "eval_set is not configured"))
    plans += eval_stages

    receipt = out.read_json(CONTAMINATION_RECEIPT) if out.exists(CONTAMINATION_RECEIPT) else None
    judged = _ContaminationJudge(config, corpus, out, receipt, code_version(*CODE_MODULES))
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
    return plans + [image, judge, text, leakage, edition, report]


def _eval_features(eval_store: Store, corpus: Store, config: Any, staged: dict[str, dict[str, Any] | None]
                   ) -> StagePlan:
    """The evaluation chunks' features for the image scan's model, as the run embeds them."""
    from tasks.contamination.eval_features import corpus_decode_size, eval_features_config, scan_model_only
    from tasks.shared.features.extract import decode_size, feature_fingerprint, judge_shard, load_models

    model_id = config.image.model_id
    fcfg = scan_model_only(eval_features_config(config.features, corpus, model_id), model_id)
    models = load_models(fcfg)
    draft = corpus_decode_size(corpus, model_id)
    draft = decode_size(models) if draft == "auto" else draft
    stage = StagePlan(f"eval.features.{model_id}")
    keep = set()
    for chunk, marker in staged.items():
        feature = read_marker(eval_store, feature_vectors(model_id, chunk))
        if marker is None:  # restaged first: embedded if it then holds images, by their digest
            keep.add(chunk)
            if feature is None:
                stage.add(chunk, MAYBE, "its chunk is staged first (embedded if it holds images)")
                stage.open = True
            else:
                key = feature_fingerprint(models[0], fcfg.dtype, draft, fcfg.runtime.precision, "?")
                stage.add(chunk, *explain(feature, key, inputs_known=False))
        elif marker["info"]["staged"]:
            keep.add(chunk)
            verdict = judge_shard(eval_store, chunk, fcfg, models, draft).models[model_id]
            stage.add(chunk, verdict.action, verdict.reason)
    if not keep:  # no chunk with images: the run embeds nothing, and prunes nothing
        return stage
    _deleted(stage, eval_store, f"{features_dir(model_id)}/vectors", ".npy", keep,
             "its chunk has no readable images, or is no longer in the evaluation set")
    for name in eval_store.listdir(FEATURES_DIR):
        if name != model_id:
            _switched_off(stage, eval_store, (features_dir(name),), f"model {name} is not the image scan's")
    return stage


def _scan_folders(scan: str, selections: tuple[str, ...]) -> tuple[str, ...]:
    return (f"{CONTAMINATION_FOUND}/{scan}", f"{CONTAMINATION_INDEX}/{scan}.faiss", *_selections(selections))


def _selections(labels: tuple[str, ...]) -> tuple[str, ...]:
    """Marker prefixes of the split selections a stage writes (``{label}-{splits}``)."""
    return tuple(f"{CONTAMINATION_SELECT}/{label}-" for label in labels)


class _ContaminationJudge:
    """Judges the contamination stages after the evaluation set's features as a whole."""

    def __init__(self, config: Any, corpus: Store, out: Store, receipt: dict[str, Any] | None, code: str):
        self.config, self.corpus, self.out, self.receipt, self.code = config, corpus, out, receipt, code
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
        if _changes(upstream):
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
            newest = max((mtime(self.out, f"{MARKERS}/{rel}.json") or 0.0 for rel in units), default=0.0)
            if self.finished is None or newest > self.finished:
                reasons.append("the last run did not complete")
        if reasons:
            stage.add(WHOLE, MAYBE, "; ".join(reasons))
            stage.open = True
        else:
            stage.add(WHOLE, SKIPPED, "unchanged")
        return stage

    def _inputs_changed(self, model: str | None, against: str | None, table: str | None) -> list[str]:
        """What the stage reads outside this output that changed since the last receipt."""
        from tasks.contamination.receipts import corpus_snapshot

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
            elif model is not None and self._newer(store, f"{features_dir(model)}/vectors"):
                reasons.append(f"the {label}'s {model} features were rewritten since")
        if table is not None:
            stamp = mtime(Store(table.rsplit("/", 1)[0], self.config.text.corpus.storage_options),
                          table.rsplit("/", 1)[1])
            if stamp is None or stamp > self.finished:
                reasons.append("the text table changed since")
        return reasons

    def _newer(self, store: Store, folder: str) -> bool:
        return any((mtime(store, f"{MARKERS}/{rel}.json") or 0.0) > self.finished
                   for rel in marker_files(store, folder))


# ---- qualify-prompts ----------------------------------------------------------------------

def plan_qualify_prompts(config: Any) -> list[StagePlan]:
    """Every unit of the two signals with a model, then the decisions (every run)."""
    from flows.prompt_qualification import read_prompts

    out = Store(config.out, config.out_storage_options)
    _, prompts, _, pool = read_prompts(config)
    plans = []
    if config.density is not None:
        plans += _density(out, config, prompts, pool)
    else:
        plans.append(_switched_off(StagePlan("density"), out, (PROMPTS_CAPTION_SAMPLE, PROMPTS_CAPTIONS,
                                                               PROMPTS_TEXTS, QUALIFICATION_CATEGORIES),
                                   "density is switched off"))
    variance = StagePlan("variance")
    if config.variance is not None:
        from tasks.prompts.signals import variance_units
        from tasks.prompts.variance import variance_key

        planned = variance_units(config.variance, out, prompts)
        for call in planned.calls:
            rel = generated_variance_path(call["model"], call["chunk"])
            key = variance_key(config.variance.generated, call["model"], call["prompts"], config.variance)
            variance.add(f"{call['model']}/{call['chunk']}", *explain(read_marker(out, rel), key))
        for model in out.listdir(PROMPTS_GENERATED):
            _deleted(variance, out, f"{PROMPTS_GENERATED}/{model}", ".parquet", set(planned.chunks.get(model, [])),
                     "no longer planned (prompts or generated images changed)", f"{model}/")
    else:
        _switched_off(variance, out, (PROMPTS_GENERATED,), "variance is switched off")
    decisions = StagePlan("decisions")
    decisions.add("signals, ledger, rotation, receipt", COMPUTED, EVERY_RUN)
    return plans + [variance, decisions]


def _density(out: Store, config: Any, prompts: list[dict[str, Any]], pool: list[dict[str, Any]]
             ) -> list[StagePlan]:
    """The caption sample, its embeddings per staging shard and the short lists' embeddings."""
    from tasks.prompts import tables
    from tasks.prompts.captions import caption_embeddings_key, sample_key, sampled_keys_by_shard, text_list_key
    from tasks.prompts.text_model import text_model_identity

    corpus = Store(config.corpus, config.corpus_storage_options)
    cfg, tm = config.density, config.text_model
    identity = text_model_identity(tm.name)
    sample = StagePlan("density.caption_sample")
    key, _, _ = sample_key(corpus, cfg.sample_size, cfg.sample_seed, cfg.splits)
    sample.add("caption_sample", *explain(read_marker(out, PROMPTS_CAPTION_SAMPLE), key))
    captions = StagePlan("density.caption_embeddings")
    if sample.units[0].action == SKIPPED:
        by_shard = sampled_keys_by_shard(out)
        for shard, keys in sorted(by_shard.items()):
            captions.add(shard, *explain(read_marker(out, caption_embeddings_path(shard)),
                                         caption_embeddings_key(corpus, shard, keys, tm, identity)))
        _deleted(captions, out, PROMPTS_CAPTIONS, ".npy", set(by_shard), "no sampled captions in it any more")
    else:  # the sample is redrawn first: which shards, and their keys, are known after
        captions.open = True
        for shard in completed_units(out, PROMPTS_CAPTIONS, ".npy"):
            key = caption_embeddings_key(corpus, shard, None, tm, identity)
            captions.add(shard, *explain(read_marker(out, caption_embeddings_path(shard)), key, inputs_known=False))
    texts = StagePlan("density.text_embeddings")
    lists = {"prompts": [p["text"] for p in prompts if p["status"] == "valid"], "pool": [q["text"] for q in pool]}
    if cfg.mode != "direct":
        taxonomy = tables.taxonomy_categories(tables.read_input(cfg.taxonomy, cfg.taxonomy_storage_options))
        lists["taxonomy"] = [tables.category_text(c) for c in taxonomy]
    for name, listed in lists.items():
        texts.add(name, *explain(read_marker(out, text_embeddings_path(name)), text_list_key(listed, tm, identity)))
    return [sample, captions, texts]


# ---- evaluate -----------------------------------------------------------------------------

def plan_evaluate(config: Any) -> list[StagePlan]:
    """Every chunk of generated images: read back or embedded, and why; then the metrics."""
    from tasks.stats.evaluate import (check_model, expected_identity, judge_generated_chunk, load_reference,
                                      plan_generated)

    reference = load_reference(config.reference, config.reference_storage_options)
    check_model(reference, expected_identity(config.model), config.allow_mismatch, config.protocol)
    chunks = plan_generated(config.generated, config.generated_storage_options, config.chunk_size)
    if not chunks:
        raise FileNotFoundError(f"no images or tars under {config.generated}")
    out = Store(config.out, config.out_storage_options)
    features = out if config.feature_store is None else Store(config.feature_store, config.out_storage_options)
    model_id = config.model.model_id
    stage = StagePlan(f"features.{model_id}")
    for chunk in chunks:
        verdict = judge_generated_chunk(features, chunk, config.model, config.runtime.precision,
                                        config.generated_storage_options, hash_new=False)
        stage.add(chunk.name, verdict.action, verdict.reason)
    plans = [stage]
    if config.feature_store is None:  # the output folder is pruned to this run's chunks
        _deleted(stage, out, f"{features_dir(model_id)}/vectors", ".npy", {c.name for c in chunks},
                 "no longer among the generated images")
        for name in out.listdir(FEATURES_DIR):
            if name != model_id:
                _switched_off(stage, out, (features_dir(name),), f"model {name} is not the evaluation's")
    metrics = StagePlan("metrics")
    metrics.add("metrics.json, report.md", COMPUTED, "recomputed on every run from the features (no model)")
    return plans + [metrics]


def scan_estimate(flow: str, config: Any, stage: StagePlan) -> dict[str, Any]:
    """The size of a stage's work: units to compute, and for the evaluation set's features,
    the images of its staged chunks (these flows keep no run log)."""
    todo = [u.unit for u in stage.units if u.action == COMPUTED]
    maybe = [u.unit for u in stage.units if u.action == MAYBE]
    basis = "no times recorded (no run log for this flow): the size of the work"
    estimate: dict[str, Any] = {"seconds": None, "seconds_if_upstream_changes": None, "basis": basis,
                                "units": len(todo), "units_if_upstream_changes": len(maybe)}
    if flow == "contamination" and stage.stage.startswith("eval.features."):
        eval_store = Store(config.out, config.out_storage_options).sub(CONTAMINATION_EVAL)
        infos = [(read_marker(eval_store, staging_tar(c)) or {}).get("info", {}) for c in todo]
        estimate.update(images=sum(int(i.get("count", 0)) for i in infos),
                        bytes=sum(int(i.get("bytes", 0)) for i in infos))
    return estimate


def scan_root(flow: str, config: Any) -> tuple[str, str]:
    """(the root a plan reads markers under, how the plan's title names the run)."""
    if flow == "contamination":
        return config.out, f"{config.corpus} into {config.out}"
    if flow == "qualify-prompts":
        return config.out, f"{config.prompts.path} into {config.out}"
    return config.out, f"{', '.join(config.generated)} into {config.out}"


SCAN_PLANNERS = {"contamination": plan_contamination, "qualify-prompts": plan_qualify_prompts,
                 "evaluate": plan_evaluate}
