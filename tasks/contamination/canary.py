"""Text canaries as seed 003 defines them: exact bytes, normalised text, token shingles, seeded signatures.

The scalar reference (one text at a time) that :mod:`tasks.contamination.signatures` is tested
against; it reproduces the seed's runnable fixture exactly (signature vectors, rounded scores,
decisions; ``tests/test_contamination.py``). The rules are :data:`NORMALIZATION_PROFILE`'s
(Python's ``[\\W_]`` is exactly "not L*/N*" under its Unicode tables; checked in the tests).

Deviations from the seed's script, all on texts the fixture does not contain: a text with
1–2 tokens is one shingle of all its tokens (the script gives it no shingles, so any
two short texts get identical all-zero signatures and score 1.0 — tag lists and short
answers must not all match each other); a text with no tokens has no signature and
scores 0. Scores are rounded to 3 decimals half-up, as the script's ``toFixed(3)``,
and the decision reads the rounded value, so a reviewer replays it from the row.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

SEED_SIGNATURE_SEEDS: tuple[int, ...] = (11, 29, 47, 71, 101, 131, 173, 211)
FNV32_OFFSET = 2166136261
FNV32_PRIME = 16777619
MASK32 = 0xFFFFFFFF

_NOT_LETTER_OR_DIGIT = re.compile(r"[\W_]+")

# Written into every receipt: what "normalised" means for the hashes and shingles.
NORMALIZATION_PROFILE = {
    "unicode": "NFKC",
    "case": "lower (str.lower, full Unicode mapping)",
    "punctuation": "runs of characters outside Unicode categories L*/N* -> one space; trimmed",
    "tokens": "split on spaces",
    "shingles": "sets of consecutive token 3-grams joined by one space; 1-2 tokens: one shingle of all tokens",
    "signature_hash": "FNV-1a 32-bit over code points, offset basis XOR seed, min over shingles",
    "rounding": "scores to 3 decimals, half-up (JavaScript toFixed)",
}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def normalize(text: str) -> str:
    """The seed's normalisation: NFKC, lower case, non-letters/digits to single spaces, trimmed."""
    return _NOT_LETTER_OR_DIGIT.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def shingles(normalized: str) -> list[str]:
    """Distinct token 3-shingles in first-seen order (1–2 tokens: one shingle of them all)."""
    tokens = normalized.split()
    if not tokens:
        return []
    if len(tokens) < 3:
        return [" ".join(tokens)]
    return list(dict.fromkeys(map(" ".join, zip(tokens, tokens[1:], tokens[2:]))))


def fnv1a32(text: str, seed: int = 0) -> int:
    """32-bit FNV-1a over code points with the offset basis XORed with ``seed`` (the seed's ``fnv``)."""
    h = (FNV32_OFFSET ^ seed) & MASK32
    for ch in text:
        h = ((h ^ ord(ch)) * FNV32_PRIME) & MASK32
    return h


def signature(grams: Sequence[str], seeds: Sequence[int] = SEED_SIGNATURE_SEEDS) -> list[int] | None:
    """Per seed, the minimum FNV-1a of the shingles; None for a text without shingles."""
    if not grams:
        return None
    return [min(fnv1a32(g, s) for g in grams) for s in seeds]


def signature_estimate(a: Sequence[int] | None, b: Sequence[int] | None) -> float:
    """Fraction of positions where two signatures agree (0 when either text has none)."""
    if a is None or b is None:
        return 0.0
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def direct_jaccard(a: set[str] | Sequence[str], b: set[str] | Sequence[str]) -> tuple[float, int, int]:
    """Jaccard of two shingle sets, with the intersection and union sizes it came from."""
    sa, sb = set(a), set(b)
    hit = len(sa & sb)
    union = len(sa) + len(sb) - hit
    return hit / (union or 1), hit, union


def round3(x: float) -> float:
    """Round to 3 decimals half-up on the exact binary value, as JavaScript's ``toFixed(3)``."""
    return float(Decimal(x).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))


def signature_bands_needed(threshold: float, n_positions: int) -> int:
    """Equal positions a pair needs to reach ``threshold`` (3 of 8 for 0.375)."""
    return max(1, math.ceil(threshold * n_positions - 1e-9))


@dataclass(frozen=True)
class CanaryThresholds:
    """Declared before scanning and frozen into the receipt (defaults: the seed's)."""

    exact: bool = True
    normalized: bool = True
    direct_jaccard: float = 0.4
    signature: float = 0.375
    review_direct_jaccard: float | None = None   # a review band below quarantine
    review_signature: float | None = None


@dataclass(frozen=True)
class TextFacts:
    """What one text contributes to any comparison."""

    sha256: str
    normalized_sha256: str
    grams: frozenset[str]
    signature: tuple[int, ...] | None

    @classmethod
    def of(cls, text: str, seeds: Sequence[int] = SEED_SIGNATURE_SEEDS) -> TextFacts:
        norm = normalize(text)
        grams = shingles(norm)
        sig = signature(grams, seeds)
        return cls(sha256_text(text), sha256_text(norm), frozenset(grams), tuple(sig) if sig else None)


@dataclass(frozen=True)
class PairScores:
    """The raw evidence of one (item, corpus text) comparison."""

    exact: bool
    normalized: bool
    direct: float          # rounded to 3 decimals
    signature: float       # rounded to 3 decimals
    intersection: int
    union: int


def compare(item: TextFacts, doc: TextFacts) -> PairScores:
    """Every canary score of one pair; an empty normalised text never matches by normalisation."""
    direct, hit, union = direct_jaccard(item.grams, doc.grams)
    normalized = item.normalized_sha256 == doc.normalized_sha256 and bool(item.grams)
    return PairScores(item.sha256 == doc.sha256, normalized, round3(direct),
                      round3(signature_estimate(item.signature, doc.signature)), hit, union)


def decide(scores: PairScores | None, t: CanaryThresholds) -> tuple[str, str]:
    """``(decision, rule)`` from the row's own scores: quarantine, review or retain, and which
    declared threshold fired (empty for retain)."""
    if scores is None:
        return "retain", ""
    if t.exact and scores.exact:
        return "quarantine", "exact"
    if t.normalized and scores.normalized:
        return "quarantine", "normalized"
    if scores.direct >= t.direct_jaccard:
        return "quarantine", f"direct_jaccard>={t.direct_jaccard}"
    if scores.signature >= t.signature:
        return "quarantine", f"signature>={t.signature}"
    if t.review_direct_jaccard is not None and scores.direct >= t.review_direct_jaccard:
        return "review", f"direct_jaccard>={t.review_direct_jaccard}"
    if t.review_signature is not None and scores.signature >= t.review_signature:
        return "review", f"signature>={t.review_signature}"
    return "retain", ""
