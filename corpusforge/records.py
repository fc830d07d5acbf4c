"""The record type every stage shares: statuses, reasons and the manifest schema.

Every input record ends in the manifest exactly once, with a status and a reason.
Stages attach facts to records by ``(part, row)``: the ingest partition and the row's
position in it, which is also the record's place in input order.
"""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa


class Status(StrEnum):
    KEPT = "kept"
    FILTERED = "filtered"
    EXACT_DUPLICATE = "exact_duplicate"
    NEAR_DUPLICATE = "near_duplicate"
    ERROR = "error"


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
])

MANIFEST_SCHEMA = pa.schema([
    *[INGEST_SCHEMA.field(n) for n in (
        "key", "source_path", "sha256", "bytes", "format", "width", "height",
        "caption_type", "source", "license", "status", "reason")],
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
])
