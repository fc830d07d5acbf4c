"""The fixed evaluation caption set (GPIC §3): the captions users generate images from.

A deterministic seeded sample of N test-split captions (default 50,000, capped by the
test split's size): the test records with the N smallest ``stable_uniform(seed, key)``,
the same rule and default seed as the Test-50K subset of the reference statistics
(:mod:`tasks.stats.reference`), so the caption set and Test-50K are the same images.
Written as ``eval_captions.parquet`` (key, caption type, caption, release shard) in key
order; its SHA-256 goes into the receipt and the reference statistics' provenance, and
``corpusforge evaluate`` records which caption set the generated images claim to come from.

Only the test split's release plan files are read (for model captions) and, for input
captions, the ``.txt`` members of the chosen records in staging (ranged reads).
"""

from __future__ import annotations

import heapq
from typing import Any

import pyarrow as pa
from pydantic import Field

from corpusforge.config import StrictModel
from corpusforge.hashing import stable_uniform
from corpusforge.layout import EVAL_CAPTIONS, EVAL_CAPTIONS_SCHEMA, release_plan_path, staging_index, staging_tar
from corpusforge.storage import Store

TEST = "test"


class EvalCaptionsConfig(StrictModel):
    """Size and seed of the evaluation caption set."""

    size: int = Field(50_000, ge=1, description="Captions in the set (capped by the test split's size).")
    seed: int = Field(1, description="Seed of the sample; 1 = the reference statistics' Test-50K subset seed.")


def sample_keys(keys: list[str], size: int, seed: int) -> set[str]:
    """The ``size`` keys with the smallest seeded priority (order-independent)."""
    return set(heapq.nsmallest(size, set(keys), key=lambda k: (stable_uniform(seed, k), k)))


def write_eval_captions(store: Store, release: dict[str, Any], cfg: EvalCaptionsConfig,
                        source: Store | None = None) -> dict[str, Any]:
    """Write the set from the release plan (``release``: :func:`tasks.release.plan_release_files`'s
    summary); return what the receipt records about it."""
    source = source or store
    entries = []
    for name, shard in release["shards"].items():
        if shard["split"] == TEST:
            entries += [{**e, "shard": name} for e in store.read_parquet(release_plan_path(name)).to_pylist()]
    chosen = sample_keys([e["key"] for e in entries], cfg.size, cfg.seed)
    rows = sorted((e for e in entries if e["key"] in chosen), key=lambda e: e["key"])
    spans: dict[str, dict[str, tuple[int, int]]] = {}
    for r in rows:
        if r.get("caption") is None:  # the input caption, read from staging
            shard = r["staging_shard"]
            if shard not in spans:
                spans[shard] = {m["key"]: (m["offset"], m["size"])
                                for m in source.read_parquet(staging_index(shard)).to_pylist() if m["ext"] == "txt"}
            offset, size = spans[shard][r["key"]]
            r["caption"] = source.read_range(staging_tar(shard), offset, size).decode("utf-8", "replace")
    sha = store.write_parquet(EVAL_CAPTIONS, pa.Table.from_pylist(rows, schema=EVAL_CAPTIONS_SCHEMA))
    return {"path": EVAL_CAPTIONS, "sha256": sha, "captions": len(rows), "test_records": len(entries),
            "size": cfg.size, "seed": cfg.seed,
            "rule": "the test records with the smallest blake2b(seed:key) priority, in key order"}
