"""The captioning and VLM-filter stage, between near-duplicate removal and release (GPIC §2.2, §2.4).

1. **Assign** (one task): which surviving records the model captions (no input caption, or
   ``recaption``), and in which caption type (:mod:`tasks.captions.mix`).
2. **Ask** (one task per staging shard): one request per caption and filter question, journaled
   once answered (``work/captions/journal/{shard}/``) and never asked again (:func:`request_key`).
3. **Decide**: ``captions/{shard}.parquet``, one row per assigned record (:func:`decide`).

A shard unit's fingerprint holds the stage's identity (never the URL, concurrency or key) and its
assignment file's and staging tar's digests; a unit where some request gave up on transient
errors is marked *incomplete*, so the next run recomputes it, asking only those. Outcomes and
the journal's guarantees: docs/captioning.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from corpusforge.contract import (COMPUTED, SKIPPED, FanOut, Unit, UnitResult, current_marker, finish_unit, in_process,
                                  must_compute, prune, require_marker, summarise, unit_fingerprint)
from corpusforge.hashing import canonical_json, sha256_bytes
from corpusforge.layout import staging_index, staging_records, staging_tar
from tasks.captions.files import (CAPTIONS_DIR, CAPTIONS_SCHEMA, CAPTION_JOURNAL_DIR, CAPTION_JOURNAL_SCHEMA,
                                  CAPTION_ASSIGNMENT_DIR, CAPTION_ASSIGNMENT_SCHEMA, caption_journal_dir,
                                  caption_assignment_path,
                                  captions_path)
from tasks.graph.files import decisions_path
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.captions.client import Outcome, Request, ask_all
from tasks.captions.config import NOT_VISIBLE, CaptioningConfig
from tasks.captions.mix import assign_types
from tasks.captions.prompts import Prompt, caption_prompts, question_prompts

INCOMPLETE = ":incomplete"


def identity(cfg: CaptioningConfig) -> dict[str, Any]:
    """Everything that decides the stage's answers and decisions (no URL, key or concurrency)."""
    return {"model": cfg.endpoint.model, "sampling": cfg.sampling.model_dump(mode="json"),
            "max_side": cfg.max_side, "jpeg_quality": cfg.jpeg_quality, "max_words": cfg.max_words,
            "prompts": {t: p.sha256 for t, p in caption_prompts(cfg).items()},
            "questions": [{"name": q.name, "prompt_sha256": p.sha256, "filter_on": q.filter_on}
                          for q, p in zip(cfg.questions, question_prompts(cfg).values(), strict=True)]}


def request_key(cfg: CaptioningConfig, image_sha256: str, prompt: Prompt) -> str:
    return sha256_bytes(canonical_json([image_sha256, prompt.sha256, cfg.endpoint.model,
                                        cfg.sampling.model_dump(mode="json"), cfg.max_side,
                                        cfg.jpeg_quality]).encode())


def caption_origin(model: str, prompt: Prompt) -> str:
    return f"model:{model}@{prompt.sha256[:12]}"


# ---- 1. assign ------------------------------------------------------------------------
def assign_captions(store: Store, shards: list[str], cfg: CaptioningConfig, near_dedup: bool) -> dict[str, str]:
    """Write every staging shard's caption assignment; return shard -> assignment file SHA-256.

    Holds (key, shard) of the surviving records in one process, like the release assignment."""
    survivors: dict[str, list[dict[str, Any]]] = {}
    for shard in shards:
        removed = {d["key"] for d in store.read_parquet(decisions_path(shard)).to_pylist()
                   if d["status"] != Status.KEPT.value} if near_dedup else set()
        has_text = {m["key"] for m in store.read_parquet(staging_index(shard)).to_pylist()
                    if m["ext"] == "txt" and m["size"] > 0}
        survivors[shard] = [{"key": r["key"], "sha256": r["sha256"], "caption_type": r["caption_type"],
                             "model_caption": cfg.recaption or r["key"] not in has_text}
                            for r in store.read_parquet(staging_records(shard)).to_pylist()
                            if r["key"] not in removed]
    types = assign_types((r["key"] for rows in survivors.values() for r in rows if r["model_caption"]),
                         cfg.mix, cfg.seed)
    digests = {}
    for shard, rows in survivors.items():
        for r in rows:
            if r["model_caption"]:
                r["caption_type"] = types[r["key"]]
        digests[shard] = store.write_parquet(caption_assignment_path(shard),
                                             pa.Table.from_pylist(rows, schema=CAPTION_ASSIGNMENT_SCHEMA))
    return digests


# ---- 2. the journal of completed requests ----------------------------------------------
class Journal:
    """Completed requests of one staging shard: segments ``{n}.parquet``, appended in batches."""

    def __init__(self, store: Store, shard: str, every: int, seconds: float):
        self.store, self.folder, self.every, self.seconds = store, caption_journal_dir(shard), every, seconds
        self.buffer: list[dict[str, Any]] = []
        self.first_unsaved = 0.0
        self.segments = sorted(n for n in store.listdir(self.folder) if n.endswith(".parquet")
                               and not n.startswith("."))

    def load(self) -> dict[str, dict[str, Any]]:
        return {row["request"]: row for name in self.segments
                for row in self.store.read_parquet(f"{self.folder}/{name}").to_pylist()}

    def add(self, row: dict[str, Any]) -> None:
        if not self.buffer:
            self.first_unsaved = time.monotonic()
        self.buffer.append(row)
        if len(self.buffer) >= self.every or time.monotonic() - self.first_unsaved >= self.seconds:
            self.flush()

    def _write(self, rows: list[dict[str, Any]]) -> str:
        """A new segment after the last one, holding ``rows``; its name."""
        last = int(self.segments[-1].split(".", 1)[0]) if self.segments else -1
        name = f"{last + 1:06d}.parquet"
        self.store.write_parquet(f"{self.folder}/{name}", pa.Table.from_pylist(rows, schema=CAPTION_JOURNAL_SCHEMA))
        return name

    def flush(self) -> None:
        if not self.buffer:
            return
        self.segments.append(self._write(self.buffer))
        self.buffer = []

    def compact(self, keep: dict[str, dict[str, Any]]) -> None:
        """One segment with exactly ``keep`` (the requests the current output uses), written
        before the old segments go, so a crash here loses nothing."""
        old = list(self.segments)
        if len(old) == 1 and not self.buffer:
            return
        name = self._write([keep[k] for k in sorted(keep)])
        for n in old:
            self.store.remove(f"{self.folder}/{n}")
        self.segments = [name]


# ---- 3. one staging shard ----------------------------------------------------------------
def _image_loader(store: Store, shard: str) -> Callable[[str], Callable[[], bytes]]:
    spans = {m["key"]: (m["offset"], m["size"]) for m in store.read_parquet(staging_index(shard)).to_pylist()
             if m["ext"] not in ("txt", "json")}

    def loader(key: str) -> Callable[[], bytes]:
        offset, size = spans[key]
        return lambda: store.read_range(staging_tar(shard), offset, size)

    return loader


def _yes_no(content: str | None) -> str | None:
    word = (content or "").strip().strip("\"'`*").split(maxsplit=1)
    token = word[0].strip(".,!;:\"'`*").lower() if word else ""
    return token if token in ("yes", "no") else None


def decide(assignment_row: dict[str, Any], answers: dict[str, dict[str, Any] | None], cfg: CaptioningConfig,
           prompts: dict[str, Prompt], questions: dict[str, Prompt]) -> dict[str, Any]:
    """One record's captions row from its answers (None: no answer yet: a transient failure)."""
    row = {"key": assignment_row["key"], "sha256": assignment_row["sha256"], "status": Status.KEPT.value, "reason": "",
           "caption_type": assignment_row["caption_type"], "caption": None, "caption_origin": "input", "words": None,
           "vlm_model": cfg.endpoint.model if questions else None, "vlm_answers": None}
    errors: list[str] = []
    filtered: list[str] = []
    verdicts = {}
    for q in cfg.questions:
        got = answers[q.name]
        answer = _yes_no(got["content"]) if got and got["error"] is None else None
        verdicts[q.name] = {"answer": answer, "prompt_sha256": questions[q.name].sha256}
        if got is None or got["error"] is not None:
            errors.append(f"question_error: {q.name}: {got['error'] if got else 'no answer'}")
        elif answer is None:
            errors.append(f"question_error: {q.name}: not yes/no: {got['content'][:80]!r}")
        elif answer == q.filter_on:
            filtered.append(q.name)
    if questions:
        row["vlm_answers"] = canonical_json(verdicts)
    if assignment_row["model_caption"]:
        prompt = prompts[assignment_row["caption_type"]]
        row["caption_origin"] = caption_origin(cfg.endpoint.model, prompt)
        got = answers["caption"]
        text = (got["content"] or "").strip() if got and got["error"] is None else None
        limit = cfg.max_words.get(assignment_row["caption_type"], 10**9)
        if got is None or got["error"] is not None:
            errors.append(f"caption_error: {got['error'] if got else 'no answer'}")
        elif text == NOT_VISIBLE:
            filtered.append("not_visible")
        elif not text:
            errors.append("caption_error: empty answer")
        elif got["finish_reason"] == "length" or len(text.split()) > limit:
            errors.append(f"caption_error: over-long ({len(text.split())} words, limit {limit}, "
                          f"finish_reason {got['finish_reason']})")
        else:
            row["caption"], row["words"] = text, len(text.split())
    if filtered:
        row["status"], row["reason"] = Status.FILTERED.value, filtered[0]
    elif errors:
        row["status"], row["reason"] = Status.ERROR.value, errors[0]
    return row


@dataclass(frozen=True)
class CaptionResult(UnitResult):
    """A caption unit's result: its marker, the action, and how many requests this run sent."""

    requests_asked: int = field(default=0, kw_only=True)


def caption_shard(store: Store, shard: str, cfg: CaptioningConfig, assignment_digest: str) -> CaptionResult:
    """Caption and question one staging shard's assigned images (see the module docstring)."""
    prompts, questions = caption_prompts(cfg), question_prompts(cfg)
    staging_digest = require_marker(store, staging_tar(shard), "staging shard").digest
    fp = unit_fingerprint("captions", code_version(__name__), identity(cfg), [assignment_digest, staging_digest])
    if (marker := current_marker(store, captions_path(shard), fp)) is not None:
        return CaptionResult.of(marker, SKIPPED)
    must_compute()

    assignment = store.read_parquet(caption_assignment_path(shard)).to_pylist()
    journal = Journal(store, shard, cfg.journal_every, cfg.journal_seconds)
    done = journal.load()
    load = _image_loader(store, shard)
    wanted: dict[str, dict[str, str]] = {}   # key -> {caption|question name: request key}
    requests: list[Request] = []
    asked: set[str] = set()
    for r in assignment:
        asks = dict(questions)
        if r["model_caption"]:
            asks["caption"] = prompts[r["caption_type"]]
        wanted[r["key"]] = {}
        for what, prompt in asks.items():
            k = request_key(cfg, r["sha256"], prompt)
            wanted[r["key"]][what] = k
            if k not in done and k not in asked:
                asked.add(k)
                requests.append(Request(k, r["sha256"], prompt, load(r["key"])))
    gave_up: dict[str, Outcome] = {}

    def on_done(o: Outcome) -> None:
        if o.transient:
            gave_up[o.key] = o
            return
        row = {"request": o.key, "content": o.content, "finish_reason": o.finish_reason, "error": o.error,
               "attempts": o.attempts}
        done[o.key] = row
        journal.add(row)

    api_key = cfg.endpoint.api_key or (os.environ.get(cfg.endpoint.api_key_env) if cfg.endpoint.api_key_env else None)
    try:
        if requests:
            asyncio.run(ask_all(requests, cfg.endpoint, cfg.sampling, api_key, cfg.max_side, cfg.jpeg_quality,
                                on_done))
    finally:
        journal.flush()  # an interrupted run keeps every answer it got
    def answer(k: str) -> dict[str, Any] | None:
        if k in gave_up:
            return {"content": None, "finish_reason": None, "error": gave_up[k].error}
        return done.get(k)

    rows = [decide(r, {what: answer(k) for what, k in wanted[r["key"]].items()}, cfg, prompts, questions)
            for r in assignment]
    used = {k: done[k] for asks in wanted.values() for k in asks.values() if k in done}
    journal.compact(used)
    sha = store.write_parquet(captions_path(shard), pa.Table.from_pylist(rows, schema=CAPTIONS_SCHEMA))
    words: dict[str, Counter[int]] = defaultdict(Counter)
    for row in rows:
        if row["words"] is not None:
            words[row["caption_type"]][row["words"]] += 1
    info = {"shard": shard, "planned": len(assignment), "gave_up": len(gave_up),
            "by_status": dict(sorted(Counter(r["status"] for r in rows).items())),
            "by_reason": dict(sorted(Counter(r["reason"].split(":", 1)[0] for r in rows if r["reason"]).items())),
            "words": {t: {str(n): c for n, c in sorted(w.items())} for t, w in sorted(words.items())}}
    marker = finish_unit(store, captions_path(shard), fp + (INCOMPLETE if gave_up else ""), {captions_path(shard): sha},
                         info)
    return CaptionResult.of(marker, COMPUTED, requests_asked=len(requests))


ASSIGN_CAPTIONS = Unit(assign_captions, "plan-captions")
CAPTION_SHARD = Unit(caption_shard, "caption-shard", probe=True)


def captioning_stage(store: Store, cfg: CaptioningConfig, staged: list[str], near_dedup: bool, *,
                     fan_out: FanOut = in_process) -> tuple[dict[str, Any], dict[str, Any]]:
    """Assign, then caption every staging shard through ``fan_out``; return (summary, work done)."""
    for folder in (CAPTION_ASSIGNMENT_DIR, CAPTIONS_DIR, CAPTION_JOURNAL_DIR):
        prune(store, folder, staged)
    digests = fan_out(ASSIGN_CAPTIONS, [dict(store=store, shards=staged, cfg=cfg, near_dedup=near_dedup)])[0]
    results = fan_out(CAPTION_SHARD, [dict(store=store, shard=s, cfg=cfg,
                                           assignment_digest=digests[s]) for s in staged])
    return receipt_section(cfg, results), {
        **summarise("captioning", results).counts(),
        "requests_asked": sum(r.requests_asked for r in results),
        "gave_up": sum(r.info["gave_up"] for r in results)}


def receipt_section(cfg: CaptioningConfig, results: list[CaptionResult]) -> dict[str, Any]:
    """The receipt's captioning section: identity, outcomes and word counts per type (no work counts)."""
    by_status: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    words: dict[str, Counter[str]] = defaultdict(Counter)
    for r in results:
        by_status.update(r.info["by_status"])
        by_reason.update(r.info["by_reason"])
        for t, counts in r.info["words"].items():
            words[t].update(counts)
    unfinished = sum(r.info["gave_up"] for r in results)
    return {**identity(cfg), "mix": cfg.mix, "seed": cfg.seed, "recaption": cfg.recaption,
            "records": sum(r.info["planned"] for r in results), "by_status": dict(sorted(by_status.items())),
            "by_reason": dict(sorted(by_reason.items())), "unfinished_requests": unfinished,
            "words": {t: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for t, c in sorted(words.items())}}
