"""A sample's JSON member: the same fields in staging shards and in release shards, so a
release shard copies what staging wrote and the dataset card documents one schema."""

from __future__ import annotations

from typing import Any

from corpusforge.hashing import canonical_json

SAMPLE_JSON_FIELDS = ["key", "width", "height", "license", "license_url", "attribution", "source",
                      "caption_type", "retrieved_at", "sha256"]


def sample_json(record: dict[str, Any], extra: dict[str, Any] | None = None) -> bytes:
    """The ``.json`` member of a record's sample: :data:`SAMPLE_JSON_FIELDS`, then ``extra``."""
    meta = {name: record.get(name) for name in SAMPLE_JSON_FIELDS}
    meta.update(extra or {})
    return canonical_json(meta).encode()
