"""The prompt qualification's files (tasks/prompts/, flows/prompt_qualification.py): paths and schemas.

Under a qualification run's own output root; the corpus, the prompt set, the generated
images, the scores and the pool it reads are never written to.

::

    work/prompts/caption_sample.parquet        seeded sample of the corpus's kept captions (key, staging shard)
    work/prompts/captions/{shard}.npy          text embeddings of the sampled captions of one staging shard
    work/prompts/captions/{shard}.keys.parquet their keys, in row order
    work/prompts/texts/{name}.npy              text embeddings of the prompt set, the pool, the taxonomy
    work/prompts/order.parquet                 the valid prompts' ids in the set's order (what units are cut by)
    work/prompts/listing/{model}/{chunk}.parquet   the generated images one variance unit reads (prompt id,
                                               file name, stamp), rewritten by every listing (tasks/prompts/generated.py)
    work/prompts/generated/{model}/{chunk}.parquet   per prompt: images read, their SHA-256, variance
    qualification/prompts.parquet              one row per prompt: every signal, the decision
    qualification/variance.parquet             one row per (prompt, generating model)
    qualification/cohorts.parquet              one row per generating model: cohort divergence
    qualification/categories.parquet           taxonomy mode: per category, corpus density, prompt share
    qualification/quarantine.parquet           the quarantine ledger: flagged prompts, evidence, rule fired
    qualification/summary.json, receipt.json, report.md
    prompt_edition/prompts.parquet, mapping.parquet, edition.json, normalization.json
"""

from __future__ import annotations

import pyarrow as pa

PROMPTS_CAPTION_SAMPLE = "work/prompts/caption_sample.parquet"
PROMPTS_CAPTIONS = "work/prompts/captions"
PROMPTS_TEXTS = "work/prompts/texts"
PROMPTS_GENERATED = "work/prompts/generated"
PROMPTS_ORDER = "work/prompts/order.parquet"
PROMPTS_LISTING = "work/prompts/listing"
QUALIFICATION_DIR = "qualification"
QUALIFICATION_PROMPTS = "qualification/prompts.parquet"
QUALIFICATION_VARIANCE = "qualification/variance.parquet"
QUALIFICATION_COHORTS = "qualification/cohorts.parquet"
QUALIFICATION_CATEGORIES = "qualification/categories.parquet"
QUARANTINE_LEDGER = "qualification/quarantine.parquet"
QUALIFICATION_SUMMARY = "qualification/summary.json"
QUALIFICATION_RECEIPT = "qualification/receipt.json"
QUALIFICATION_REPORT = "qualification/report.md"
PROMPT_EDITION_DIR = "prompt_edition"
PROMPT_EDITION_PROMPTS = "prompt_edition/prompts.parquet"
PROMPT_EDITION_MAPPING = "prompt_edition/mapping.parquet"
PROMPT_EDITION_META = "prompt_edition/edition.json"
PROMPT_EDITION_NORMALIZATION = "prompt_edition/normalization.json"


def caption_embeddings_path(shard: str) -> str:
    return f"{PROMPTS_CAPTIONS}/{shard}.npy"


def caption_keys_path(shard: str) -> str:
    return f"{PROMPTS_CAPTIONS}/{shard}.keys.parquet"


def text_embeddings_path(name: str) -> str:
    return f"{PROMPTS_TEXTS}/{name}.npy"


def generated_listing_path(model: str, chunk: str) -> str:
    return f"{PROMPTS_LISTING}/{model}/{chunk}.parquet"


def generated_variance_path(model: str, chunk: str) -> str:
    return f"{PROMPTS_GENERATED}/{model}/{chunk}.parquet"


# Per (prompt, generating model): what was read and the feature-space variance of it.
GENERATED_VARIANCE_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("model", pa.string()),
    ("n_images", pa.int32()),         # image files found in the prompt's folder
    ("n_embedded", pa.int32()),       # of those, decoded and embedded
    ("images", pa.string()),          # JSON [[file name, sha256 or null, error or null], …] in name order
    ("variance", pa.float64()),       # trace of the covariance (ddof 1) of the embeddings; null below min_images
])


PROMPT_ORDER_SCHEMA = pa.schema([("prompt_id", pa.string()), ("place", pa.int64())])
# One row per generated image a variance unit reads, its prompts in the set's order, names sorted.
GENERATED_LISTING_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("name", pa.string()),
    ("stamp", pa.string()),           # corpusforge.storage.file_stamp, or why the file may not be read
])
