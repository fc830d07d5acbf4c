"""The tail every corpus-writing flow shares: release plan → release shards → manifest → receipt.

A build runs it on its own staging shards; a near-dedup pass runs it for a new corpus
version whose staging shards and ingest rows stay in the earlier version (``source``).
"""

from __future__ import annotations

from typing import Any

from corpusforge.cluster import as_task, run_tasks
from corpusforge.storage import Store
from tasks.manifest import write_manifest_part
from tasks.receipt import render_report
from tasks.release import plan_release_files, write_release_shard
from tasks.splits import SPLITS, SplitConfig, tier_counts


release_plan_task = as_task(plan_release_files, "plan-release")
release_task = as_task(write_release_shard, "write-release-shard")
manifest_task = as_task(write_manifest_part, "write-manifest-part")


def prune(store: Store, folder: str, keep: set[str]) -> None:
    """Remove files of an earlier run that the current plan no longer contains."""
    for name in store.listdir(folder):
        if name.split(".", 1)[0] not in keep:
            store.remove(f"{folder}/{name}")


def publish(store: Store, staged: list[str], n_parts: int, splits: SplitConfig, code_version: str,
            source: Store | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Write release shards and manifest; return the release plan summary and manifest part summaries."""
    release = release_plan_task.submit(store, staged, splits, source=source).result()
    for split in SPLITS:
        prune(store, f"shards/{split}", {n for n, s in release["shards"].items() if s["split"] == split})
    run_tasks(release_task, [dict(store=store, split=s["split"], shard=s["index"], cfg=splits,
                                  code_version=code_version, source=source) for s in release["shards"].values()])
    manifest = run_tasks(manifest_task, [dict(store=store, part=p, source=source) for p in range(n_parts)])
    return release, manifest


def release_section(release: dict[str, Any], splits: SplitConfig) -> dict[str, Any]:
    """The receipt's release section: split sizes, tiers and every shard's size and caption mix."""
    shards = release["shards"]
    n_train = sum(1 for s in shards.values() if s["split"] == "train")
    sizes = {sp: {"samples": sum(s["count"] for s in shards.values() if s["split"] == sp),
                  "shards": sum(1 for s in shards.values() if s["split"] == sp)} for sp in SPLITS}
    return {"splits": sizes, "tiers": tier_counts(n_train, splits.tiers), "shards": shards}


def write_receipt(store: Store, receipt: dict[str, Any]) -> None:
    """receipt.json, then report.md rendered from exactly what was written (sorted keys),
    so the report does not depend on the order in which this run filled the dicts."""
    store.write_json("receipt.json", receipt)
    store.write_bytes("report.md", render_report(store.read_json("receipt.json")).encode())
