"""A sample's members. Its JSON member has the same fields in staging shards and in release
shards, so a release shard copies what staging wrote and the dataset card documents one
schema; its caption member is read from a staging shard without its image bytes."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from corpusforge.hashing import canonical_json
from corpusforge.layout import staging_index, staging_tar
from corpusforge.storage import Store

SAMPLE_JSON_FIELDS = ["key", "width", "height", "license", "license_url", "attribution", "source",
                      "caption_type", "retrieved_at", "sha256"]


def sample_json(record: dict[str, Any], extra: dict[str, Any] | None = None) -> bytes:
    """The ``.json`` member of a record's sample: :data:`SAMPLE_JSON_FIELDS`, then ``extra``."""
    meta = {name: record.get(name) for name in SAMPLE_JSON_FIELDS}
    meta.update(extra or {})
    return canonical_json(meta).encode()


def staged_captions(corpus: Store, shard: str, keys: Container[str] | None) -> tuple[list[str], list[str]]:
    """``(keys, captions)`` of a staging shard's ``.txt`` members (of ``keys`` only, when given),
    in shard order, by ranged reads at the offsets of ``staging/index``."""
    index = corpus.read_parquet(staging_index(shard), columns=["key", "ext", "offset", "size"])
    ids, texts = [], []
    with corpus.open(staging_tar(shard)) as f:
        for key, ext, offset, size in zip(*(index.column(c).to_pylist() for c in ("key", "ext", "offset", "size")),
                                          strict=True):
            if ext != "txt" or (keys is not None and key not in keys):
                continue
            f.seek(offset)
            ids.append(key)
            texts.append(f.read(size).decode("utf-8", "replace"))
    return ids, texts
