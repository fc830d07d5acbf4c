"""Near-duplicate removal on an already built corpus, written as a new version: what the
source must hold (features of the graph's model on every staging shard), whether its
index fits a query worker, and the lineage record of the new version."""

from __future__ import annotations

from typing import Any

from corpusforge.contract import completed_units
from corpusforge.feature_files import feature_marker
from corpusforge.hashing import fingerprint
from corpusforge.layout import STAGING_TARS
from tasks.report.files import RECEIPT
from corpusforge.storage import Store
from tasks.graph.config import NearDedupConfig
from tasks.graph.edges import index_choice
from tasks.graph.index import INDEX_WORKER_BYTES


def staged_with_features(source: Store, model_id: str) -> list[str]:
    """Every staging shard of the source; a clear error naming those without features."""
    shards = completed_units(source, STAGING_TARS, ".tar")
    if not shards:
        raise ValueError(f"{source.root} has no completed staging shards: not a built corpus")
    missing = [s for s in shards if feature_marker(source, model_id, s) is None]
    if missing:
        raise ValueError(f"{len(missing)} staging shards of {source.root} have no {model_id} features "
                         f"({', '.join(missing[:5])}{', …' if len(missing) > 5 else ''}): run "
                         f"`corpusforge extract-features` with that model first")
    return shards


def check_index_size(source: Store, cfg: NearDedupConfig, limit: int = INDEX_WORKER_BYTES) -> None:
    """Preflight: the index of the source's extracted features must fit in a query worker
    (ValueError naming the alternative); reads feature markers only."""
    markers = [m.info for s in completed_units(source, STAGING_TARS, ".tar")
               if (m := feature_marker(source, cfg.model_id, s)) is not None]
    if markers:
        index_choice(cfg, markers, limit)


def lineage(source: Store, shards: list[str], cfg: NearDedupConfig) -> dict[str, Any]:
    """What this version was derived from."""
    receipt = source.sha256(RECEIPT) if source.exists(RECEIPT) else None
    return {"derived_from": source.root, "source_receipt_sha256": receipt, "staging_shards": sorted(shards),
            "stage": "near_dedup", "near_dedup": cfg.model_dump(mode="json"),
            "near_dedup_fingerprint": fingerprint(cfg.model_dump(mode="json"))}
