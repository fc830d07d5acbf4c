"""The contamination stage's files (tasks/contamination/, flows/contamination.py): paths and schemas.

Under a contamination run's own output root; the corpora and the evaluation set it reads are
never written to. Other stages and flows may import this module (and only this one) of the stage.

::

    eval/                                  the evaluation set staged for the feature stage: under this
                                           sub-root, staging/… and features/… as in a corpus
    eval/items/{chunk}.parquet             one row per evaluation item (ids, hashes, texts)
    work/contamination/select/{name}/{shard}.parquet   corpus keys a scan may match (e.g. split train)
    work/contamination/index/{name}.faiss  IVF index over a scan's target vectors
    work/contamination/found/{scan}/{chunk}.parquet    top-k target matches per query
    work/contamination/text/…              text canary state: docs, queries, bands, candidates, scores
    contamination/images/{chunk}.parquet   per evaluation image: best match, similarity, flag
    contamination/leakage/{shard}.parquet  held-out/train pairs above the review threshold
    contamination/text/{chunk}.parquet     per (item, text field): canary evidence and decision
    contamination/judge/{chunk}.parquet    per item: image–text judge verdict and its judge
    contamination/items/{chunk}.parquet    per item: every decision, the edition outcome
    contamination/summary.json, receipt.json, report.md, report.html
    edition/items.parquet, edition/mapping.parquet, edition/edition.json   the new benchmark edition
"""

from __future__ import annotations

import pyarrow as pa

CONTAMINATION_EVAL = "eval"
CONTAMINATION_ITEMS = "eval/items"
CONTAMINATION_SELECT = "work/contamination/select"
CONTAMINATION_INDEX = "work/contamination/index"
CONTAMINATION_FOUND = "work/contamination/found"
CONTAMINATION_TEXT_WORK = "work/contamination/text"
CONTAMINATION_DIR = "contamination"
CONTAMINATION_IMAGES = "contamination/images"
CONTAMINATION_LEAKAGE = "contamination/leakage"
CONTAMINATION_TEXT = "contamination/text"
CONTAMINATION_JUDGE = "contamination/judge"
CONTAMINATION_ITEM_DECISIONS = "contamination/items"
CONTAMINATION_SUMMARY = "contamination/summary.json"
CONTAMINATION_RECEIPT = "contamination/receipt.json"
CONTAMINATION_REPORT = "contamination/report.md"
CONTAMINATION_REPORT_HTML = "contamination/report.html"
EDITION_DIR = "edition"
EDITION_ITEMS = "edition/items.parquet"
EDITION_MAPPING = "edition/mapping.parquet"
EDITION_META = "edition/edition.json"


def eval_items_path(chunk: str) -> str:
    return f"{CONTAMINATION_ITEMS}/{chunk}.parquet"


def select_path(name: str, shard: str) -> str:
    return f"{CONTAMINATION_SELECT}/{name}/{shard}.parquet"


def contamination_index(name: str) -> str:
    return f"{CONTAMINATION_INDEX}/{name}.faiss"


def contamination_index_offsets(name: str) -> str:
    """Each target shard's first id in the index (``first_id``, one row a shard and a last row
    of the total): a file beside the index, so a scan task's parameters stay O(1) in shards."""
    return f"{CONTAMINATION_INDEX}/{name}.offsets.parquet"


def found_matches_path(scan: str, chunk: str) -> str:
    return f"{CONTAMINATION_FOUND}/{scan}/{chunk}.parquet"


def text_work_path(kind: str, unit: str) -> str:
    """``kind``: docs, queries, doc_bands, query_bands, candidates, scores, brute."""
    return f"{CONTAMINATION_TEXT_WORK}/{kind}/{unit}.parquet"


def image_rows_path(chunk: str) -> str:
    return f"{CONTAMINATION_IMAGES}/{chunk}.parquet"


def leakage_path(shard: str) -> str:
    return f"{CONTAMINATION_LEAKAGE}/{shard}.parquet"


def text_rows_path(chunk: str) -> str:
    return f"{CONTAMINATION_TEXT}/{chunk}.parquet"


def judge_rows_path(chunk: str) -> str:
    return f"{CONTAMINATION_JUDGE}/{chunk}.parquet"


def item_decisions_path(chunk: str) -> str:
    return f"{CONTAMINATION_ITEM_DECISIONS}/{chunk}.parquet"


# One row per evaluation item, in input order. ``item_sha256`` hashes the item's content
# (id, texts, image bytes' SHA-256): what a receipt lists per item.
EVAL_ITEM_SCHEMA = pa.schema([
    ("item_id", pa.string()), ("row", pa.int64()), ("key", pa.string()), ("item_sha256", pa.string()),
    ("image_source", pa.string()), ("image_sha256", pa.string()), ("image_bytes", pa.int64()),
    ("image_error", pa.string()), ("category", pa.string()), ("answer", pa.string()),
    ("texts", pa.string()),           # JSON object {field: text} of the scanned text fields
])
# Top-k matches of one query against a scan's targets (similarity: float64 dot product
# of the two unit vectors, rounded to float32).
MATCH_SCHEMA = pa.schema([
    ("query_key", pa.string()), ("rank", pa.int16()), ("target_shard", pa.string()),
    ("target_key", pa.string()), ("target_sha256", pa.string()), ("similarity", pa.float32()),
])
SELECT_SCHEMA = pa.schema([("key", pa.string()), ("split", pa.string())])
# Per evaluation image (contamination/images/): its best training match and the flag.
IMAGE_ROW_SCHEMA = pa.schema([
    ("item_id", pa.string()), ("key", pa.string()), ("image_sha256", pa.string()),
    ("status", pa.string()),          # embedded | image_error | no_image
    ("error", pa.string()), ("max_similarity", pa.float32()), ("match_key", pa.string()),
    ("match_shard", pa.string()), ("match_sha256", pa.string()),
    ("exact_copy", pa.bool_()),       # byte-identical to its best match (same SHA-256)
    ("flagged", pa.bool_()),          # max_similarity strictly above the threshold
    ("matches", pa.string()),         # JSON [[key, similarity], …] of the top-k
])
# Held-out/training pairs at or above the review threshold (contamination/leakage/).
LEAKAGE_SCHEMA = pa.schema([
    ("held_out_key", pa.string()), ("held_out_split", pa.string()), ("rank", pa.int16()),
    ("train_key", pa.string()), ("train_shard", pa.string()), ("similarity", pa.float32()),
])
# Per (evaluation item, text field) (contamination/text/): both texts' hashes, every
# canary score of the best corpus match and the decision derived from them in this row.
TEXT_ROW_SCHEMA = pa.schema([
    ("item_id", pa.string()), ("field", pa.string()), ("empty", pa.bool_()),
    ("text_sha256", pa.string()), ("normalized_sha256", pa.string()), ("n_shingles", pa.int32()),
    ("signature", pa.list_(pa.uint32())),
    ("match_doc_id", pa.string()), ("match_unit", pa.string()), ("match_text", pa.string()),
    ("match_sha256", pa.string()), ("match_normalized_sha256", pa.string()),
    ("match_signature", pa.list_(pa.uint32())),
    ("exact", pa.bool_()), ("normalized", pa.bool_()), ("direct_jaccard", pa.float64()),
    ("signature_estimate", pa.float64()), ("intersection", pa.int32()), ("union", pa.int32()),
    ("compared", pa.int64()),         # corpus texts this item was compared with
    ("decision", pa.string()),        # quarantine | review | retain
    ("rule", pa.string()),            # the declared threshold that fired ("" for retain)
])
# Per evaluation item (contamination/judge/): the image–text judge's verdict and which judge.
JUDGE_SCHEMA = pa.schema([
    ("item_id", pa.string()),
    ("status", pa.string()),          # judged | no_answer | no_image
    ("verdict", pa.string()),         # inferable | not_inferable | unresolved (null unless judged)
    ("judge", pa.string()), ("judge_sha256", pa.string()),
    ("captions", pa.string()),        # JSON [[training key, image similarity], …] shown to the judge
    ("evidence", pa.string()), ("error", pa.string()), ("attempts", pa.int16()),
])
# Per evaluation item (contamination/items/): every finding and its fate in the new edition.
ITEM_DECISION_SCHEMA = pa.schema([
    ("item_id", pa.string()), ("row", pa.int64()), ("item_sha256", pa.string()), ("category", pa.string()),
    ("text_decision", pa.string()),   # worst over the scanned fields: quarantine > review > retain
    ("text_rules", pa.string()),      # JSON {field: rule that fired}
    ("image_status", pa.string()), ("image_similarity", pa.float32()), ("image_match_key", pa.string()),
    ("image_flagged", pa.bool_()), ("image_exact_copy", pa.bool_()),
    ("image_text_verdict", pa.string()),
    ("edition_status", pa.string()),  # retained | quarantined
    ("reasons", pa.string()),         # JSON list: text:<rule>, image:>threshold, image_text:inferable
])
EDITION_ITEM_SCHEMA = pa.schema([
    ("new_id", pa.string()), ("previous_id", pa.string()), ("item_sha256", pa.string()),
    ("image_source", pa.string()), ("image_sha256", pa.string()), ("category", pa.string()),
    ("answer", pa.string()), ("texts", pa.string()),
])
EDITION_MAPPING_SCHEMA = pa.schema([
    ("previous_id", pa.string()), ("new_id", pa.string()), ("status", pa.string()), ("reasons", pa.string()),
])
