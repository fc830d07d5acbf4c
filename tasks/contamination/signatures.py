"""Canary facts of many texts at once: hashes, shingle sets, seeded and LSH signatures in numpy.

The values of :mod:`tasks.contamination.canary`'s rules for a batch (tested equal to it):
normalising and cutting shingles is per text in Python, everything per shingle vectorised over
the batch's *distinct* shingles (captions share many), one numpy pass per code-point position.
Shingle identities are FNV-1a 64 (two distinct shingles collide with probability ~2^-64). The LSH
signature is ``num_perm`` minima of ``fmix32(identity ^ salt_i)``: independent of the seed's
eight FNV seeds, whose offset-basis XOR leaves neighbouring seeds correlated, so bands built on it
behave like the textbook analysis says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tasks.contamination.canary import (FNV32_OFFSET, FNV32_PRIME, SEED_SIGNATURE_SEEDS, normalize, sha256_text,
                                        shingles)

FNV64_OFFSET = 14695981039346656037
FNV64_PRIME = 1099511628211
_M32 = np.uint64(0xFFFFFFFF)


@dataclass
class TextBatch:
    """Facts of ``n`` texts. Texts without shingles have ``n_grams == 0``, an all-zero
    ``signature``/``lsh`` row (never used: ``has_signature`` is False) and no identities."""

    sha256: list[str]
    normalized_sha256: list[str]
    normalized_empty: np.ndarray      # bool [n]
    n_grams: np.ndarray               # int32 [n]
    signature: np.ndarray             # uint32 [n, len(seeds)]
    lsh: np.ndarray                   # uint32 [n, num_perm]
    gram_offsets: np.ndarray          # int64 [n + 1] into gram_ids
    gram_ids: np.ndarray              # uint64, each text's distinct identities, sorted

    @property
    def has_signature(self) -> np.ndarray:
        return self.n_grams > 0

    def __len__(self) -> int:
        return len(self.sha256)


def lsh_salts(num_perm: int, seed: int) -> np.ndarray:
    """``num_perm`` 32-bit salts from ``seed`` (SplitMix64), fixed for a given seed."""
    out = np.empty(num_perm, dtype=np.uint32)
    state = seed & 0xFFFFFFFFFFFFFFFF
    for i in range(num_perm):
        state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        out[i] = (z ^ (z >> 31)) & 0xFFFFFFFF
    return out


def fmix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser (a bijection on uint32), vectorised."""
    x = x.astype(np.uint32, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
    return x


def _fnv_rows(code_points: np.ndarray, starts: np.ndarray, lengths: np.ndarray, bases: Sequence[int],
              prime: int, bits: int) -> np.ndarray:
    """FNV-1a of every string (given as code-point runs) for each offset basis: [len(bases), n]."""
    n = len(starts)
    order = np.argsort(-lengths, kind="stable")          # longest first: active strings are a prefix
    s_starts, s_lengths = starts[order], lengths[order]
    h = np.repeat(np.asarray(bases, dtype=np.uint64)[:, None], n, axis=1)
    p = np.uint64(prime)
    longest = int(s_lengths[0]) if n else 0
    # active[j]: how many strings are longer than j
    active = np.searchsorted(-s_lengths, -np.arange(longest), side="left")
    with np.errstate(over="ignore"):
        for j in range(longest):
            k = int(active[j])
            c = code_points[s_starts[:k] + j].astype(np.uint64)
            if bits == 32:
                h[:, :k] = ((h[:, :k] ^ c) * p) & _M32
            else:
                h[:, :k] = (h[:, :k] ^ c) * p
    out = np.empty_like(h)
    out[:, order] = h
    return out


def text_batch(texts: Sequence[str], seeds: Sequence[int] = SEED_SIGNATURE_SEEDS, num_perm: int = 64,
               lsh_seed: int = 0) -> TextBatch:
    """All canary facts of ``texts`` (see the module docstring)."""
    n = len(texts)
    norms = [normalize(t) for t in texts]
    vocab: dict[str, int] = {}  # shingle -> its number, in first-seen order
    per_text = [[vocab.setdefault(g, len(vocab)) for g in shingles(norm)] for norm in norms]
    n_grams = np.array([len(g) for g in per_text], dtype=np.int32)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_grams, out=offsets[1:])
    flat = np.fromiter((i for g in per_text for i in g), dtype=np.int64, count=int(offsets[-1]))

    words = list(vocab)
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    starts = np.zeros(len(words), dtype=np.int64)
    if len(words) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    cps = np.frombuffer("".join(words).encode("utf-32-le"), dtype=np.uint32)
    seed_h = _fnv_rows(cps, starts, lengths, [(FNV32_OFFSET ^ s) & 0xFFFFFFFF for s in seeds], FNV32_PRIME, 32)
    ident = _fnv_rows(cps, starts, lengths, [FNV64_OFFSET], FNV64_PRIME, 64)[0]
    folded = ((ident ^ (ident >> np.uint64(32))) & _M32).astype(np.uint32)
    salts = lsh_salts(num_perm, lsh_seed)

    sig = np.zeros((n, len(seeds)), dtype=np.uint32)
    lsh = np.zeros((n, num_perm), dtype=np.uint32)
    has = n_grams > 0
    if flat.size:
        starts_t = offsets[:-1][has]
        sig[has] = np.minimum.reduceat(seed_h[:, flat].astype(np.uint32), starts_t, axis=1).T
        for lo in range(0, num_perm, 16):      # bounded temporaries: 16 permutations at a time
            perm = fmix32(folded[None, :] ^ salts[lo:lo + 16, None])
            lsh[has, lo:lo + 16] = np.minimum.reduceat(perm[:, flat], starts_t, axis=1).T
    gram_ids = ident[flat] if flat.size else np.zeros(0, dtype=np.uint64)
    owner = np.repeat(np.arange(n), n_grams)
    gram_ids = gram_ids[np.lexsort((gram_ids, owner))]      # each text's identities, sorted
    return TextBatch([sha256_text(t) for t in texts], [sha256_text(m) for m in norms],
                     np.array([not m for m in norms], dtype=bool), n_grams, sig, lsh, offsets, gram_ids)
