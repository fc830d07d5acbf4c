"""Per-item decisions and the new benchmark edition (seed 003: quarantine without mutation).

Per evaluation chunk one unit folds the text, image and image–text findings into
``contamination/items/{chunk}.parquet``: the worst text decision over the scanned fields, the
image flag, the judge's verdict and the item's fate under ``edition.quarantine_on``. A
quarantined item leaves the new edition with its evidence kept; ``review`` items stay and are
listed. The edition is new files only (``edition/``; the input is never opened for writing),
with new ids so that a refreshed item does not inherit an old score under the same identifier.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from corpusforge.contract import UnitResult, read_marker, require_marker, run_unit, unit_fingerprint
from corpusforge.hashing import canonical_json
from tasks.contamination.files import (EDITION_ITEMS, EDITION_ITEM_SCHEMA, EDITION_MAPPING, EDITION_MAPPING_SCHEMA,
                                       EDITION_META, ITEM_DECISION_SCHEMA, eval_items_path, image_rows_path,
                                       item_decisions_path, judge_rows_path, text_rows_path)
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.contamination.config import EditionConfig

_ORDER = {"quarantine": 2, "review": 1, "retain": 0}


def _digest(out: Store, rel: str) -> str | None:
    m = read_marker(out, rel)
    return None if m is None else m.digest


def item_decisions(out: Store, chunk: str, cfg: EditionConfig, image_threshold: float | None) -> UnitResult:
    """Fold one chunk's findings into per-item rows (skipped when none of them changed)."""
    sources = {"text": text_rows_path(chunk), "image": image_rows_path(chunk), "image_text": judge_rows_path(chunk)}
    inputs = [require_marker(out, eval_items_path(chunk), "evaluation items").digest,
              {k: _digest(out, v) for k, v in sources.items()}]
    fp = unit_fingerprint("contamination-items", code_version(__name__),
                          [sorted(cfg.quarantine_on), image_threshold], inputs)
    rel = item_decisions_path(chunk)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        items = out.read_parquet(eval_items_path(chunk)).to_pylist()
        found = {k: out.read_parquet(rel).to_pylist() if inputs[1][k] else [] for k, rel in sources.items()}
        text: dict[str, list[dict[str, Any]]] = {}
        for r in found["text"]:
            text.setdefault(r["item_id"], []).append(r)
        image = {r["item_id"]: r for r in found["image"]}
        judged = {r["item_id"]: r for r in found["image_text"]}
        rows, counts = [], Counter()
        for item in items:
            iid = item["item_id"]
            t_rows = text.get(iid, [])
            t_dec = max((r["decision"] for r in t_rows), key=_ORDER.__getitem__) if t_rows else None
            rules = {r["field"]: r["rule"] for r in t_rows if r["rule"]}
            im, jd = image.get(iid), judged.get(iid)
            reasons = []
            if "text" in cfg.quarantine_on and t_dec == "quarantine":
                reasons += [f"text:{f}:{rule}" for f, rule in sorted(rules.items())
                            if any(r["field"] == f and r["decision"] == "quarantine" for r in t_rows)]
            if "image" in cfg.quarantine_on and im is not None and im["flagged"]:
                reasons.append(f"image:similarity>{image_threshold}")
            if "image_text" in cfg.quarantine_on and jd is not None and jd["verdict"] == "inferable":
                reasons.append(f"image_text:inferable:{jd['judge']}")
            status = "quarantined" if reasons else "retained"
            counts[status] += 1
            counts[f"text_{t_dec}"] += t_dec is not None
            rows.append({"item_id": iid, "row": item["row"], "item_sha256": item["item_sha256"],
                         "category": item["category"], "text_decision": t_dec,
                         "text_rules": json.dumps(rules, sort_keys=True) if t_rows else None,
                         "image_status": im["status"] if im else None,
                         "image_similarity": im["max_similarity"] if im else None,
                         "image_match_key": im["match_key"] if im else None,
                         "image_flagged": im["flagged"] if im else None,
                         "image_exact_copy": im["exact_copy"] if im else None,
                         "image_text_verdict": jd["verdict"] if jd else None,
                         "edition_status": status, "reasons": json.dumps(reasons)})
        table = pa.Table.from_pylist(rows, schema=ITEM_DECISION_SCHEMA)
        return {rel: out.write_parquet(rel, table)}, dict(sorted(counts.items()))

    return run_unit(out, rel, fp, compute)


def _coverage(before: Counter, after: Counter) -> list[dict[str, Any]]:
    rows = []
    for cat in sorted(before, key=lambda c: (c is None, str(c))):
        b, a = before[cat], after.get(cat, 0)
        rows.append({"category": cat, "original": b, "revised": a, "lost": b - a,
                     "lost_share": (b - a) / b if b else None})
    return rows


def write_edition(out: Store, chunks: Sequence[str], benchmark: dict[str, Any], cfg: EditionConfig
                  ) -> UnitResult:
    """The new edition from every chunk's decisions (one unit: new ids are numbered in input order)."""
    digests = [require_marker(out, item_decisions_path(c), "item decisions").digest for c in chunks]
    fp = unit_fingerprint("contamination-edition", code_version(__name__), [cfg.name, benchmark["name"]],
                          [benchmark["manifest_sha256"], digests])

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        decided, items = [], []
        for c in chunks:
            decided += out.read_parquet(item_decisions_path(c)).to_pylist()
            items += out.read_parquet(eval_items_path(c)).to_pylist()
        quarantined = [d["item_id"] for d in decided if d["edition_status"] == "quarantined"]
        name = cfg.name or "{}-ed-{}".format(benchmark["name"], hashlib.sha256(canonical_json(
            [benchmark["manifest_sha256"], quarantined]).encode()).hexdigest()[:12])
        by_id = {i["item_id"]: i for i in items}
        kept, mapping, n = [], [], 0
        for d in decided:
            new_id = None
            if d["edition_status"] == "retained":
                new_id = f"{name}-{n:06d}"
                n += 1
                i = by_id[d["item_id"]]
                kept.append({"new_id": new_id, "previous_id": d["item_id"], **{k: i[k] for k in (
                    "item_sha256", "image_source", "image_sha256", "category", "answer", "texts")}})
            mapping.append({"previous_id": d["item_id"], "new_id": new_id, "status": d["edition_status"],
                            "reasons": d["reasons"]})
        before = Counter(d["category"] for d in decided)
        after = Counter(d["category"] for d in decided if d["edition_status"] == "retained")
        previous = {k: benchmark[k] for k in ("name", "manifest_sha256", "source")}
        meta = {"edition": name, "previous": previous,
                "quarantine_on": sorted(cfg.quarantine_on),
                "denominators": {"original": len(decided), "revised": len(kept), "quarantined": len(quarantined)},
                "coverage": _coverage(before, after),
                "review": sum(1 for d in decided if d["text_decision"] == "review"),
                "note": "a new edition: the input benchmark is unchanged; quarantined items keep their evidence in "
                        "contamination/items and their mapping row"}
        outputs = {EDITION_ITEMS: out.write_parquet(EDITION_ITEMS, pa.Table.from_pylist(
                       kept, schema=EDITION_ITEM_SCHEMA)),
                   EDITION_MAPPING: out.write_parquet(EDITION_MAPPING, pa.Table.from_pylist(
                       mapping, schema=EDITION_MAPPING_SCHEMA))}
        outputs[EDITION_META] = out.write_json(EDITION_META, meta)
        return outputs, meta

    return run_unit(out, EDITION_META, fp, compute)
