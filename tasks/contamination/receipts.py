"""The contamination receipt: what was compared with what, under which rules, with which result.

Everything a reviewer needs to replay a run and nothing that varies between identical
runs (no wall-clock times, no counts of reused work): the benchmark manifest's SHA-256
(over every item's id and content hash, in order) and the SHA-256 of every input file
read, each item's hash (inline up to :data:`INLINE_ITEMS`, always in the per-item
files whose SHA-256s are listed), the comparison corpus's snapshot (its receipt's
SHA-256 and input snapshot hash), the normalisation profile, every threshold and seed,
the scanner's code version, the results, the edition, and the SHA-256 of every output.
So it changes when any input byte, seed or threshold changes, and not otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from corpusforge.hashing import canonical_json
from corpusforge.layout import (CONTAMINATION_DIR, CONTAMINATION_RECEIPT, CONTAMINATION_REPORT,
                                CONTAMINATION_REPORT_HTML, EDITION_DIR, RECEIPT, eval_items_path)
from corpusforge.storage import Store, open_uri

INLINE_ITEMS = 10_000
CLAIM_BOUNDARY = ("These results measure overlap between the supplied evaluation set and the supplied corpus "
                  "snapshot. Overlap found is not evidence that any model was trained on, memorised or gained "
                  "its score from these items; items outside the scanned snapshot are clean only relative to it.")


def file_sha256(uri: str, options: dict[str, Any]) -> str:
    h = hashlib.sha256()
    with open_uri(uri, options) as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


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


def output_hashes(out: Store) -> dict[str, str]:
    """SHA-256 of every result file (contamination/, edition/), except the receipt and reports."""
    skip = {CONTAMINATION_RECEIPT, CONTAMINATION_REPORT, CONTAMINATION_REPORT_HTML}
    hashes: dict[str, str] = {}
    for folder in (CONTAMINATION_DIR, EDITION_DIR):
        base = out.fs._strip_protocol(out.path(folder)).rstrip("/")
        if not out.exists(folder):
            continue
        for path in sorted(out.fs.find(base)):
            rel = f"{folder}/{path[len(base) + 1:]}"
            if rel not in skip and "/." not in f"/{rel}":
                hashes[rel] = out.sha256(rel)
    return hashes


def write_receipt(out: Store, receipt: dict[str, Any]) -> str:
    return out.write_json(CONTAMINATION_RECEIPT, receipt)
