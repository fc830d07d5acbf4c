"""Signals 1 and 2 as a flow runs them: cut the units, then summarise what they wrote.

The flow fans out the units between the two calls; everything before and after the fan-out
is here, so the flow reads as a table of contents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from corpusforge.contract import Unit, UnitResult, prune
from corpusforge.hashing import canonical_json, sha256_bytes
from tasks.prompts.files import PROMPTS_CAPTIONS, generated_variance_path
from corpusforge.storage import Store
from tasks.prompts import captions, density, generated, tables, variance
from tasks.prompts.config import DensityConfig, TextModelConfig, VarianceConfig
from tasks.prompts.text_model import text_model_identity


# ---- signal 1 ---------------------------------------------------------------------------

# The two signals' units: a staging shard's caption sample embedded, a generated model's outputs' variance.
EMBED_CAPTIONS = Unit(captions.embed_shard_captions, "embed-caption-sample")
VARIANCE = Unit(variance.variance_unit, "generated-output-variance")
LIST_GENERATED = Unit(generated.list_generated, "list-generated-images")


@dataclass(frozen=True)
class DensityCuts:
    """The caption sample and the caption-embedding units the flow runs (``calls``)."""

    identity: dict[str, Any]  # the text model's
    sample: dict[str, Any]  # the sample unit's info
    shards: list[str]  # staging shards holding sampled captions, sorted
    calls: list[dict[str, Any]]  # keyword arguments of :func:`captions.embed_shard_captions`, one per shard


def cut_density_units(corpus: Store, out: Store, cfg: DensityConfig, tm: TextModelConfig) -> DensityCuts:
    """Sample the corpus's kept captions (one unit) and cut one embedding unit per staging
    shard they lie in; embeddings of shards no longer sampled are removed."""
    identity = text_model_identity(tm.name)
    sample = captions.sample_captions(corpus, out, cfg.sample_size, cfg.sample_seed, cfg.splits)
    by_shard = captions.sampled_keys_by_shard(out)
    shards = sorted(by_shard)
    prune(out, PROMPTS_CAPTIONS, shards)
    calls = [{"corpus": corpus, "out": out, "shard": s, "keys": by_shard[s], "text_model": tm, "identity": identity}
             for s in shards]
    return DensityCuts(identity, sample.info, shards, calls)


def density_signal(cuts: DensityCuts, out: Store, cfg: DensityConfig, tm: TextModelConfig,
                   prompts: list[dict[str, Any]], pool: list[dict[str, Any]]
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Density of every valid prompt (and pool prompt) against the embedded caption sample.
    Sets ``density`` (and ``category``) on those rows; returns the summary and category table."""
    identity = cuts.identity
    corpus_vectors = captions.load_caption_embeddings(out, cuts.shards)
    valid = [p for p in prompts if p["status"] == "valid"]
    prompt_vectors = captions.embed_text_list(out, "prompts", [p["text"] for p in valid], tm, identity)
    pool_vectors = captions.embed_text_list(out, "pool", [q["text"] for q in pool], tm, identity)
    summary: dict[str, Any] = {"mode": cfg.mode, "text_model": identity, "sample": cuts.sample,
                               "captions_embedded": len(corpus_vectors), "scored": len(valid)}
    category_rows: list[dict[str, Any]] = []
    if cfg.mode == "direct":
        d = density.direct_density(np.concatenate([prompt_vectors, pool_vectors]), corpus_vectors, cfg.k,
                                   cfg.reference_quantile, cfg.reference_queries, cfg.sample_seed)
        for row, score, flag in zip(valid + pool, d["scores"], d["flags"], strict=True):
            row["density"] = {"mode": "direct", "score": float(score), "threshold": d["threshold"],
                              "flagged": bool(flag), "rule": f"density:knn{d['k']}_similarity>{d['threshold']:.4f}"}
        summary.update(k=d["k"], threshold=d["threshold"], reference_quantile=cfg.reference_quantile,
                       reference_n=d["reference_n"], reference_quantiles=d["reference_quantiles"])
    else:
        taxonomy = tables.taxonomy_categories(tables.read_input(cfg.taxonomy, cfg.taxonomy_storage_options))
        names = [c["name"] for c in taxonomy]
        cat_vectors = captions.embed_text_list(out, "taxonomy", [tables.category_text(c) for c in taxonomy], tm,
                                               identity)
        caption_cats, _ = density.assign(corpus_vectors, cat_vectors)
        assigned, similarity = density.assign(np.concatenate([prompt_vectors, pool_vectors]), cat_vectors)
        rows = valid + pool
        chosen = np.array([names.index(r["category"]) if r["category"] in names else int(a)
                           for r, a in zip(rows, assigned, strict=True)], dtype=np.int64)
        d = density.taxonomy_density(chosen[:len(valid)], caption_cats, len(names), cfg.category_quantile)
        for i, row in enumerate(rows):
            c = int(chosen[i])
            given = row["category"] in names
            row["category_source"] = "given" if given else "assigned"
            row["category"] = names[c]
            row["density"] = {"mode": "taxonomy", "category": names[c], "score": float(d["shares"][c]),
                              "threshold": d["threshold"], "flagged": bool(d["dense"][c]),
                              "similarity": None if given else float(similarity[i]),
                              "rule": f"density:category[{names[c]}]_share>={d['threshold']:.4f}"}
        category_rows = [{"name": n, "corpus_captions": int(d["corpus_counts"][c]),
                          "corpus_share": float(d["shares"][c]),
                          "prompts": int(d["prompt_counts"][c]), "dense": bool(d["dense"][c])}
                         for c, n in enumerate(names)]
        summary.update(threshold=d["threshold"], category_quantile=cfg.category_quantile, categories=category_rows,
                       prompt_divergence=d["prompt_divergence"], corpus_divergence=d["corpus_divergence"])
    summary["flagged"] = sum(bool(p["density"]["flagged"]) for p in valid)
    summary["pool_flagged"] = sum(bool(q["density"]["flagged"]) for q in pool)
    return summary, category_rows


# ---- signal 2 ---------------------------------------------------------------------------

@dataclass(frozen=True)
class VarianceCuts:
    """The generated images found and the variance units the flow runs (``calls``): O(models +
    units), the images themselves stay in the listing file."""

    models: list[str]  # every model with images, sorted
    unknown: list[str]  # {model}/{prompt_id} folders of prompts not in the valid set
    unusable: list[str]  # the first files found that are not {model}/{prompt_id}/{image} with safe names
    chunks: dict[str, list[str]]  # model → its units' chunk names, in order
    calls: list[dict[str, Any]]  # keyword arguments of :func:`variance.variance_unit`, one per unit


def cut_variance_units(cfg: VarianceConfig, out: Store, listing: generated.GeneratedListing) -> VarianceCuts:
    """One unit per (model, chunk of ``prompts_per_unit`` valid prompts with images), as the
    listing (the :data:`LIST_GENERATED` unit) cut them; outputs of units no longer cut are
    removed."""
    cuts = variance_units(cfg, out, listing)
    variance.prune_generated(out, cuts.chunks)
    return cuts


def variance_units(cfg: VarianceConfig, out: Store, listing: generated.GeneratedListing) -> VarianceCuts:
    """The units :func:`cut_variance_units` cuts, from the listing's unit counts (writes nothing)."""
    chunks = {model: [generated.chunk_name(n) for n in range(units)] for model, units in listing["units"].items()}
    calls = [{"out": out, "generated": cfg.generated, "options": cfg.storage_options, "model": model, "unit": n,
              "cfg": cfg} for model, units in listing["units"].items() for n in range(units)]
    return VarianceCuts(listing["models"], listing["unknown_prompt_folders"], listing["unusable"], chunks, calls)


def variance_signal(cuts: VarianceCuts, markers: list[UnitResult], cfg: VarianceConfig, out: Store,
                    prompts: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per (prompt, model) variance and flags from the units' outputs (``markers``: the
    units' markers); sets ``variance`` on valid prompt rows; returns the summary and rows."""
    valid = [p for p in prompts if p["status"] == "valid"]
    identities = {canonical_json(m.info["identity"]): m.info["identity"] for m in markers}
    identity = next(iter(identities.values()), {"model_id": cfg.model.model_id})
    rows = [r for model, chunks in cuts.chunks.items() for c in chunks
            for r in out.read_parquet(generated_variance_path(model, c)).to_pylist()]
    per_model = []
    by_prompt: dict[str, dict[str, Any]] = {p["prompt_id"]: {} for p in valid}
    for model in cuts.models:
        model_rows = {r["prompt_id"]: r for r in rows if r["model"] == model}
        values = np.array([np.nan if model_rows.get(p["prompt_id"], {}).get("variance") is None
                           else model_rows[p["prompt_id"]]["variance"] for p in valid], dtype=np.float64)
        f = variance.variance_flags(values, cfg.sd_threshold)
        for p, value, flag in zip(valid, values, f["flags"], strict=True):
            r = model_rows.get(p["prompt_id"])
            by_prompt[p["prompt_id"]][model] = {
                "variance": None if np.isnan(value) else float(value), "flagged": bool(flag), "cut": f["cut"],
                "mean": f["mean"], "sd": f["sd"], "n_images": r["n_images"] if r else 0,
                "n_embedded": r["n_embedded"] if r else 0}
        per_model.append({"model": model, "n": f["n"], "mean": f["mean"], "sd": f["sd"], "cut": f["cut"],
                          "flagged": int(f["flags"].sum()), "prompts_without_images": int(sum(
                              p["prompt_id"] not in model_rows for p in valid)),
                          "images_digest": sha256_bytes(canonical_json(
                              [[r["prompt_id"], r["images"]] for r in sorted(model_rows.values(),
                                                                             key=lambda r: r["prompt_id"])]).encode())})
    for p in valid:
        p["variance"] = by_prompt[p["prompt_id"]]
    strong = sum(sum(v["flagged"] for v in p["variance"].values()) >= cfg.strong_min_models for p in valid)
    summary = {"image_model": identity, "sd_threshold": cfg.sd_threshold, "min_images": cfg.min_images,
               "strong_min_models": cfg.strong_min_models, "models": per_model, "strong": int(strong),
               "unknown_prompt_folders": cuts.unknown,
               "unusable_files": cuts.unusable,
               "image_errors": sum(r["n_images"] - r["n_embedded"] for r in rows)}
    return summary, rows
