"""The tail every corpus-writing flow shares: release assignment → release shards → dataset card → manifest.

A build runs it on its own staging shards; a near-dedup pass runs it for a new corpus
version whose staging shards and ingest rows stay in the earlier version (``source``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

from corpusforge.contract import (FanOut, Unit, forget_step, in_process, keyed, prune, require_marker, require_markers,
                                 step_call, step_result)
from corpusforge.layout import MANIFEST_DIR, manifest_path, staging_tar
from tasks.ingest.files import resolved_path
from tasks.release.files import LATE_DIR, RELEASE_CARD, RELEASE_ASSIGNMENT_DIR, late_path, release_assignment_path
from tasks.captions.files import captions_path
from tasks.graph.files import GRAPH_DECISIONS
from corpusforge.ledger import Ledger
from corpusforge.storage import Store
from tasks.release.manifest import write_manifest_part
from tasks.release.release_card import dataset_card
from tasks.release.shards import ReleaseAssignment, assign_release_files, write_release_shard, write_staged_list
from tasks.release.splits import SPLITS, SplitConfig, tier_counts

ASSIGN_RELEASE = Unit(assign_release_files, "plan-release")
WRITE_RELEASE_SHARD = Unit(write_release_shard, "write-release-shard", probe=True)
WRITE_MANIFEST_PART = Unit(write_manifest_part, "write-manifest-part", probe=True)


def publish(store: Store, staged: list[str], n_parts: int, splits: SplitConfig, near_dedup: bool,
            source: Store | None = None, captions: bool = False, *, resolved: Iterable[str] | None = None,
            fan_out: FanOut = in_process) -> tuple[ReleaseAssignment, Ledger, dict[str, Any]]:
    """Write release shards and manifest.

    ``resolved``: the resolved partitions' digests in order, as the run that resolved them
    has them (its ledger); by default they are read from their markers (in ``source``, or
    ``store``), side by side. Returns the release assignment summary, the ledger of the manifest
    parts (each part's summary: rows, counts by status and reason, in partition order) and
    the work done (units computed and skipped per step)."""
    call = step_call(store, ASSIGN_RELEASE, [splits.model_dump(mode="json"), near_dedup, captions],
                     _assignment_inputs(store, source or store, staged, near_dedup, captions),
                     dict(store=store, staged=write_staged_list(store, staged), cfg=splits, near_dedup=near_dedup,
                          source=source, captions=captions))
    if (done := step_result(store, ASSIGN_RELEASE.name, call["key"])) is not None and not _assignments_there(store,
                                                                                                             done.info):
        forget_step(store, ASSIGN_RELEASE.name)  # an assignment file removed by hand: assign again (the same bytes)
    release = fan_out(keyed(ASSIGN_RELEASE), [call])[0].info
    with Ledger(store, "release") as shards:
        fan_out.stream(WRITE_RELEASE_SHARD, [dict(store=store, split=s["split"], shard=s["index"], cfg=splits,
                                                  assignment_sha256=release["plans"][name]["sha256"], source=source)
                                             for name, s in release["shards"].items()], shards.add)
    present = [sp for sp in SPLITS if any(s["split"] == sp for s in release["shards"].values())]
    store.write_bytes(RELEASE_CARD, dataset_card(splits.layout, present, sorted(
        {e for s in release["shards"].values() for e in s["image_ext"]})))
    if resolved is None:
        resolved = (m.digest for m in require_markers(source or store, [resolved_path(p) for p in range(n_parts)],
                                                      "resolved partition"))
    prune(store, MANIFEST_DIR, {manifest_path(p).rsplit("/", 1)[1].split(".", 1)[0] for p in range(n_parts)})
    calls = [dict(store=store, part=p, resolved_digest=digest, late_digest=release["late"].get(str(p)), source=source)
             for p, digest in enumerate(resolved)]
    if len(calls) != n_parts:
        raise ValueError(f"digests of {n_parts} resolved partitions expected, {len(calls)} given")
    with Ledger(store, "manifest") as manifest:
        fan_out.stream(WRITE_MANIFEST_PART, calls, manifest.add)
    return release, manifest, {"release_shards": shards.summary("release").counts(),
                               "manifest_parts": manifest.summary("manifest").counts()}


def _assignments_there(store: Store, result: ReleaseAssignment) -> bool:
    """Whether every assignment and late file a recorded release assignment names is there: the release
    shards, the manifest parts and the evaluation caption set read them when their own keys
    change. One listing per folder (O(shards) names), not a request per file."""
    return all(set(map(posixpath.basename, rels)) <= set(store.listdir(folder)) for folder, rels in (
        (RELEASE_ASSIGNMENT_DIR, [release_assignment_path(name) for name in result["plans"]]),
        (LATE_DIR, [late_path(int(part)) for part in result["late"]])))


def _assignment_inputs(store: Store, source: Store, staged: list[str], near_dedup: bool, captions: bool) -> list[Any]:
    """The digests of what the release assignment reads (its key): every staging shard's (records and
    index), the near-duplicate decisions' and every shard's caption rows' when those stages ran.
    Markers only, read side by side."""
    return [staged, [m.digest for m in require_markers(source, [staging_tar(s) for s in staged], "staging shard")],
            require_marker(store, GRAPH_DECISIONS, "near-duplicate decisions").digest if near_dedup else None,
            [m.digest for m in require_markers(store, [captions_path(s) for s in staged], "captions")]
            if captions else None]


def release_section(release: ReleaseAssignment, splits: SplitConfig) -> dict[str, Any]:
    """The receipt's release section: split sizes, tiers and every shard's size and caption mix."""
    shards = release["shards"]
    sizes = {sp: {"samples": sum(s["count"] for s in shards.values() if s["split"] == sp),
                  "shards": sum(1 for s in shards.values() if s["split"] == sp)} for sp in SPLITS}
    return {"splits": sizes, "tiers": tier_counts(sizes["train"]["shards"], splits.tiers, splits.preset == "gpic"),
            "shards": shards, "split_rule": release["split_rule"], "layout": splits.layout, "images": release["images"],
            "loaders": loader_note(release["images"], shards)}


def loader_note(images: dict[str, Any], shards: dict[str, Any]) -> str:
    """Whether Hugging Face's webdataset builder can read the release as it is: it needs one
    image member extension across the shards it loads (tasks/release/release_image.py)."""
    exts = sorted({e for s in shards.values() for e in s.get("image_ext", {})})
    if len(exts) <= 1:
        return f"one image member extension ({', '.join(exts) or 'none'}): loadable by datasets and webdataset"
    return (f"image members mix {', '.join(exts)}: Hugging Face's webdataset builder refuses mixed shards; "
            "set splits.image_format: auto (or png) for one extension")
