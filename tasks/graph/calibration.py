"""Calibration sheets (GPIC Fig. 5): image pairs per similarity bin, for a person to judge.

GPIC calibrated its thresholds by looking at nearest-neighbour pairs across similarity
ranges. ``graph/calibration/index.html`` is one self-contained page: per bin
([0.75, 0.85) … [0.999, 1]) a deterministic sample of pairs side by side, with the
score, both keys and resolutions, and which rule would act on the pair; thumbnails
and a histogram of similarities are embedded as data URIs, so the page can be mailed.

Where pairs come from: bins at or above the graph threshold sample the graph's edge
files; lower bins sample the collision model's pairs (its range search on the largest
subset at the lowest θ, ``graph/collision/pairs.parquet``) — the graph itself holds no
pair below its threshold. A bin with no source is shown as such.

Sampling is a seeded 64-bit hash of the pair's node ids; each bin keeps the pairs with
the smallest hashes, so the choice does not depend on file order and grows stably
with ``pairs_per_bin``.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from PIL import Image, ImageOps

from corpusforge.contract import UnitResult, run_unit
from corpusforge.html import render
from corpusforge.layout import staging_index, staging_tar
from corpusforge.storage import Store
from tasks.graph.calibration_report import png_uri, thumb
from tasks.graph.collision import PAIRS_PATH
from tasks.graph.config import NearDedupConfig
from tasks.graph.edges import iter_edges
from tasks.graph.nodes import NodeTable, read_shard_table, records_path

PAGE_PATH = "graph/calibration/index.html"
HIST_BINS = np.linspace(0.70, 1.0, 61)


def pair_hash(a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64 of (a, b, seed): a well-mixed uint64 per pair, vectorised."""
    with np.errstate(over="ignore"):
        salt = np.uint64(seed & (2**64 - 1))
        z = (a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (b.astype(np.uint64) + salt)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _in_bin(s: np.ndarray, lo: float, hi: float, last: bool) -> np.ndarray:
    """[lo, hi); the last bin is closed and also takes scores float error put above 1."""
    upper = (s <= np.float32(hi)) | (s > 1) if last else s < np.float32(hi)
    return (s >= np.float32(lo)) & upper


class BinSampler:
    """Keeps, per bin, the ``n`` pairs with the smallest hashes seen so far."""

    def __init__(self, bins: list[tuple[float, float]], n: int, seed: int):
        self.bins, self.n, self.seed = bins, n, seed
        self.kept = [(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))] * len(bins)
        self.seen = [0] * len(bins)

    def add(self, which: list[int], a: np.ndarray, b: np.ndarray, s: np.ndarray) -> None:
        for i in which:
            lo, hi = self.bins[i]
            m = _in_bin(s, lo, hi, i == len(self.bins) - 1)
            self.seen[i] += int(m.sum())
            ka, kb, ks = self.kept[i]
            ca, cb, cs = np.concatenate([ka, a[m]]), np.concatenate([kb, b[m]]), np.concatenate([ks, s[m]])
            order = np.lexsort((cb, ca, pair_hash(ca, cb, self.seed)))[: self.n]
            self.kept[i] = (ca[order], cb[order], cs[order])


def _thumb(data: bytes, px: int) -> str:
    with Image.open(io.BytesIO(data)) as im:
        return thumb(ImageOps.exif_transpose(im), px)


def _image_facts(source: Store, nodes: NodeTable, ids: np.ndarray, px: int) -> dict[int, dict[str, Any]]:
    """Key, resolution and thumbnail (or the error) of each node, one shard at a time."""
    facts: dict[int, dict[str, Any]] = {}
    owner = nodes.shard_of(ids)
    for s in np.unique(owner):
        shard = nodes.shards[s]
        rec = source.read_parquet(records_path(shard), columns=["key", "width", "height"]).to_pylist()
        idx = {r["key"]: r for r in source.read_parquet(staging_index(shard)).to_pylist()
               if r["ext"] not in ("txt", "json")}
        for node in ids[owner == s].tolist():
            r = rec[node - int(nodes.offsets[s])]
            fact = {"key": r["key"], "width": r["width"], "height": r["height"], "thumb": None, "error": None}
            try:
                m = idx[r["key"]]
                fact["thumb"] = _thumb(source.read_range(staging_tar(shard), m["offset"], m["size"]), px)
            except (KeyError, OSError, ValueError) as e:  # one bad image must not sink the sheet
                fact["error"] = f"{type(e).__name__}: {e}"
            facts[node] = fact
    return facts


def _histogram_png(graph_counts: np.ndarray, pair_counts: np.ndarray | None, graph_threshold: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3), dpi=100)
    ax.stairs(graph_counts, HIST_BINS, label=f"graph edges (>= {graph_threshold:g})", fill=True, alpha=0.6)
    if pair_counts is not None:
        ax.stairs(pair_counts, HIST_BINS, label="collision subset pairs")
    ax.set_yscale("symlog")
    ax.set_xlabel("similarity")
    ax.set_ylabel("pairs")
    ax.legend(fontsize=8)
    return png_uri(fig)


def _rule(s: float, cfg: NearDedupConfig) -> str:
    if s > np.float32(cfg.pair_removal_above):
        return "tier 1: lower resolution removed"
    if s > np.float32(cfg.component_link_above):
        return f"candidate edge: removed only in components >= {cfg.min_component_size}"
    return "below the candidate threshold: no action"


def calibration_sheet(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str,
                      fp: str) -> UnitResult[dict[str, Any]]:
    """Sample the pairs, render ``graph/calibration/index.html``; per-bin counts in ``info``.
    ``shard_table``: SHA-256 of the stage's shard table (tasks/graph/nodes.py)."""
    return run_unit(out, PAGE_PATH, fp, lambda: _calibration_sheet(
        source, out, cfg, read_shard_table(out, shard_table)[0]))


def _calibration_sheet(source: Store, out: Store, cfg: NearDedupConfig, nodes: NodeTable
                       ) -> tuple[dict[str, str], dict[str, Any]]:
    cal = cfg.calibration
    bins = [tuple(b) for b in cal.bins]
    sampler = BinSampler(bins, cal.pairs_per_bin, cfg.seed)
    from_graph = [i for i, (lo, _) in enumerate(bins) if lo >= cfg.edge_min_similarity]
    from_pairs = [i for i in range(len(bins)) if i not in from_graph]
    graph_counts = np.zeros(len(HIST_BINS) - 1, dtype=np.int64)
    for a, b, s in iter_edges(out, nodes):
        graph_counts += np.histogram(np.clip(s, 0, 1), HIST_BINS)[0]
        sampler.add(from_graph, a, b, s)
    pair_counts = None
    has_pairs = out.exists(PAIRS_PATH)
    if has_pairs:
        pair_counts = np.zeros(len(HIST_BINS) - 1, dtype=np.int64)
        with out.open(PAIRS_PATH) as f:  # a batch at a time: the subset's pairs grow with its size
            for t in pq.ParquetFile(f).iter_batches(columns=["src", "dst", "similarity"]):
                a, b, s = (t.column(c).to_numpy() for c in ("src", "dst", "similarity"))
                pair_counts += np.histogram(np.clip(s, 0, 1), HIST_BINS)[0]
                sampler.add(from_pairs, a, b, s)
    chosen = np.unique(np.concatenate([np.concatenate([k[0], k[1]]) for k in sampler.kept]))
    facts = _image_facts(source, nodes, chosen, cal.thumb_px)
    sections, counts = [], []
    for i, (lo, hi) in enumerate(bins):
        last = i == len(bins) - 1
        label = f"[{lo:g}, {hi:g}{']' if last else ')'}"
        src = "graph edges" if i in from_graph else ("collision subset pairs" if has_pairs else None)
        ka, kb, ks = sampler.kept[i]
        counts.append({"bin": label, "source": src, "available": sampler.seen[i], "shown": int(len(ka))})
        pairs = [{"a": facts[int(x)], "b": facts[int(y)], "score": float(s), "rule": _rule(float(s), cfg)}
                 for x, y, s in zip(ka, kb, ks, strict=True)]
        note = (f"{len(ka)} of {sampler.seen[i]} pairs from {src}" if src else
                "no pairs: below the graph threshold and no collision pairs")
        sections.append({"label": label, "note": note, "pairs": pairs})
    hist = _histogram_png(graph_counts, pair_counts, cfg.edge_min_similarity)
    page = render("calibration.html", title=f"Near-duplicate calibration ({cfg.model_id})", model=cfg.model_id,
                  hist=hist, sections=sections, ct=cfg.component_link_above, pt=cfg.pair_removal_above,
                  m=cfg.min_component_size)
    sha = out.write_bytes(PAGE_PATH, page.encode("utf-8"))
    summary = {"bins": counts, "images": int(len(chosen)),
               "missing_images": sum(1 for f in facts.values() if f["thumb"] is None)}
    return {PAGE_PATH: sha}, summary
