"""Signal 1, category density: is a prompt in a region the corpus covers densely?

Direct mode: the cosine to the k-th nearest sampled caption (exact FAISS inner product), flagged
above the ``reference_quantile`` of the same score of sampled captions among the *other* ones,
i.e. denser than most of the corpus's own captions. Taxonomy mode (the seed's): a category's
density is its share of the caption sample, and prompts in categories at or above the
``category_quantile`` of shares are flagged. Both are heuristics over a caption sample and one
text model's geometry: a risk indicator for review, not evidence that any model trained on a
prompt's subject (docs/prompt-qualification.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _index(vectors: np.ndarray) -> Any:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def knn_similarity(queries: np.ndarray, corpus: np.ndarray, k: int) -> np.ndarray:
    """Cosine similarity of each (unit) query to its k-th nearest (unit) corpus row; float64."""
    if len(queries) == 0:
        return np.zeros(0)
    k = min(k, len(corpus))
    sims, _ = _index(corpus).search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return sims[:, k - 1].astype(np.float64)


def reference_similarities(corpus: np.ndarray, k: int, n_queries: int, seed: int) -> np.ndarray:
    """The k-NN similarity of up to ``n_queries`` sampled captions among the others (self left out)."""
    n = len(corpus)
    if n < 2:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, size=min(n_queries, n), replace=False))
    k = min(k, n - 1)
    sims, ids = _index(corpus).search(np.ascontiguousarray(corpus[rows], dtype=np.float32), k + 1)
    out = np.empty(len(rows))
    for j, row in enumerate(rows):
        others = sims[j][ids[j] != row]
        out[j] = others[k - 1]
    return out


def direct_density(prompts: np.ndarray, corpus: np.ndarray, k: int, quantile: float, n_queries: int,
                   seed: int) -> dict[str, Any]:
    """Direct mode: per-prompt scores, the reference threshold and flags."""
    if len(corpus) < 2:
        raise ValueError(f"the caption sample has {len(corpus)} embedded captions: need at least 2 for a density")
    scores = knn_similarity(prompts, corpus, k)
    reference = reference_similarities(corpus, k, n_queries, seed)
    threshold = float(np.quantile(reference, quantile))
    return {"scores": scores, "threshold": threshold, "flags": scores > threshold,
            "k": min(k, len(corpus)), "reference_n": len(reference),
            "reference_quantiles": {str(q): float(np.quantile(reference, q)) for q in (0.1, 0.5, 0.9, 0.99)}}


def assign(vectors: np.ndarray, categories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest category (index) of each unit row and its cosine similarity."""
    if len(vectors) == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    sims = vectors.astype(np.float64) @ categories.astype(np.float64).T
    best = sims.argmax(axis=1)
    return best, sims[np.arange(len(vectors)), best]


def flat_divergence(counts: np.ndarray) -> dict[str, float]:
    """KL(p ‖ uniform) in nats and total variation of a count vector against a flat target."""
    total = counts.sum()
    if total == 0:
        return {"kl_nats": float("nan"), "total_variation": float("nan")}
    p = counts / total
    k = len(counts)
    nz = p > 0
    return {"kl_nats": float(np.sum(p[nz] * np.log(p[nz] * k))),
            "total_variation": float(0.5 * np.abs(p - 1 / k).sum())}


def taxonomy_density(prompt_categories: np.ndarray, caption_categories: np.ndarray, n_categories: int,
                     quantile: float) -> dict[str, Any]:
    """Taxonomy mode: corpus share per category, the dense categories, prompt flags, divergences."""
    if len(caption_categories) == 0:
        raise ValueError("the caption sample has no embedded captions: no category density")
    corpus_counts = np.bincount(caption_categories, minlength=n_categories).astype(np.float64)
    prompt_counts = np.bincount(prompt_categories, minlength=n_categories).astype(np.float64)
    shares = corpus_counts / corpus_counts.sum()
    threshold = float(np.quantile(shares, quantile))
    dense = shares >= threshold
    return {"corpus_counts": corpus_counts, "prompt_counts": prompt_counts, "shares": shares,
            "threshold": threshold, "dense": dense, "flags": dense[prompt_categories],
            "prompt_divergence": flat_divergence(prompt_counts), "corpus_divergence": flat_divergence(corpus_counts)}
