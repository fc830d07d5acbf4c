"""The contamination receipt: what was compared with what, under which rules, with which result.

Everything a reviewer needs to replay a run and nothing that varies between identical runs
(no wall-clock times, no counts of reused work), so it changes when any input byte, seed or
threshold changes, and not otherwise (contents: docs/contamination.md, "Receipt"); item hashes
are inline up to :data:`INLINE_ITEMS`, always in the per-item files whose SHA-256s it lists.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from corpusforge.hashing import canonical_json
from tasks.report.files import RECEIPT
from tasks.contamination.files import CONTAMINATION_RECEIPT, eval_items_path
from corpusforge.storage import Store, open_uri
from tasks.contamination.config import ImageScanConfig, JudgeConfig, LeakageConfig, TextCanaryConfig

INLINE_ITEMS = 10_000
CLAIM_BOUNDARY = ("These results measure overlap between the supplied evaluation set and the supplied corpus "
                  "snapshot. Overlap found is not evidence that any model was trained on, memorised or gained "
                  "its score from these items; items outside the scanned snapshot are clean only relative to it.")


def file_sha256(uri: str, options: dict[str, Any]) -> str:
    with open_uri(uri, options) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def benchmark_identity(out: Store, name: str, source: str, kind: str, chunks: Sequence[str],
                       input_files: Sequence[str], options: dict[str, Any]) -> dict[str, Any]:
    """Hashes of the evaluation set as read: its manifest, its files, every item."""
    items: list[list[str]] = []
    files: dict[str, str] = {}
    for c in chunks:
        t = out.read_parquet(eval_items_path(c), columns=["item_id", "item_sha256"])
        items += [[i, s] for i, s in zip(t["item_id"].to_pylist(), t["item_sha256"].to_pylist(), strict=True)]
        files[eval_items_path(c)] = out.sha256(eval_items_path(c))
    manifest = hashlib.sha256(canonical_json(items).encode()).hexdigest()
    ident = {"name": name, "source": source, "kind": kind, "items": len(items), "manifest_sha256": manifest,
             "manifest_definition": "SHA-256 of the JSON list [[item_id, item_sha256], …] in input order; "
                                    "item_sha256 hashes id, scanned texts, answer, category and image bytes' SHA-256",
             "input_files_sha256": {u: file_sha256(u, options) for u in input_files},
             "item_files_sha256": files}
    if len(items) <= INLINE_ITEMS:
        ident["item_sha256"] = dict(items)
    return ident


def corpus_snapshot(corpus: Store) -> dict[str, Any]:
    """The comparison corpus as scanned: its receipt's SHA-256 and what that receipt says."""
    if not corpus.exists(RECEIPT):
        return {"root": corpus.root, "receipt_sha256": None, "note": "no receipt.json: not a finished build"}
    receipt = corpus.read_json(RECEIPT)
    return {"root": corpus.root, "receipt_sha256": corpus.sha256(RECEIPT),
            "input_snapshot_sha256": receipt.get("input_snapshot_sha256"),
            "code_version": receipt.get("code_version"), "counts": receipt.get("counts", {}).get("by_status")}


def build_thresholds(corpus: Store) -> list[float]:
    """The build's edge and pair-removal thresholds (from its receipt; a receipt written before
    their renaming has graph_threshold and pair_threshold), else GPIC's: where the cross-split
    leakage is counted."""
    near = (corpus.read_json(RECEIPT).get("thresholds", {}).get("near_dedup") if corpus.exists(RECEIPT) else None)
    if near:
        edge = near.get("edge_min_similarity", near.get("graph_threshold"))
        pair = near.get("pair_removal_above", near.get("pair_threshold"))
        return sorted({float(edge), float(pair)})
    return [0.90, 0.9625]


def stable_results(results: dict[str, Any]) -> dict[str, Any]:
    """The stages' summaries without how much work this run reused (a rerun's receipt is a
    fresh run's)."""
    stable = {}
    for name, section in results.items():
        section = dict(section)
        scan = section.get("scan")
        if isinstance(scan, dict):
            section["scan"] = {k: v for k, v in scan.items() if k != "units"}
        stable[name] = section
    return stable


def thresholds(image: ImageScanConfig | None, text: TextCanaryConfig | None, leakage: LeakageConfig | None,
               judge: JudgeConfig | None) -> dict[str, Any]:
    """Every threshold of the measurements run, with its comparison."""
    t: dict[str, Any] = {}
    if image:
        t["image"] = {"threshold": image.flag_above, "comparison": ">", "curve": image.curve}
    if text:
        t["text"] = {k: getattr(text, k) for k in ("exact", "normalized", "direct_jaccard", "signature",
                                                    "review_direct_jaccard", "review_signature")}
    if leakage:
        t["leakage"] = {"thresholds": leakage.thresholds, "review_threshold": leakage.review_min_similarity,
                        "comparison": ">="}
    if judge:
        t["image_text"] = {"containment": judge.containment, "min_similarity": judge.retrieve_above}
    return t


def seeds(image: ImageScanConfig | None, text: TextCanaryConfig | None, leakage: LeakageConfig | None
          ) -> dict[str, Any]:
    """Every seed of the measurements run."""
    s: dict[str, Any] = {}
    if text:
        s.update(signature=text.seeds, lsh=text.lsh.seed, lsh_recall_sample=text.lsh.recall_seed)
    if image:
        s["image_ivf"] = image.ivf.seed
    if leakage:
        s["leakage_ivf"] = leakage.ivf.seed
    return s


def write_receipt(out: Store, receipt: dict[str, Any]) -> str:
    return out.write_json(CONTAMINATION_RECEIPT, receipt)
