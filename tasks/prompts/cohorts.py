"""Signal 3, cohort divergence: does a model score higher on old prompts than on new ones?

Per generating model: old-cohort minus new-cohort mean score, as the average of the
within-difficulty-stratum differences weighted by each stratum's scored prompts (strata lacking
a cohort are left out, counted), so an old cohort that is merely easier does not show as
divergence; stratified rather than regressed on difficulty because it assumes no functional form
and its weights are visible. The interval is a percentile bootstrap within each (stratum, cohort)
cell, seeded from ``seed`` and the model's name (independent of model order). A harder new cohort
or score drift diverges too: a risk indicator to weight new-cohort scores by, not an attribution
(docs/prompt-qualification.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from corpusforge.hashing import stable_int


def difficulty_strata(difficulties: list[str | None], bins: int) -> list[str]:
    """Stratum label per prompt: the value itself, or a quantile bin of a many-valued numeric difficulty."""
    present = [d for d in difficulties if d is not None]
    try:
        numbers = np.array([float(d) for d in present])
        numeric = bool(present)
    except ValueError:
        numeric = False
    if not numeric or len(set(present)) <= bins:
        return ["(none)" if d is None else str(d) for d in difficulties]
    edges = np.quantile(numbers, np.linspace(0, 1, bins + 1)[1:-1])
    return ["(none)" if d is None else f"bin{int(np.searchsorted(edges, float(d), side='right'))}"
            for d in difficulties]


def _estimate(cells: dict[str, tuple[np.ndarray, np.ndarray, int]]) -> np.ndarray | float:
    """Weighted mean of within-stratum mean differences; cell values may be [B] arrays of means."""
    return sum(n * (old - new) for old, new, n in cells.values()) / sum(n for _, _, n in cells.values())


def divergence(old: dict[str, np.ndarray], new: dict[str, np.ndarray], n_boot: int, confidence: float,
               rng: np.random.Generator) -> dict[str, Any]:
    """The stratified divergence of one model and its bootstrap interval (strata: label → scores)."""
    shared = sorted(set(old) & set(new))
    if not shared:
        return {"divergence": None, "interval": None, "strata_used": 0}
    point = {s: (old[s].mean(), new[s].mean(), len(old[s]) + len(new[s])) for s in shared}
    est = _estimate(point)
    boot = {}
    for s in shared:
        means = []
        for values in (old[s], new[s]):
            idx = rng.integers(0, len(values), size=(n_boot, len(values)))
            means.append(values[idx].mean(axis=1))
        boot[s] = (means[0], means[1], len(old[s]) + len(new[s]))
    samples = _estimate(boot)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(samples, [alpha, 1 - alpha])
    return {"divergence": float(est), "interval": [float(lo), float(hi)], "strata_used": len(shared)}


def cohort_divergence(prompts: list[dict[str, Any]], scores: list[tuple[str, str, float]], cfg: Any,
                      use_difficulty: bool) -> dict[str, Any]:
    """Per model: means, the (difficulty-stratified) divergence, its interval and the flag.
    ``prompts``: valid prompt rows; ``cfg``: :class:`~tasks.prompts.config.CohortConfig`."""
    cohorts = sorted({p["cohort"] for p in prompts if p["cohort"] is not None})
    old_set = set(cfg.old_cohorts or cohorts[:1])
    new_set = set(cfg.new_cohorts or cohorts[-1:])
    base = {"old_cohorts": sorted(old_set), "new_cohorts": sorted(new_set), "cohorts": cohorts,
            "method": "difficulty-stratified mean difference" if use_difficulty else "mean difference",
            "threshold": cfg.threshold, "models": []}
    if len(cohorts) < 2 or old_set & new_set:
        base["skipped"] = "fewer than two cohorts, or old and new cohorts overlap"
        return base
    strata = difficulty_strata([p["difficulty"] for p in prompts], cfg.difficulty_bins) if use_difficulty \
        else ["all"] * len(prompts)
    where = {p["prompt_id"]: ("old" if p["cohort"] in old_set else "new" if p["cohort"] in new_set else None, s)
             for p, s in zip(prompts, strata, strict=True)}
    by_model: dict[str, dict[str, dict[str, list[float]]]] = {}
    for pid, model, score in scores:
        side, stratum = where.get(pid, (None, None))
        if side is not None:
            by_model.setdefault(model, {"old": {}, "new": {}})[side].setdefault(stratum, []).append(score)
    for model in sorted(by_model):
        cells = {side: {s: np.array(v, dtype=np.float64) for s, v in by_model[model][side].items()}
                 for side in ("old", "new")}
        old_all = np.concatenate(list(cells["old"].values())) if cells["old"] else np.zeros(0)
        new_all = np.concatenate(list(cells["new"].values())) if cells["new"] else np.zeros(0)
        rng = np.random.default_rng(stable_int(cfg.seed, model, 2**63))
        result = divergence(cells["old"], cells["new"], cfg.bootstrap, cfg.confidence, rng)
        value = result["divergence"]
        base["models"].append({
            "model": model, "n_old": len(old_all), "n_new": len(new_all),
            "mean_old": float(old_all.mean()) if len(old_all) else None,
            "mean_new": float(new_all.mean()) if len(new_all) else None,
            "raw_divergence": float(old_all.mean() - new_all.mean()) if len(old_all) and len(new_all) else None,
            "divergence": value, "interval": result["interval"], "strata_used": result["strata_used"],
            "strata_dropped": len(set(cells["old"]) ^ set(cells["new"])),
            "flagged": value is not None and value > cfg.threshold})
    return base
