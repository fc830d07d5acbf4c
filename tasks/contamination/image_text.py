"""Image–text contamination per evaluation chunk: retrieve training captions, ask the judge.

The captions of an item's top image matches (similarity above ``retrieve_above``) are read from
the corpus's staging tars by ranged reads and passed to the judge. The unit's fingerprint holds
the judge's identity, so a changed judge, model or prompt re-asks and an unchanged one keeps its
verdicts (a chat model's answers are not re-drawn on a rerun). An unresolved item is "exposure
unresolved", never counted as clean.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from corpusforge.contract import UnitResult, require_marker, run_unit, unit_fingerprint
from tasks.contamination.files import JUDGE_SCHEMA, eval_items_path, found_matches_path, judge_rows_path
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.contamination.config import JudgeConfig
from tasks.contamination.judge import UNRESOLVED, JudgeInput, identity_sha256, make_judge
from tasks.shared.samples import staged_captions


def read_captions(corpus: Store, wanted: dict[str, set[str]]) -> dict[str, str]:
    """Captions (``.txt`` members) of ``wanted`` keys per staging shard, by ranged reads."""
    out: dict[str, str] = {}
    for shard, keys in sorted(wanted.items()):
        out.update(zip(*staged_captions(corpus, shard, keys), strict=True))
    return out


def judge_chunk(out: Store, corpus: Store, chunk: str, cfg: JudgeConfig, question_fields: Sequence[str],
                has_matches: bool) -> UnitResult:
    """Verdicts for one chunk's items (skipped when items, matches and judge are unchanged)."""
    judge = make_judge(cfg)
    found = found_matches_path("images", chunk)
    inputs = [require_marker(out, eval_items_path(chunk), "evaluation items").digest,
              require_marker(out, found, "image scan").digest if has_matches else None]
    fp = unit_fingerprint("contamination-judge", code_version(__name__),
                          [judge.identity(), cfg.captions, cfg.retrieve_above, list(question_fields)], inputs)
    rel = judge_rows_path(chunk)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        items = out.read_parquet(eval_items_path(chunk)).to_pylist()
        matches: dict[str, list[tuple[str, str, float]]] = {}
        if has_matches:
            t = out.read_parquet(found)
            for q, shard, key, s in zip(t["query_key"].to_pylist(), t["target_shard"].to_pylist(),
                                        t["target_key"].to_pylist(), t["similarity"].to_pylist(), strict=True):
                if s > cfg.retrieve_above and len(matches.setdefault(q, [])) < cfg.captions:
                    matches[q].append((shard, key, s))
        wanted: dict[str, set[str]] = {}
        for rows in matches.values():
            for shard, key, _ in rows:
                wanted.setdefault(shard, set()).add(key)
        captions = read_captions(corpus, wanted)
        sha, name = identity_sha256(judge), judge.name
        rows, counts = [], {"judged": 0, "inferable": 0, "not_inferable": 0, "unresolved": 0, "no_answer": 0,
                            "no_image": 0}
        for item in items:
            row = {"item_id": item["item_id"], "judge": name, "judge_sha256": sha}
            if not (item["answer"] or "").strip():
                row["status"] = "no_answer"
            elif item["image_sha256"] is None or not matches.get(item["key"]):
                row["status"] = "no_image"  # no image, not embedded, or nothing retrieved for it
            else:
                texts = json.loads(item["texts"] or "{}")
                shown = tuple((key, captions.get(key, ""), float(s)) for _, key, s in matches.get(item["key"], []))
                question = "\n".join(str(texts[f]) for f in question_fields if texts.get(f))
                v = judge.judge(JudgeInput(item["item_id"], question, item["answer"], shown))
                row.update(status="judged", verdict=v.verdict, evidence=json.dumps(v.evidence, sort_keys=True),
                           error=v.error, attempts=v.attempts,
                           captions=json.dumps([[k, round(s, 6)] for k, _, s in shown]))
                counts[v.verdict] += 1
            counts[row["status"]] = counts.get(row["status"], 0) + 1
            rows.append(row)
        table = pa.Table.from_pylist(rows, schema=JUDGE_SCHEMA)
        return {rel: out.write_parquet(rel, table)}, counts

    return run_unit(out, rel, fp, compute)


def summarize_judge(markers: Sequence[UnitResult], identity: dict[str, Any]) -> dict[str, Any]:
    keys = ("judged", "inferable", "not_inferable", "unresolved", "no_answer", "no_image")
    c = {k: sum(m.info.get(k, 0) for m in markers) for k in keys}
    return {"judge": identity, **c, "rate": (c["inferable"] / c["judged"]) if c["judged"] else None,
            "rate_definition": "inferable / judged (items with an answer and an embedded image)",
            "unresolved_note": f"{c['unresolved']} item(s) exposure unresolved ({UNRESOLVED}): not counted as clean"}
