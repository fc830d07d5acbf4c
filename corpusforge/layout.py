"""The shared root layout: the folders and schemas that several stages and the ground floor read.

Each stage's own files (paths, path functions, schemas) are in its public ``tasks/<stage>/files.py``,
which other stages may import (and nothing else of that stage; ``.importlinter``). What stays here
is what no single stage owns: the completion markers, staging and feature files (every downstream
stage, :mod:`corpusforge.plans` and ``tasks/shared`` read them), the manifest every stage reads,
the lease and the unit ledger, and the ingest row schema the others derive from. The whole tree,
and why data folders hold only data, is in docs/architecture.md ("Output layout").
"""

from __future__ import annotations

import pyarrow as pa

MARKERS = "_markers"
# A source that is one metadata table, by its suffix (the others are folders).
TABLE_SUFFIXES = (".parquet", ".jsonl", ".csv")

STAGING_TARS = "staging/tars"
STAGING_INDEX = "staging/index"
STAGING_RECORDS = "staging/records"
FEATURES_DIR = "features"
MANIFEST_DIR = "manifest"

OUTPUT_LEASE = "work/lease.json"  # one build per output (corpusforge/lease.py)
LEDGER_DIR = "work/ledger"  # unit results of this run's big fan-outs (corpusforge/ledger.py)


def part_name(part: int) -> str:
    return f"{part:06d}"


def ledger_dir(fan_out: str) -> str:
    return f"{LEDGER_DIR}/{fan_out}"


def ledger_path(fan_out: str, n: int) -> str:
    return f"{ledger_dir(fan_out)}/{n:06d}.parquet"


def staging_tar(shard: str) -> str:
    return f"{STAGING_TARS}/{shard}.tar"


def staging_index(shard: str) -> str:
    return f"{STAGING_INDEX}/{shard}.parquet"


def staging_records(shard: str) -> str:
    return f"{STAGING_RECORDS}/{shard}.parquet"


def features_dir(model_id: str) -> str:
    return f"{FEATURES_DIR}/{model_id}"


def feature_subset_dir(model_id: str, subset: str | None) -> str:
    """Where a model's features of every image live (``subset`` None) or of one consumer's selection."""
    return features_dir(model_id) if subset is None else f"{features_dir(model_id)}/subsets/{subset}"


def feature_vectors(model_id: str, shard: str, subset: str | None = None) -> str:
    return f"{feature_subset_dir(model_id, subset)}/vectors/{shard}.npy"


def feature_keys(model_id: str, shard: str, subset: str | None = None) -> str:
    return f"{feature_subset_dir(model_id, subset)}/keys/{shard}.parquet"


def manifest_path(part: int) -> str:
    return f"{MANIFEST_DIR}/part-{part_name(part)}.parquet"


# ---- schemas the ground floor and several stages derive from ----------------------
# Facts known after ingest: one row per input record, no image bytes.
INGEST_SCHEMA = pa.schema([
    ("part", pa.int32()),
    ("row", pa.int32()),
    ("key", pa.string()),
    ("source_path", pa.string()),     # where the bytes came from (path, URI or tar#member)
    ("source_offset", pa.int64()),    # byte offset of the data inside a source tar, else -1
    ("sha256", pa.string()),
    ("bytes", pa.int64()),
    ("format", pa.string()),          # Pillow format: JPEG, PNG, WEBP
    ("ext", pa.string()),             # extension the image is stored under: jpg, png, webp
    ("width", pa.int32()),            # after EXIF orientation
    ("height", pa.int32()),
    ("caption", pa.string()),
    ("caption_type", pa.string()),
    ("source", pa.string()),
    ("license", pa.string()),
    ("license_url", pa.string()),
    ("attribution", pa.string()),
    ("retrieved_at", pa.string()),
    ("status", pa.string()),          # kept (so far), filtered or error
    ("reason", pa.string()),
    ("warning", pa.string()),         # e.g. bad_sidecar: its metadata was not used, and why
    ("spill_offset", pa.int64()),     # where a kept record's bytes start in work/spill/{part}.bin, else -1
    ("spill_xxh3", pa.uint64()),      # XXH3-64 of those bytes, else null: staging's check that the spill
                                      # still holds what ingest hashed (SHA-256 costs 8x more to recompute)
    ("source_split", pa.string()),    # train/val/test of a GPIC-layout source tar (its folder), else null
    ("source_tiers", pa.string()),    # a GPIC source sample's JSON `split` (its tiers), comma-joined, else null
    ("url", pa.string()),             # a URL-list source's URL (manifest and fetch ledger only; never shipped)
    ("http_status", pa.int32()),      # the final HTTP status of a fetched URL
    ("opt_out_rule", pa.string()),    # the rule that refused a URL (robots.txt, X-Robots-Tag, TDMRep, deny-list)
])

RESOLVED_SCHEMA = INGEST_SCHEMA.append(pa.field("duplicate_of", pa.string()))

STAGING_RECORDS_SCHEMA = pa.schema([RESOLVED_SCHEMA.field(c) for c in (
    "key", "part", "row", "sha256", "width", "height", "source", "caption_type", "ext", "bytes")])
FEATURE_KEYS_SCHEMA = pa.schema([("key", pa.string()), ("sha256", pa.string()), ("ok", pa.bool_()),
                                 ("error", pa.string())])


MANIFEST_SCHEMA = pa.schema([
    *[INGEST_SCHEMA.field(n) for n in (
        "key", "source_path", "sha256", "bytes", "format", "width", "height",
        "caption_type", "source", "license", "status", "reason", "warning")],
    ("duplicate_of", pa.string()),
    ("split", pa.string()),
    ("shard", pa.string()),
    ("tier", pa.string()),            # smallest tier containing the sample (nested tiers)
    ("staging_shard", pa.string()),
    ("component_id", pa.int64()),
    ("component_size", pa.int32()),
    ("max_similarity", pa.float32()),
    ("part", pa.int32()),
    ("row", pa.int32()),
    ("caption_origin", pa.string()),  # input | model:{model}@{prompt hash} (null: not captioned)
    ("vlm_model", pa.string()),
    ("vlm_answers", pa.string()),
    INGEST_SCHEMA.field("source_split"),
    INGEST_SCHEMA.field("source_tiers"),
    ("release_ext", pa.string()),     # the image member's extension in the release tar (jpg, png, webp)
    ("image_encoding", pa.string()),  # copied (bytes as staged) | png_lossless | jpeg_q{N} (tasks/release/release_image.py)
    INGEST_SCHEMA.field("url"),
    INGEST_SCHEMA.field("http_status"),
    INGEST_SCHEMA.field("opt_out_rule"),
    INGEST_SCHEMA.field("retrieved_at"),
])
