"""``corpusforge plan`` for the scans of a built corpus: contamination, qualify-prompts, evaluate.

Like :mod:`flows.plan_corpus`, it writes nothing; every unit is judged by its stage package's
``plan_units``, with the function the run's unit itself calls to decide, so the two cannot
disagree:

- ``contamination``: per unit for the evaluation set's staging chunks and their features for
  the image scan's model (:mod:`tasks.contamination.plan`) — the GPU work. The stages after
  it (image scan, image–text judge, text canaries, cross-split leakage, per-item decisions
  and edition) are judged here per stage: their units are planned from the scans' own
  outputs (matches, selections, LSH buckets), known only after the run. A stage is skipped
  when nothing it reads changed (no upstream unit recomputes, its config sections and the
  flow's code version equal the last receipt's, the corpus's receipt and features are those
  it scanned, the last run completed); "recompute" when it has no completed output;
  otherwise "recompute if upstream output changes", with the reasons; switched off, its
  units are deleted.
- ``qualify-prompts``: per unit throughout (:mod:`tasks.prompts.plan`).
- ``evaluate``: per chunk of generated images, then the metrics (:mod:`tasks.stats.evaluate_plan`).

Costs: these flows keep no run log; the estimate is the size of the work (units, and the
images of the evaluation chunks to embed).
"""

from __future__ import annotations

from typing import Any

from corpusforge.contract import COMPUTED, MAYBE, SKIPPED
from corpusforge.layout import (CONTAMINATION_EVAL, CONTAMINATION_FOUND, CONTAMINATION_IMAGES, CONTAMINATION_INDEX,
                                CONTAMINATION_ITEM_DECISIONS, CONTAMINATION_JUDGE, CONTAMINATION_LEAKAGE,
                                CONTAMINATION_RECEIPT, CONTAMINATION_SELECT, CONTAMINATION_TEXT,
                                CONTAMINATION_TEXT_WORK, EDITION_DIR, MARKERS, features_dir)
from corpusforge.plans import (DELETE, EVERY_RUN, WHOLE, StagePlan, changed_fields, changes, marker_files, mtime,
                               newest_marker, staged_size)
from corpusforge.receipts import redact
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.contamination import plan as contamination_plan
from tasks.prompts import plan as prompts_plan
from tasks.stats import evaluate_plan


# ---- contamination ------------------------------------------------------------------------

def plan_contamination(config: Any) -> list[StagePlan]:
    """The evaluation set's chunks and features per unit, the scans after them per stage."""
    from flows.contamination import CODE_MODULES

    corpus = Store(config.corpus, config.corpus_storage_options)
    out = Store(config.out, config.out_storage_options)
    eval_stages = contamination_plan.plan_units(out, corpus, config.eval_set, config.image, config.features)
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
    return [*eval_stages, image, judge, text, leakage, edition, report]


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
    corpus = Store(config.corpus, config.corpus_storage_options) if config.corpus else None
    _, prompts, _, pool = read_prompts(config)
    return prompts_plan.plan_units(out, corpus, config.density, config.variance, config.text_model, prompts, pool)


# ---- evaluate -----------------------------------------------------------------------------

def plan_evaluate(config: Any) -> list[StagePlan]:
    """Every chunk of generated images: read back or embedded, and why; then the metrics."""
    from tasks.stats.evaluate import check_model, expected_identity, load_reference, plan_generated

    reference = load_reference(config.reference, config.reference_storage_options)
    check_model(reference, expected_identity(config.model), config.allow_mismatch, config.protocol)
    chunks = plan_generated(config.generated, config.generated_storage_options, config.chunk_size)
    if not chunks:
        raise FileNotFoundError(f"no images or tars under {config.generated}")
    out = Store(config.out, config.out_storage_options)
    features = None if config.feature_store is None else Store(config.feature_store, config.out_storage_options)
    return evaluate_plan.plan_units(out, features, chunks, config.model, config.runtime.precision,
                                    config.generated_storage_options)


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
        estimate.update(staged_size(eval_store, todo))
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
