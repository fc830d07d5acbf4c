"""Image collision models (GPIC Fig. 6): predict removals at full scale from subsets.

On nested random subsets (key hash < fraction, seeded: each subset contains the smaller
ones) and for every threshold θ, count the images that "keep only the highest-resolution
image of each connected component of the pairs > θ" would remove — for a component of
size s that is s − 1, whatever the resolutions — then fit D(N) = A·N^β per θ by least
squares in log–log space and extrapolate to the corpus size and to a target size
(GPIC's 110,569,761-image source pool).

A fit has to earn its predictions (two points always fit exactly, R² = 1, and a few removals
in tiny subsets extrapolate to nonsense): ``min_fit_points`` subset sizes spanning ``min_fit_decades``
(GPIC fitted six nested subsets from 108K to 3.4M), a prediction only up to ``max_extrapolation``
times the largest fitted subset and never above the images it is about; otherwise the JSON holds
``None`` and the reason (docs/near-duplicates.md). A corpus up to ``max_subset_vectors`` is also
counted whole: a held-out check when the largest fraction is below 1.

One search serves all subsets and thresholds: an exhaustive range search (or IVF range
search above ``flat_max_vectors``) at the lowest θ over the whole corpus (or, above
``max_subset_vectors``, the largest subset). Pairs of a smaller subset are exactly the
searched set's pairs with both ends inside it, because a range search has no per-node
cap (a k-NN search would give different neighbours in different subsets). If the
largest fraction would exceed ``max_subset_vectors`` all fractions are scaled down
together (recorded). The pairs are saved for the calibration sheets' low-similarity bins.

Cost at scale: the search, its pairs and the counts cover at most ``max_subset_vectors`` vectors
(:func:`choose_subsets`), a sample the same in any process (key hashes, seeded); what grows with N
is one pass that hashes each key, shards read side by side a window at a time (docs/scaling.md).

Output: ``graph/collision/table.parquet`` (threshold, fraction, subset_size, removed),
``table.json`` (the same rows, the fits, actual and predicted removals with reasons),
``plot.png``, ``pairs.parquet``.
"""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.contract import UnitResult, run_unit, side_by_side
from corpusforge.feature_files import require_all_features
from corpusforge.hashing import stable_uniform
from corpusforge.storage import Store
from tasks.graph import index as fx
from tasks.graph.components import UnionFind
from tasks.graph.config import CollisionConfig, NearDedupConfig
from tasks.graph.edges import edge_table, pair_score_of
from tasks.graph.nodes import NodeTable, load_shard_vectors, read_shard_table, rows_in_order
from tasks.shared.pair_score import PairScore

TABLE_PATH = "graph/collision/table.parquet"
JSON_PATH = "graph/collision/table.json"
PLOT_PATH = "graph/collision/plot.png"
PAIRS_PATH = "graph/collision/pairs.parquet"

GATHER_THREADS = 8  # shards read side by side by the pass over the corpus
GATHER_WINDOW = 8  # shards in flight at once (10k records already fill it): their picks are held
SCORE_BATCH = 1 << 14  # pairs rescored at a time: both ends' rows, in float64 (~24 KB a pair at 512-d)

TABLE_SCHEMA = pa.schema([("threshold", pa.float64()), ("fraction", pa.float64()),
                          ("subset_size", pa.int64()), ("removed", pa.int64())])


def fit_power_law(sizes: np.ndarray, removed: np.ndarray, min_points: int = 3,
                  min_decades: float = 1.0) -> dict[str, Any]:
    """Least-squares fit of log D = log A + β log N over the points with D > 0.

    Refused (``fitted`` False, ``reason`` says why) with fewer than ``min_points``
    distinct subset sizes with removals, or when they span less than ``min_decades``.
    ``r2`` is the coefficient of determination in log space (None when the log counts do
    not vary). ``fit_sizes`` is the [smallest, largest] fitted subset size.
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    removed = np.asarray(removed, dtype=np.float64)
    pos = removed > 0
    distinct = np.unique(sizes[pos])
    if len(distinct) < min_points:
        return {"fitted": False, "points": len(distinct),
                "reason": f"{len(distinct)} subset size(s) with removals; a fit needs {min_points}"}
    decades = float(np.log10(distinct[-1] / distinct[0]))
    if decades < min_decades:
        return {"fitted": False, "points": len(distinct),
                "reason": f"subsets with removals span {decades:.2f} decade(s) ({int(distinct[0])} to "
                          f"{int(distinct[-1])} images); a fit needs {min_decades:g}"}
    x, y = np.log(sizes[pos]), np.log(removed[pos])
    design = np.stack([np.ones_like(x), x], axis=1)
    (log_a, beta), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - (log_a + beta * x)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else None
    return {"fitted": True, "A": float(math.exp(log_a)), "beta": float(beta), "r2": r2,
            "points": len(distinct), "fit_sizes": [int(distinct[0]), int(distinct[-1])]}


def predict(fit: dict[str, Any], n: int, max_extrapolation: float) -> tuple[float | None, str | None]:
    """The fit's removals at ``n`` images, or None and the reason it is not given."""
    if not fit["fitted"]:
        return None, f"no fit: {fit['reason']}"
    largest = fit["fit_sizes"][1]
    if n > largest * max_extrapolation:
        return None, (f"{n} images is {n / largest:.0f}x the largest fitted subset ({largest}); "
                      f"predictions reach at most {max_extrapolation:g}x")
    value = fit["A"] * float(n) ** fit["beta"]
    if value > n - 1:
        return None, (f"the fit (beta = {fit['beta']:.2f}) would remove more than the {n} images: "
                      f"the power law does not hold that far")
    return value, None


def removals(n: int, a: np.ndarray, b: np.ndarray) -> int:
    """Images removed by one-per-component over ``n`` nodes and pairs (a, b): n − #components."""
    uf = UnionFind(n)
    uf.union(a, b)
    return int(n - np.count_nonzero(uf.roots() == np.arange(n)))


def choose_subsets(cc: CollisionConfig, n_vectors: int) -> tuple[float, list[float], bool]:
    """(scale, fractions, whole): the fractions scaled so the largest subset holds at most
    ``max_subset_vectors``, and whether the corpus is small enough to be counted whole. The
    vectors searched are N when whole, else about ``fractions[-1]``·N ≤ the cap."""
    scale = min(1.0, cc.max_subset_vectors / max(cc.fractions[-1] * n_vectors, 1))
    return scale, [f * scale for f in cc.fractions], n_vectors <= cc.max_subset_vectors


def _pick(source: Store, cfg: NearDedupConfig, shard: str, offset: int, fraction: float
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """One shard's ids, vectors and key hashes with hash < ``fraction``, and its vector count."""
    sid, keys, x = load_shard_vectors(source, cfg.model_id, shard, offset)
    u = np.fromiter((stable_uniform(cfg.seed, f"subset:{k}") for k in keys), np.float64, len(keys))
    pick = np.flatnonzero(u < fraction)
    return sid[pick], x[pick], u[pick], len(sid)


def _gather_subset(source: Store, cfg: NearDedupConfig, nodes: NodeTable, fraction: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Ids, vectors and key hashes of the vectors with hash < ``fraction``, sorted by hash.

    Shards are read side by side, a window at a time, and taken in order (on an object store
    each read is a round trip of tens of ms: S of them one after the other are hours at 10⁸):
    memory holds the window's shards and the picked rows, which are then moved into the sorted
    array part by part (twice the sample at most, not three times)."""
    ids, xs, us, total = [], [], [], 0
    shards = zip(nodes.shards, (int(o) for o in nodes.offsets[:-1]), strict=False)
    for sid, x, u, n in side_by_side(lambda so: _pick(source, cfg, *so, fraction), shards, GATHER_THREADS,
                                     GATHER_WINDOW):
        ids.append(sid)
        xs.append(x)
        us.append(u)
        total += n
    picked, u = np.concatenate(ids), np.concatenate(us)
    order = np.lexsort((picked, u))
    return picked[order], rows_in_order(xs, order, xs[0].shape[1]), u[order], total


def _rescored(rule: PairScore, x: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Canonical scores of the pairs (src, dst), :data:`SCORE_BATCH` at a time: the rows of
    all pairs at once would be ~24 KB per pair, and the pairs grow with the sample squared."""
    sim = np.empty(len(src), np.float32)
    for lo in range(0, len(src), SCORE_BATCH):
        sel = slice(lo, lo + SCORE_BATCH)
        sim[sel] = rule.scores(x[src[sel]], x[dst[sel]])
    return sim


def collision_models(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str,
                     n_vectors: int, fp: str) -> UnitResult[dict[str, Any]]:
    """Run the subsets, fit per threshold, write table, JSON, plot and pairs; return the
    marker with the JSON as its info (the marker on disk keeps none: the JSON is the report).
    ``shard_table``: SHA-256 of the stage's shard table (tasks/graph/nodes.py)."""
    marker = run_unit(out, JSON_PATH, fp, lambda: _collision_models(
        source, out, cfg, read_shard_table(out, shard_table)[0], n_vectors))
    return dataclasses.replace(marker, info=out.read_json(JSON_PATH))


def _collision_models(source: Store, out: Store, cfg: NearDedupConfig, nodes: NodeTable,
                      n_vectors: int) -> tuple[dict[str, str], dict[str, Any]]:
    cc = cfg.collision
    scale, fractions, whole = choose_subsets(cc, n_vectors)  # whole: the corpus counted beside the prediction
    ids, x, u, total = _gather_subset(source, cfg, nodes, 1.0 if whole else fractions[-1])
    theta_min = cc.thresholds[0]
    n_max = len(ids)
    rule = pair_score_of([m.info for m in require_all_features(source, cfg.model_id, nodes.shards)])
    choice = fx.choose_index(cfg.index, n_max, rule.form_dim(x.shape[1]) if x.ndim == 2 and n_max else 1)
    local = np.arange(n_max, dtype=np.int64)
    a = b = np.zeros(0, np.int64)
    s = np.zeros(0, np.float32)
    if n_max > 1:
        index = fx.new_index(choice, cfg.seed)
        forms = rule.candidate_forms(x)
        fx.train_index(index, forms[: choice.n_train] if choice.kind == "ivf" else forms)
        index.add_with_ids(forms, local)
        floor = theta_min - fx.EXACT_SEARCH_MARGIN - rule.search_slack
        src, dst, _ = fx.search_pairs(index, local, rule.query_forms(x), floor, "range", 0)
        sim = _rescored(rule, x, src, dst)  # the same bytes in any process
        keep = sim >= np.float32(theta_min)
        a, b, s = fx.canonical_pairs(src[keep], dst[keep], sim[keep])
    outputs = {PAIRS_PATH: out.write_parquet(PAIRS_PATH, edge_table(ids[a], ids[b], s))}
    rows = []
    for f in fractions:
        n_sub = int(np.searchsorted(u, f, side="left"))
        inside = b < n_sub
        for theta in cc.thresholds:
            sel = inside & (s > np.float32(theta))
            rows.append({"threshold": theta, "fraction": f, "subset_size": n_sub,
                         "removed": removals(n_sub, a[sel], b[sel])})
    outputs[TABLE_PATH] = out.write_parquet(TABLE_PATH, pa.Table.from_pylist(rows, schema=TABLE_SCHEMA))
    fits = {}
    for theta in cc.thresholds:
        pts = [r for r in rows if r["threshold"] == theta]
        fit = fit_power_law(np.array([r["subset_size"] for r in pts]), np.array([r["removed"] for r in pts]),
                            cc.min_fit_points, cc.min_fit_decades)
        sel = s > np.float32(theta)
        fit["actual_full"] = removals(n_max, a[sel], b[sel]) if whole else None
        fit["predicted_full"], fit["predicted_full_note"] = predict(fit, total, cc.max_extrapolation)
        fit["predicted_target"], fit["predicted_target_note"] = predict(fit, cc.target_size, cc.max_extrapolation)
        fits[f"{theta:g}"] = fit
    result = {"rows": rows, "fits": fits, "full_size": total, "target_size": cc.target_size,
              "fraction_scale": scale, "search": choice.to_json(), "pairs": len(a),
              "lowest_threshold": theta_min, "counted_whole": whole,
              "rules": {"min_fit_points": cc.min_fit_points, "min_fit_decades": cc.min_fit_decades,
                        "max_extrapolation": cc.max_extrapolation}}
    outputs[JSON_PATH] = out.write_json(JSON_PATH, result)
    outputs[PLOT_PATH] = out.write_bytes(PLOT_PATH, collision_plot(rows, fits, total, cc.target_size))
    return outputs, {}


def collision_plot(rows: list[dict], fits: dict[str, dict], full: int, target: int) -> bytes:
    """Log–log plot of removals against subset size, with fitted power laws to ``target``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    plotted = False
    for name, fit in fits.items():
        pts = [(r["subset_size"], r["removed"]) for r in rows if f"{r['threshold']:g}" == name and r["removed"] > 0]
        plotted = plotted or bool(pts)
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=f"θ = {name}")[0]
        if fit["fitted"] and pts:
            # drawn only as far as a prediction is given (see predict)
            reach = [n for n, key in ((full, "predicted_full"), (target, "predicted_target"))
                     if fit.get(key) is not None]
            n = np.geomspace(fit["fit_sizes"][0], max([fit["fit_sizes"][1], *reach]), 50)
            ax.plot(n, fit["A"] * n ** fit["beta"], "-", color=line.get_color(), alpha=0.6)
        if fit.get("actual_full"):
            ax.plot([full], [fit["actual_full"]], "*", ms=10, color=line.get_color())
    ax.axvline(full, color="grey", ls=":", lw=1)
    ax.axvline(target, color="grey", ls="--", lw=1)
    ax.set_xscale("log")
    if plotted:  # a small corpus may have no removal in any subset: nothing to put on a log axis
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no removals in any subset", transform=ax.transAxes, ha="center")
    ax.set_xlabel("Sample size (images)")
    ax.set_ylabel("Images removed")
    ax.set_title("Image collision models: D(N) = A·N^β (★ counted at full size)")
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
