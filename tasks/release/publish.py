"""The tail every corpus-writing flow shares: release plan → release shards → dataset card → manifest.

A build runs it on its own staging shards; a near-dedup pass runs it for a new corpus
version whose staging shards and ingest rows stay in the earlier version (``source``).
"""

from __future__ import annotations

from typing import Any

from corpusforge.contract import FanOut, Unit, count_actions, in_process, prune, require_marker, summarise
from corpusforge.layout import MANIFEST_DIR, RELEASE_CARD, manifest_path, resolved_path
from corpusforge.storage import Store
from tasks.release.manifest import write_manifest_part
from tasks.release.release_card import dataset_card
from tasks.release.shards import plan_release_files, write_release_shard, write_staged_list
from tasks.release.splits import SPLITS, SplitConfig, tier_counts

PLAN_RELEASE = Unit(plan_release_files, "plan-release")
WRITE_RELEASE_SHARD = Unit(write_release_shard, "write-release-shard")
WRITE_MANIFEST_PART = Unit(write_manifest_part, "write-manifest-part", probe=True)


def publish(store: Store, staged: list[str], n_parts: int, splits: SplitConfig, near_dedup: bool,
            source: Store | None = None, captions: bool = False, *, fan_out: FanOut = in_process
            ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Write release shards and manifest.

    Returns the release plan summary, the manifest part summaries and the work done
    (units computed and skipped per step)."""
    release = fan_out(PLAN_RELEASE, [dict(store=store, staged=write_staged_list(store, staged), cfg=splits,
                                          near_dedup=near_dedup, source=source, captions=captions)])[0]
    shards = fan_out(WRITE_RELEASE_SHARD, [dict(store=store, split=s["split"], shard=s["index"], cfg=splits,
                                                plan_sha256=release["plans"][name]["sha256"], source=source)
                                           for name, s in release["shards"].items()])
    present = [sp for sp in SPLITS if any(s["split"] == sp for s in release["shards"].values())]
    store.write_bytes(RELEASE_CARD, dataset_card(splits.layout, present, sorted(
        {e for s in release["shards"].values() for e in s["image_ext"]})))
    resolved = [require_marker(source or store, resolved_path(p), "resolved partition").digest
                for p in range(n_parts)]
    prune(store, MANIFEST_DIR, {manifest_path(p).rsplit("/", 1)[1].split(".", 1)[0] for p in range(n_parts)})
    manifest = fan_out(WRITE_MANIFEST_PART, [dict(store=store, part=p, resolved_digest=resolved[p],
                                                  late_digest=release["late"].get(p), source=source)
                                             for p in range(n_parts)])
    return release, manifest, {"release_shards": summarise("release", shards).counts(),
                               "manifest_parts": count_actions("manifest", (m["action"] for m in manifest)).counts()}


def release_section(release: dict[str, Any], splits: SplitConfig) -> dict[str, Any]:
    """The receipt's release section: split sizes, tiers and every shard's size and caption mix."""
    shards = release["shards"]
    n_train = sum(1 for s in shards.values() if s["split"] == "train")
    sizes = {sp: {"samples": sum(s["count"] for s in shards.values() if s["split"] == sp),
                  "shards": sum(1 for s in shards.values() if s["split"] == sp)} for sp in SPLITS}
    return {"splits": sizes, "tiers": tier_counts(n_train, splits.tiers, splits.preset == "gpic"), "shards": shards,
            "split_rule": release["split_rule"],
            "layout": splits.layout, "images": release["images"], "loaders": loader_note(release["images"], shards)}


def loader_note(images: dict[str, Any], shards: dict[str, Any]) -> str:
    """Whether Hugging Face's webdataset builder can read the release as it is: it needs one
    image member extension across the shards it loads (tasks/release/release_image.py)."""
    exts = sorted({e for s in shards.values() for e in s.get("image_ext", {})})
    if len(exts) <= 1:
        return f"one image member extension ({', '.join(exts) or 'none'}): loadable by datasets and webdataset"
    return (f"image members mix {', '.join(exts)}: Hugging Face's webdataset builder refuses mixed shards; "
            "set splits.image_format: auto (or png) for one extension")
