"""The tail every corpus-writing flow shares: release plan → release shards → manifest → receipt.

A build runs it on its own staging shards; a near-dedup pass runs it for a new corpus
version whose staging shards and ingest rows stay in the earlier version (``source``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from corpusforge.cluster import as_task, run_tasks
from corpusforge.contract import count_actions, prune, require_marker
from corpusforge.artifacts import publish_run_artifacts
from corpusforge.layout import MANIFEST_DIR, RECEIPT, RELEASE_CARD, REPORT, REPORT_HTML, manifest_path, resolved_path
from corpusforge.storage import Store
from tasks.ingest.licenses import LicenseConfig
from tasks.release.manifest import write_manifest_part
from tasks.report.receipt import render_report
from tasks.release.shards import plan_release_files, write_release_shard, write_staged_list
from tasks.release.release_card import dataset_card
from tasks.report.report_html import render_html_report
from tasks.release.splits import SPLITS, SplitConfig, tier_counts

release_plan_task = as_task(plan_release_files, "plan-release")
release_task = as_task(write_release_shard, "write-release-shard")
manifest_task = as_task(write_manifest_part, "write-manifest-part", probe=True)


def publish(store: Store, staged: list[str], n_parts: int, splits: SplitConfig, near_dedup: bool,
            source: Store | None = None, captions: bool = False
            ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Write release shards and manifest.

    Returns the release plan summary, the manifest part summaries and the work done
    (units computed and skipped per step)."""
    release = run_tasks(release_plan_task, [dict(store=store, staged=write_staged_list(store, staged), cfg=splits,
                                                 near_dedup=near_dedup, source=source, captions=captions)])[0]
    shards = run_tasks(release_task, [dict(store=store, split=s["split"], shard=s["index"], cfg=splits,
                                           plan_sha256=release["plans"][name]["sha256"], source=source)
                                      for name, s in release["shards"].items()])
    present = [sp for sp in SPLITS if any(s["split"] == sp for s in release["shards"].values())]
    store.write_bytes(RELEASE_CARD, dataset_card(splits.layout, present, sorted(
        {e for s in release["shards"].values() for e in s["image_ext"]})))
    resolved = [require_marker(source or store, resolved_path(p), "resolved partition")["digest"]
                for p in range(n_parts)]
    prune(store, MANIFEST_DIR, {manifest_path(p).rsplit("/", 1)[1].split(".", 1)[0] for p in range(n_parts)})
    manifest = run_tasks(manifest_task, [dict(store=store, part=p, resolved_digest=resolved[p],
                                              late_digest=release["late"].get(p), source=source)
                                         for p in range(n_parts)])
    return release, manifest, {"release_shards": count_actions(shards), "manifest_parts": count_actions(manifest)}


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


def license_section(lic: LicenseConfig | None, ingest_infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The receipt's licence section: the allow-list as normalised, how name/URL conflicts
    are resolved and how many input records had one, and the input records per licence
    family (what was filtered, and why, is in the counts by reason)."""
    families: Counter[str] = Counter()
    for info in ingest_infos:
        families.update(info.get("licenses", {}))
    return {"allow": [str(a) for a in lic.allowed()] if lic else None, "use_url": lic.use_url if lic else None,
            "on_conflict": lic.on_conflict if lic else None, "conflicts": families.get("conflict", 0),
            "input_by_family": dict(sorted(families.items()))}


def write_receipt(store: Store, receipt: dict[str, Any]) -> None:
    """receipt.json, then report.md and report.html rendered from exactly what was written
    (sorted keys), so the reports do not depend on the order in which this run filled the
    dicts; in a flow run, the summary also becomes the run's artifacts."""
    store.write_json(RECEIPT, receipt)
    written = store.read_json(RECEIPT)
    report = render_report(written)
    store.write_bytes(REPORT, report.encode())
    store.write_bytes(REPORT_HTML, render_html_report(written, store).encode())
    flow = str(written.get("corpusforge", "run")).replace("_", "-")
    publish_run_artifacts(flow, report, written["counts"], store.root)
