"""What happens to a prompt that fails: the quarantine ledger, the rotation choice, the new
edition and the anchor-based normalisation across cycles (seed 000, last sections; the rules:
docs/prompt-qualification.md, "Quarantine and rotation"). Nothing is deleted: the ledger lists
every quarantined prompt with its evidence, and anchors are never rotated, whatever their flags.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

from corpusforge.hashing import stable_uniform

QUALIFIED, QUARANTINED, ERROR = "qualified", "quarantined", "error"


def decide(prompt: dict[str, Any], strong_min_models: int) -> dict[str, Any]:
    """The decision, the rules that fired and whether the evidence is strong, from a prompt's signals."""
    if prompt["status"] != "valid":
        return {"decision": ERROR, "rules": [f"error:{prompt['reason']}"], "strong": False, "n_variance_flags": 0}
    rules = []
    density = prompt.get("density") or {}
    if density.get("flagged"):
        rules.append(density["rule"])
    flagged = [m for m, v in sorted((prompt.get("variance") or {}).items()) if v.get("flagged")]
    rules += [f"variance:{m}:{prompt['variance'][m]['variance']:.6g}<{prompt['variance'][m]['cut']:.6g}"
              for m in flagged]
    strong = len(flagged) >= strong_min_models or bool(density.get("flagged"))
    return {"decision": QUARANTINED if rules else QUALIFIED, "rules": rules, "strong": bool(rules) and strong,
            "n_variance_flags": len(flagged)}


def choose_rotation(prompts: list[dict[str, Any]], pool: list[dict[str, Any]], cfg: Any) -> dict[str, Any]:
    """Which prompts leave (and why), which pool prompts join, and what is deferred: quarantined
    prompts over the budget or without strong evidence stay, for review. ``prompts``: every prompt
    row with its ``decision``; ``pool``: valid pool rows with ``density`` (and ``category``);
    ``cfg``: :class:`~tasks.prompts.config.RotationConfig`."""
    active = [p for p in prompts if p["decision"] != ERROR]
    budget = round(cfg.fraction * len(active))
    candidates = [p for p in active if p["decision"] == QUARANTINED and p["strong"] and not p["anchor"]]
    candidates.sort(key=lambda p: (-p["n_variance_flags"], -int(bool((p.get("density") or {}).get("flagged"))),
                                   -((p.get("density") or {}).get("score") or 0.0),
                                   stable_uniform(cfg.seed, p["prompt_id"])))
    leaving = [(p, "contamination") for p in candidates[:budget]]
    deferred = {p["prompt_id"]: "over_budget" for p in candidates[budget:]}
    if cfg.diversity_cycling and len(leaving) < budget:
        cycling = [p for p in active if p["decision"] == QUALIFIED and not p["anchor"]]
        cycling.sort(key=lambda p: (p["cohort"] is None, p["cohort"] or "", stable_uniform(cfg.seed, p["prompt_id"])))
        leaving += [(p, "diversity_cycling") for p in cycling[:budget - len(leaving)]]

    taken = {p["prompt_id"] for p in active}
    eligible = [q for q in pool if q["prompt_id"] not in taken and not (q.get("density") or {}).get("flagged")]
    remaining = [p for p in active if p["prompt_id"] not in {x["prompt_id"] for x, _ in leaving}]
    joining = _choose_replacements(eligible, remaining, len(leaving), cfg.seed)
    for p, _ in leaving[len(joining):]:
        deferred[p["prompt_id"]] = "no_pool_replacement"
    leaving = leaving[:len(joining)]
    return {"budget": budget, "active": len(active), "leaving": [(p["prompt_id"], why) for p, why in leaving],
            "joining": [q["prompt_id"] for q in joining], "deferred": dict(sorted(deferred.items())),
            "pool_eligible": len(eligible), "pool_size": len(pool),
            "anchors": sorted(p["prompt_id"] for p in active if p["anchor"])}


def _choose_replacements(eligible: list[dict[str, Any]], remaining: list[dict[str, Any]], n: int,
                         seed: int) -> list[dict[str, Any]]:
    """``n`` pool prompts: the category furthest below a flat share first (when categories are
    known), then the lowest density score, then a seeded tie-break."""
    counts = Counter(p.get("category") for p in remaining)
    left = sorted(eligible, key=lambda q: (((q.get("density") or {}).get("score") or 0.0),
                                            stable_uniform(seed, q["prompt_id"])))
    chosen = []
    while left and len(chosen) < n:
        best = min(range(len(left)), key=lambda i: (counts[left[i].get("category")], i))
        q = left.pop(best)
        counts[q.get("category")] += 1
        chosen.append(q)
    return chosen


def edition_tables(prompts: list[dict[str, Any]], pool: list[dict[str, Any]], choice: dict[str, Any],
                   edition: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The new edition's prompts (kept ones in their order, then the joining ones) and the
    mapping from every previous prompt (and every joining one) to its place."""
    leaving = dict(choice["leaving"])
    joining = set(choice["joining"])
    rows, mapping = [], []
    for p in prompts:
        pid = p["prompt_id"]
        if p["decision"] == ERROR:
            status, reason = "error", p["reason"]
        elif pid in leaving:
            status, reason = "rotated_out", leaving[pid]
        else:
            status, reason = "kept", choice["deferred"].get(pid, "anchor" if p["anchor"] else "")
            rows.append(_edition_row(p, "previous"))
        mapping.append({"previous_id": pid, "row": p["row"], "new_id": pid if status == "kept" else None,
                        "status": status, "reason": reason})
    for q in pool:
        if q["prompt_id"] in joining:
            mapping.append({"previous_id": None, "row": None, "new_id": q["prompt_id"], "status": "added",
                            "reason": "pool"})
            rows.append(_edition_row({**q, "cohort": q["cohort"] or edition, "anchor": False}, "pool"))
    return rows, mapping


def _edition_row(p: dict[str, Any], origin: str) -> dict[str, Any]:
    return {"prompt_id": p["prompt_id"], "text": p["text"], "cohort": p["cohort"], "category": p.get("category"),
            "difficulty": p["difficulty"], "anchor": bool(p["anchor"]), "origin": origin}


def anchor_normalization(prompts: list[dict[str, Any]], scores: list[tuple[str, str, float]]) -> dict[str, Any]:
    """Mean equating through the anchor set: the offset is the mean over models of (full-set mean −
    anchor mean), a model's comparable score its full-set mean minus the offset — on the anchor
    set's scale, which never changes because the anchors never rotate."""
    valid = {p["prompt_id"]: p["anchor"] for p in prompts if p["decision"] != ERROR}
    if not any(valid.values()):
        return {"computed": False, "reason": "no anchor prompts"}
    by_model: dict[str, dict[str, list[float]]] = {}
    for pid, model, score in scores:
        if pid in valid:
            cell = by_model.setdefault(model, {"all": [], "anchor": []})
            cell["all"].append(score)
            if valid[pid]:
                cell["anchor"].append(score)
    models = {m: c for m, c in sorted(by_model.items()) if c["anchor"]}
    if not models:
        return {"computed": False, "reason": "no scores on anchor prompts"}
    gaps = {m: float(np.mean(c["all"]) - np.mean(c["anchor"])) for m, c in models.items()}
    offset = float(np.mean(list(gaps.values())))
    return {"computed": True, "method": "mean equating through the anchor set", "offset": offset,
            "models": [{"model": m, "full_mean": float(np.mean(c["all"])), "anchor_mean": float(np.mean(c["anchor"])),
                        "n_scores": len(c["all"]), "n_anchor_scores": len(c["anchor"]),
                        "comparable_score": float(np.mean(c["all"]) - offset)} for m, c in models.items()]}


def ledger_rows(prompts: list[dict[str, Any]], choice: dict[str, Any]) -> list[dict[str, Any]]:
    """The quarantine ledger: every quarantined prompt, its evidence, the rules that fired, its fate."""
    leaving = dict(choice["leaving"])
    rows = []
    for p in prompts:
        if p["decision"] != QUARANTINED:
            continue
        fate = ("rotated_out" if p["prompt_id"] in leaving else "kept: anchor, never rotated" if p["anchor"]
                else f"kept: {choice['deferred'][p['prompt_id']]}" if p["prompt_id"] in choice["deferred"]
                else "kept: review")
        rows.append({"prompt_id": p["prompt_id"], "row": p["row"], "text": p["text"], "cohort": p["cohort"],
                     "anchor": p["anchor"], "strong": p["strong"], "n_variance_flags": p["n_variance_flags"],
                     "rules": json.dumps(p["rules"]), "evidence": json.dumps(
                         {"density": p.get("density"), "variance": p.get("variance")}, sort_keys=True),
                     "fate": fate})
    return rows
