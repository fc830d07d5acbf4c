"""Which evaluation caption set generated images were made from, checked against the one
the reference statistics name (a different set is a protocol deviation of the evaluation).

A module of its own, outside the embedding units' code (:mod:`tasks.stats.evaluate`), so
a change here never re-embeds a feature store."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import fsspec
import pyarrow.parquet as pq


def caption_set_claim(path: str | None, storage_options: dict[str, Any],
                      named: dict[str, Any] | None) -> dict[str, Any] | None:
    """The caption set at ``path`` (SHA-256, captions) and whether it is the one the
    reference's provenance names (``named``); None without a caption set."""
    if path is None:
        return None
    with fsspec.open(path, "rb", **storage_options) as f:
        data = f.read()
    claim: dict[str, Any] = {"path": path, "sha256": hashlib.sha256(data).hexdigest(),
                             "captions": pq.read_metadata(io.BytesIO(data)).num_rows,
                             "reference_names": named.get("sha256") if named else None}
    if named and named.get("sha256") != claim["sha256"]:
        claim["deviation"] = (f"generated from caption set {claim['sha256'][:16]}…, not the reference's evaluation "
                              f"caption set {str(named.get('sha256'))[:16]}…")
    return claim
