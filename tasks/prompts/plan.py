"""Prompt qualification's units planned before a run (``corpusforge plan``), judged with the
keys the units compute: the caption sample, its embeddings per staging shard (known exactly
when the sample is current), the prompt, pool and taxonomy embeddings, and one
output-variance unit per (model, chunk of prompts). The signals, decisions and ledger are
recomputed on every run from those units' outputs (no model).
"""

from __future__ import annotations

import tempfile
from typing import Any

from corpusforge.contract import COMPUTED, SKIPPED, completed_units, explain, read_marker
from tasks.prompts.files import (PROMPTS_CAPTIONS, PROMPTS_CAPTION_SAMPLE, PROMPTS_GENERATED, PROMPTS_TEXTS,
                                 QUALIFICATION_CATEGORIES, caption_embeddings_path, generated_variance_path,
                                 text_embeddings_path)
from corpusforge.plans import EVERY_RUN, StagePlan, deletions, switched_off
from corpusforge.storage import Store
from tasks.prompts import tables
from tasks.prompts.captions import caption_embeddings_key, sample_key, sampled_keys_by_shard, text_list_key
from tasks.prompts.config import DensityConfig, TextModelConfig, VarianceConfig
from tasks.prompts.signals import variance_units
from tasks.prompts.text_model import text_model_identity
from tasks.prompts.generated import chunk_name, list_generated, unit_prompts, write_prompt_order
from tasks.prompts.variance import variance_key


def plan_units(out: Store, corpus: Store | None, density: DensityConfig | None, variance: VarianceConfig | None,
               tm: TextModelConfig, prompts: list[dict[str, Any]], pool: list[dict[str, Any]]) -> list[StagePlan]:
    """Every unit of the two signals with a model (a signal switched off: its units are
    deleted), then the decisions (every run). ``corpus``: the built corpus density samples."""
    plans = []
    if density is not None and corpus is not None:
        plans += _density(out, corpus, density, tm, prompts, pool)
    else:
        plans.append(switched_off(StagePlan("density"), out, (PROMPTS_CAPTION_SAMPLE, PROMPTS_CAPTIONS,
                                                              PROMPTS_TEXTS, QUALIFICATION_CATEGORIES),
                                  "density is switched off"))
    plans.append(_variance(out, variance, prompts))
    decisions = StagePlan("decisions")
    decisions.add("signals, ledger, rotation, receipt", COMPUTED, EVERY_RUN)
    return plans + [decisions]


def _density(out: Store, corpus: Store, cfg: DensityConfig, tm: TextModelConfig, prompts: list[dict[str, Any]],
             pool: list[dict[str, Any]]) -> list[StagePlan]:
    """The caption sample, its embeddings per staging shard and the short lists' embeddings."""
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
        deletions(captions, out, PROMPTS_CAPTIONS, ".npy", by_shard, "no sampled captions in it any more")
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


def _variance(out: Store, cfg: VarianceConfig | None, prompts: list[dict[str, Any]]) -> StagePlan:
    """One unit per (model, chunk of prompts) of the generated images' listing, listed as the
    run lists them (:mod:`tasks.prompts.generated`) into a local temporary folder."""
    stage = StagePlan("variance")
    if cfg is None:
        return switched_off(stage, out, (PROMPTS_GENERATED,), "variance is switched off")
    with tempfile.TemporaryDirectory(prefix="corpusforge-plan-") as tmp:
        listed = Store(tmp, fsync=False)
        write_prompt_order(listed, prompts)
        planned = variance_units(cfg, out, list_generated(listed, cfg.generated, cfg.storage_options,
                                                          cfg.prompts_per_unit))
        for call in planned.calls:
            chunk = chunk_name(call["unit"])
            key = variance_key(cfg.generated, call["model"], unit_prompts(listed, call["model"], call["unit"]), cfg)
            stage.add(f"{call['model']}/{chunk}",
                      *explain(read_marker(out, generated_variance_path(call["model"], chunk)), key))
    for model in out.listdir(PROMPTS_GENERATED):
        deletions(stage, out, f"{PROMPTS_GENERATED}/{model}", ".parquet", planned.chunks.get(model, []),
                  "no longer planned (prompts or generated images changed)", f"{model}/")
    return stage
