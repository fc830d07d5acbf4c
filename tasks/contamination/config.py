"""Typed settings of the contamination stages; every field is frozen into the run's receipt.

Defaults come from the sources: the image-only rate flags an evaluation image whose
best similarity (the seed's cosine, or the feature model's pair rule such as wfd's) to
any training image is *strictly greater* than 0.9 (seed 001, Yang et al. 2024); text
canaries quarantine on an exact or normalised match, direct 3-shingle
Jaccard >= 0.4 or seeded-signature agreement >= 0.375 with seeds 11…211 (seed 003's
fixture — "teaching parameters", so all are settings, and a changed one is a new
decision-policy edition with a new receipt).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from corpusforge.config import Similarity, StrictModel
from tasks.contamination.canary import SEED_SIGNATURE_SEEDS
from tasks.shared.ivf import IVF_TRAIN_PER_LIST

CURVE_THRESHOLDS = [round(0.80 + 0.01 * i, 2) for i in range(20)]  # 0.80 … 0.99


class EvalSetConfig(StrictModel):
    """The evaluation set (benchmark) being checked; its files are only ever read."""

    source: str = Field(..., title="Evaluation set",
                        description="A table (.parquet, .jsonl, .csv) with one row per item, a folder of images "
                                    "(sidecar {stem}.txt is the caption, {stem}.json adds fields), or a .tar / "
                                    "folder of WebDataset tars; local or s3://.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options")
    name: str | None = Field(None, title="Benchmark name", description="Empty: the source's base name.")
    id_column: str = Field("id", title="Item id column",
                           description="Table column with unique item ids; absent: row-NNNNNN (row number).")
    image_column: str | None = Field("path", title="Image column",
                                     description="Table column with image paths (relative to the table's folder, "
                                                 "or URIs); empty or absent for a text-only benchmark.")
    text_fields: list[str] = Field(default_factory=list, title="Text fields scanned",
                                   description="Fields checked with text canaries (e.g. question, answer, caption). "
                                               "Folders and tars: 'caption' is the .txt sidecar/member.")
    answer_field: str | None = Field(None, title="Answer field", description="Read by the image–text judge.")
    category_field: str | None = Field(None, title="Category field",
                                       description="Coverage lost is reported per value of this field.")
    chunk_size: int = Field(1000, ge=1, title="Items per unit of work")
    allow_roots: list[str] = Field(
        default_factory=list, title="Further readable roots",
        description="Further folders or URI prefixes (e.g. 's3://bucket/images/') that the table's image paths "
                    "may point into, as the build's input.allow_roots. By default only the evaluation set's own "
                    "folder (and, on an object store, that store's protocol) is readable.")


class IvfConfig(StrictModel):
    """The inverted-file index used when exact search is too large."""

    config_section: ClassVar[str] = "<image|leakage>.ivf"
    retired_keys: ClassVar[dict[str, Any]] = {"train_per_list": IVF_TRAIN_PER_LIST}

    nlist: int | None = Field(None, ge=1,
                              description="Empty: sqrt(N) rounded up to a power of two, within [16, 65536].")
    nprobe: int = Field(16, ge=1, description="Lists probed per query.")
    storage: Literal["flat", "sqfp16"] = Field(
        "flat", description="flat: float32 vectors, exact scores; sqfp16: half the memory, scores within ~2e-4.")
    max_train: int = Field(2_000_000, ge=1000)
    seed: int = Field(0, description="k-means seed and training-sample seed.")
    faiss_threads: int | None = Field(None, ge=1)


class ImageScanConfig(StrictModel):
    """Image-only contamination: the best similarity of each evaluation image over the training
    images (the feature model's pair rule: cosine, or for wfd the layout cosine when either
    image is colourless)."""

    config_section: ClassVar[str] = "image"
    renamed_keys: ClassVar[dict[str, str]] = {"threshold": "flag_above"}

    model_id: str = Field("wfd", title="Feature model",
                          description="Feature folder of the corpus (features/{model_id}); the evaluation images "
                                      "are embedded with the identical model, weights, preprocessing and dtype.")
    flag_above: float = Field(0.9, gt=0, lt=1, title="Flag: best similarity above (>)",
                              description="Decides which evaluation images are flagged as contaminated: those whose "
                                          "best similarity to any training image is > this; flagged images leave the "
                                          "new edition when edition.quarantine_on has 'image'.")
    curve: list[Similarity] = Field(default_factory=lambda: list(CURVE_THRESHOLDS), title="Rate curve thresholds")
    corpus_splits: list[str] | None = Field(["train"], title="Training splits searched",
                                            description="Manifest splits of the corpus that count as training "
                                                        "data; empty: every image with features.")
    search: Literal["auto", "exact", "ivf"] = Field(
        "auto", title="Search", description="exact: chunked exhaustive scan (every pair, never a full matrix); "
                                            "ivf: FAISS inverted file; auto: exact up to exact_max_pairs.")
    exact_max_pairs: float = Field(2e10, gt=0, title="Largest exact scan (queries × targets)")
    k: int = Field(5, ge=1, le=100, title="Matches kept per image",
                   description="Top-k training matches kept (evidence, report, captions for the judge).")
    ivf: IvfConfig = Field(default_factory=IvfConfig)
    recall_queries: int = Field(200, ge=0, title="Recall sample",
                                description="Evaluation images scanned exhaustively to measure the index's recall.")
    top_pairs: int = Field(24, ge=0, title="Image pairs shown in the HTML report")


class LeakageConfig(StrictModel):
    """Cross-split leakage: held-out images with a near-duplicate in a training split."""

    config_section: ClassVar[str] = "leakage"
    renamed_keys: ClassVar[dict[str, str]] = {"review_threshold": "review_min_similarity"}

    held_out: list[str] = Field(["val", "test"], min_length=1, title="Held-out splits")
    train: list[str] = Field(["train"], min_length=1, title="Training splits")
    against: str | None = Field(None, title="Training corpus",
                                description="Root of another built corpus whose training split is searched; "
                                            "empty: the same corpus.")
    against_storage_options: dict[str, Any] = Field(default_factory=dict)
    model_id: str | None = Field(None, description="Empty: image.model_id.")
    thresholds: list[Similarity] | None = Field(
        None, title="Rate thresholds (>=)",
        description="Leakage rates are reported at each (best similarity >= it); decides nothing. Empty: the "
                    "build's edge_min_similarity and pair_removal_above from its receipt.")
    review_min_similarity: float = Field(0.80, gt=0, lt=1, title="Review: least similarity (>=)",
                                         description="Decides which held-out/training pairs are listed for review "
                                                     "in contamination/leakage/: those with similarity >= this.")
    k: int = Field(3, ge=1, le=100, title="Matches kept per held-out image")
    search: Literal["auto", "exact", "ivf"] = Field("auto")
    exact_max_pairs: float = Field(2e10, gt=0)
    ivf: IvfConfig = Field(default_factory=IvfConfig)


class TextCorpusConfig(StrictModel):
    """The text the canaries are compared with."""

    kind: Literal["corpus_captions", "table"] = Field(
        "corpus_captions", description="corpus_captions: captions of the built corpus (its staging shards); "
                                       "table: any text table.")
    splits: list[str] | None = Field(["train"], description="corpus_captions: manifest splits; empty: every "
                                                            "staged caption.")
    path: str | None = Field(None, description="table: .parquet, .jsonl, .csv or .txt (one text a line).")
    storage_options: dict[str, Any] = Field(default_factory=dict)
    text_column: str = Field("text")
    id_column: str | None = Field(None, description="Empty: row-NNNNNN.")
    part_size: int = Field(100_000, ge=1, description="table: texts per unit of work.")

    @model_validator(mode="after")
    def _table_needs_path(self) -> TextCorpusConfig:
        if self.kind == "table" and not self.path:
            raise ValueError("text corpus kind 'table' needs a path")
        return self


class LshConfig(StrictModel):
    """Candidate generation: exhaustive for small scans, MinHash LSH banding for large ones.

    Bands: the raw and the normalised SHA-256 (exact matches); every m-subset of the
    seed's signature positions, m = ceil(signature threshold × 8) (56 triples for 0.375:
    a pair at or above the signature threshold always shares one, so its recall is 1);
    and ``num_perm / rows_per_band`` bands over an independent LSH signature for direct
    Jaccard (r = 2, b = 32: a pair at J = 0.4 is a candidate with probability 0.996).
    """

    mode: Literal["auto", "lsh", "exhaustive"] = Field("auto")
    exhaustive_max_pairs: int = Field(2_000_000, ge=0, description="auto: exhaustive up to this many pairs.")
    num_perm: int = Field(64, ge=1, le=1024)
    rows_per_band: int = Field(2, ge=1)
    seed: int = Field(0, description="Salts of the LSH signature.")
    buckets: int | None = Field(None, ge=1, description="Join buckets; empty: one per ~4M band rows.")
    max_docs_per_key: int = Field(1000, ge=1, description="Corpus texts kept per band value (most common "
                                                          "shingle combinations); truncations are counted.")
    recall_sample: int = Field(200, ge=0, description="Items compared with every corpus text in every run "
                                                       "to measure LSH recall.")
    recall_seed: int = Field(0)

    @model_validator(mode="after")
    def _whole_bands(self) -> LshConfig:
        if self.num_perm % self.rows_per_band:
            raise ValueError(f"num_perm {self.num_perm} is not a multiple of rows_per_band {self.rows_per_band}")
        return self


class TextCanaryConfig(StrictModel):
    """Text canaries (seed 003) of the evaluation items' text fields against a text corpus."""

    corpus: TextCorpusConfig = Field(default_factory=TextCorpusConfig)
    seeds: list[int] = Field(default_factory=lambda: list(SEED_SIGNATURE_SEEDS), min_length=1,
                             title="Signature seeds")
    exact: bool = Field(True, title="Quarantine exact byte matches")
    normalized: bool = Field(True, title="Quarantine normalised matches")
    direct_jaccard: float = Field(0.4, gt=0, le=1, title="Direct 3-shingle Jaccard quarantine threshold (>=)")
    signature: float = Field(0.375, gt=0, le=1, title="Seeded-signature quarantine threshold (>=)")
    review_direct_jaccard: float | None = Field(None, gt=0, le=1, title="Review band: direct Jaccard (>=)")
    review_signature: float | None = Field(None, gt=0, le=1, title="Review band: signature (>=)")
    lsh: LshConfig = Field(default_factory=LshConfig)

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("signature seeds must be distinct")
        return seeds

    @model_validator(mode="after")
    def _review_below_quarantine(self) -> TextCanaryConfig:
        for review, quarantine in ((self.review_direct_jaccard, self.direct_jaccard),
                                   (self.review_signature, self.signature)):
            if review is not None and review >= quarantine:
                raise ValueError("a review threshold must lie below its quarantine threshold")
        return self


class ChatJudgeConfig(StrictModel):
    """An OpenAI-compatible chat endpoint (``POST {base_url}/chat/completions``)."""

    base_url: str = Field(..., description="e.g. http://127.0.0.1:8000/v1")
    model: str = Field(..., description="Model name sent in the request.")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key (never stored).")
    timeout_s: float = Field(30.0, gt=0)
    retries: int = Field(2, ge=0, description="Extra attempts after a timeout, connection error or HTTP 5xx/429.")
    backoff_s: float = Field(1.0, ge=0, description="Wait before retry n: backoff_s * 2^(n-1).")
    max_tokens: int = Field(128, ge=1)
    max_caption_chars: int = Field(4000, ge=100, description="Captions are cut to this many characters in total.")


class JudgeConfig(StrictModel):
    """Image–text contamination: can the item's answer be inferred from retrieved training captions?"""

    config_section: ClassVar[str] = "judge"
    renamed_keys: ClassVar[dict[str, str]] = {"min_similarity": "retrieve_above"}

    kind: Literal["canary_overlap", "chat"] = Field("canary_overlap")
    captions: int = Field(5, ge=1, le=100, description="Training captions retrieved per item: those of its "
                                                        "top image matches.")
    retrieve_above: float = Field(0.0, ge=-1, le=1, title="Retrieve: similarity above (>)",
                                  description="Decides which image matches lend their captions to the judge: "
                                              "those with similarity > this.")
    containment: float = Field(1.0, gt=0, le=1, description="canary_overlap: share of the answer's 3-shingles "
                                                            "(or of its tokens, below 3) found in one caption.")
    min_answer_chars: int = Field(4, ge=1, description="canary_overlap: shorter normalised answers (yes, no, "
                                                       "A, 4, red) cannot be judged by overlap: 'exposure "
                                                       "unresolved'.")
    chat: ChatJudgeConfig | None = None

    @model_validator(mode="after")
    def _chat_needs_endpoint(self) -> JudgeConfig:
        if self.kind == "chat" and self.chat is None:
            raise ValueError("judge kind 'chat' needs a chat section (base_url, model)")
        return self


class EditionConfig(StrictModel):
    """A new benchmark edition without the quarantined items (the input is never edited)."""

    enabled: bool = Field(True)
    quarantine_on: list[Literal["text", "image", "image_text"]] = Field(
        ["text", "image"], description="Which findings remove an item from the new edition.")
    name: str | None = Field(None, description="Empty: {benchmark}-ed-{12 hex of the decisions}.")
