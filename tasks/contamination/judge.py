"""Image–text contamination (seed 001's second rate): can an item's answer be inferred from
the training captions retrieved for its image?

A :class:`Judge` returns a :class:`Verdict` (``inferable``, ``not_inferable`` or ``unresolved``)
and has an identity, so every number says which judge made it. :class:`CanaryOverlapJudge`
(default, deterministic): answers too short to carry evidence (yes, no, a letter, a digit) are
``unresolved``, since overlap cannot tell. :class:`ChatJudge`: an OpenAI-compatible endpoint at
temperature 0 through :mod:`corpusforge.chat`; a failure after its retries, or a reply without a
boolean ``inferable``, is ``unresolved`` with the error recorded, never a silent "not
inferable". The API key is read from the named environment variable and never written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from corpusforge.chat import Endpoint, RetryPolicy, complete
from corpusforge.hashing import canonical_json
from tasks.contamination.canary import normalize, shingles
from tasks.contamination.config import ChatJudgeConfig, JudgeConfig

INFERABLE, NOT_INFERABLE, UNRESOLVED = "inferable", "not_inferable", "unresolved"

CHAT_PROMPT = (
    "You check benchmark items for contamination. You get a question about an image, its reference answer, "
    "and captions of training images that look like the item's image. Decide whether the reference answer "
    "can be directly inferred from these captions alone. Reply with one JSON object and nothing else: "
    '{"inferable": true or false, "reason": "<one short sentence>"}')


@dataclass(frozen=True)
class JudgeInput:
    item_id: str
    question: str
    answer: str
    captions: tuple[tuple[str, str, float], ...]     # (training key, caption, image similarity)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    evidence: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 0


class Judge(Protocol):
    name: str

    def identity(self) -> dict[str, Any]:
        """Everything that determines this judge's verdicts (no secrets)."""

    def judge(self, x: JudgeInput) -> Verdict: ...


class CanaryOverlapJudge:
    """Answer–caption overlap with the canaries' normalisation and shingles."""

    name = "canary_overlap"

    def __init__(self, cfg: JudgeConfig):
        self.containment = cfg.containment
        self.min_answer_chars = cfg.min_answer_chars

    def identity(self) -> dict[str, Any]:
        return {"judge": self.name, "containment": self.containment, "min_answer_chars": self.min_answer_chars,
                "shingles": "normalised token 3-shingles (tokens below 3)"}

    def judge(self, x: JudgeInput) -> Verdict:
        answer = normalize(x.answer or "")
        if len(answer) < self.min_answer_chars:
            return Verdict(UNRESOLVED, {"why": "answer too short to judge by overlap", "answer": answer})
        tokens = answer.split()
        grams = set(shingles(answer)) if len(tokens) >= 3 else set(tokens)
        best: tuple[float, str | None] = (0.0, None)
        for key, caption, _ in x.captions:
            norm = normalize(caption or "")
            have = set(shingles(norm)) if len(tokens) >= 3 else set(norm.split())
            share = len(grams & have) / len(grams)
            if share > best[0]:
                best = (share, key)
        evidence = {"containment": round(best[0], 6), "caption_key": best[1], "captions": len(x.captions)}
        return Verdict(INFERABLE if best[0] >= self.containment else NOT_INFERABLE, evidence)


class ChatJudge:
    """An OpenAI-compatible chat endpoint; see the module docstring for failure handling."""

    name = "chat"

    def __init__(self, cfg: ChatJudgeConfig):
        self.cfg = cfg

    def identity(self) -> dict[str, Any]:
        c = self.cfg
        return {"judge": self.name, "base_url": c.base_url, "model": c.model, "temperature": 0,
                "max_tokens": c.max_tokens, "max_caption_chars": c.max_caption_chars,
                "prompt_sha256": hashlib.sha256(CHAT_PROMPT.encode()).hexdigest()}

    def _messages(self, x: JudgeInput) -> list[dict[str, str]]:
        lines, budget = [], self.cfg.max_caption_chars
        for n, (_, caption, similarity) in enumerate(x.captions, 1):
            text = (caption or "")[:max(0, budget)]
            budget -= len(text)
            lines.append(f"{n}. (image similarity {similarity:.3f}) {text}")
        user = (f"Question: {x.question}\nReference answer: {x.answer}\nTraining captions:\n" + "\n".join(lines))
        return [{"role": "system", "content": CHAT_PROMPT}, {"role": "user", "content": user}]

    def judge(self, x: JudgeInput) -> Verdict:
        c = self.cfg
        key = os.environ.get(c.api_key_env) if c.api_key_env else None
        body = {"model": c.model, "messages": self._messages(x), "temperature": 0, "max_tokens": c.max_tokens}
        with httpx.Client(timeout=c.timeout_s) as http:
            done = complete(http, Endpoint(c.base_url, c.timeout_s, key), body,
                            RetryPolicy(c.retries + 1, c.backoff_s), preview=200)
        if done.error is not None:
            return Verdict(UNRESOLVED, {}, done.error, done.attempts)
        return _verdict(done.content or "", done.attempts)


_JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def _verdict(content: str, attempt: int) -> Verdict:
    """A verdict from a chat completion's text, or ``unresolved`` when it holds none."""
    match = _JSON_OBJECT.search(content)
    try:
        obj = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict) or not isinstance(obj.get("inferable"), bool):
        return Verdict(UNRESOLVED, {"reply": content[:500]}, "malformed reply: no boolean 'inferable'", attempt)
    reason = obj.get("reason")
    return Verdict(INFERABLE if obj["inferable"] else NOT_INFERABLE,
                   {"reason": reason if isinstance(reason, str) else None}, None, attempt)


def make_judge(cfg: JudgeConfig) -> Judge:
    if cfg.kind == "chat":
        assert cfg.chat is not None
        return ChatJudge(cfg.chat)
    return CanaryOverlapJudge(cfg)


def identity_sha256(judge: Judge) -> str:
    return hashlib.sha256(canonical_json(judge.identity()).encode()).hexdigest()
