"""Off-centre crop candidates: pairs the similarity graph cannot hold, found by region.

A 70 % crop from a corner keeps half of its original's pixels, so its global descriptor
scores 0.3-0.5 against the original, but its whole frame looks like one *window* of the
original: each picture's whole-frame layout is searched among every other picture's 25 windows
of ``CROP_SIDE`` (``CROP_ANCHORS``), and its best partners go to geometric verification with the
review's pairs (``tasks/graph/verify.py``), which decides. A pair the graph holds is the review's,
so no pair is verified twice by one unit. The score is wfd's layout score of one region each,
stored as 63 float16 DCT coefficients (:meth:`WeightFreeDescriptor.layout_parts`).

Units per staging shard: regions (``work/graph/regions/{shard}.npy``, keyed by the shard's records
and features) and candidates (the shard's frames against every shard's windows, ``WINDOW_BLOCK``
pictures at a time; ``graph/crops/{shard}.parquet``). Every shard's candidates depend on every
picture, so any changed shard recomputes them all; the search is O(N²·25), so the stage runs it
with the flat graph index only. Scores, memory, cost: docs/near-duplicates.md (off-centre crops).
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import pyarrow as pa
from PIL import Image

from corpusforge.contract import UnitResult, read_pinned, run_unit, unit_fingerprint
from corpusforge.layout import feature_keys
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.graph.config import NearDedupConfig
from tasks.graph.edges import IndexInfo, VectorLookup
from tasks.graph.files import CROP_SCHEMA, crops_path, regions_path
from tasks.graph.nodes import load_shard_vectors, read_shard_digests, read_shard_table
from tasks.shared.features.content import picture_content
from tasks.shared.features.decode import DecodeError, decode_rgb
from tasks.shared.features.extract import decode_size, shard_images, stream_shard_images
from tasks.shared.pair_score import PairScore

if TYPE_CHECKING:  # torch comes with the feature models' base class, not with the flow that imports this stage
    from tasks.shared.features.wfd import WeightFreeDescriptor

CROP_SIDE = 0.7
CROP_ANCHORS = (0.0, 0.25, 0.5, 0.75, 1.0)  # a neutral grid (planted crops sit at 0-0.2 and 0.8-1)
WINDOWS = len(CROP_ANCHORS) ** 2
QUERY_BATCH = 256
WINDOW_BLOCK = 1024  # pictures per block: 256 x 1024 x 25 float64 scores, 52 MB


class RegionsInfo(TypedDict):
    shard: str
    pictures: int
    described: int  # pictures with features whose image decoded


class CropsInfo(TypedDict):
    shard: str
    candidates: int  # partners scoring >= crop_floor (<= crop_candidates per picture)
    pairs: int  # of those, pairs the graph does not hold: verified


def _code() -> str:
    return code_version(__name__, "tasks.shared.features.wfd")


@functools.cache
def region_model() -> WeightFreeDescriptor:
    from tasks.shared.features.wfd import WeightFreeDescriptor

    return WeightFreeDescriptor()


@functools.cache
def region_dims() -> tuple[int, int]:
    """(coefficients of even horizontal frequency, all coefficients) of one region."""
    t = region_model().thumb
    even, odd = region_model().layout_parts(np.zeros((1, 1, t, t)))
    return even.shape[-1], even.shape[-1] + odd.shape[-1]


def region_parts(image: Image.Image) -> np.ndarray:
    """float32 [1 + WINDOWS, 63]: the layout coefficients of the picture (without its frame)
    and of its ``CROP_SIDE`` windows, scaled so that a region's score with itself is 1."""
    model = region_model()
    grey = picture_content(image).convert("L")
    grey = grey.reduce(max(1, min(grey.size) // (3 * model.thumb)))  # box-averaged: a window keeps >= 2 thumbs
    w, h = grey.size
    boxes = [(0.0, 0.0, float(w), float(h))]
    for ay in CROP_ANCHORS:
        for ax in CROP_ANCHORS:
            cw, ch = w * CROP_SIDE, h * CROP_SIDE
            x0, y0 = (w - cw) * ax, (h - ch) * ay
            boxes.append((x0, y0, x0 + cw, y0 + ch))
    thumbs = np.stack([np.asarray(grey.resize((model.thumb, model.thumb), Image.Resampling.BILINEAR, box=b),
                                  dtype=np.float64) / 255.0 for b in boxes])
    even, odd = (p[0] for p in model.layout_parts(thumbs[None]))
    norm = ((even * even).sum(axis=1) ** 2 + (odd * odd).sum(axis=1) ** 2) ** 0.25
    return (np.concatenate([even, odd], axis=1) / np.maximum(norm, 1e-12)[:, None]).astype(np.float32)


def best_windows(frames: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """float32 [len(frames), len(windows)]: each frame's ([B, 63]) best layout score among each
    picture's windows ([m, WINDOWS, 63]), in float64 and rounded once."""
    split = region_dims()[0]
    q = np.asarray(frames, dtype=np.float64)
    w = np.asarray(windows, dtype=np.float64).reshape(-1, q.shape[1])
    scores = (q[:, :split] @ w[:, :split].T) ** 2 + (q[:, split:] @ w[:, split:].T) ** 2
    return scores.reshape(len(q), len(windows), -1).max(axis=2).astype(np.float32)


class BestPartners:
    """Each query's ``k`` best partners scoring >= ``floor`` (score descending, then the smaller
    id), merged block by block: the result does not depend on how the pictures are blocked."""

    def __init__(self, query_ids: np.ndarray, k: int, floor: float):
        self.query_ids, self.floor = np.asarray(query_ids, dtype=np.int64), np.float32(floor)
        self.ids = np.full((len(query_ids), k), -1, dtype=np.int64)
        self.scores = np.full((len(query_ids), k), -np.inf, dtype=np.float32)

    def add(self, rows: slice, ids: np.ndarray, scores: np.ndarray) -> None:
        """Scores [len(rows), len(ids)] of the queries ``rows`` against the pictures ``ids``."""
        scores = np.where((scores >= self.floor) & (ids[None, :] != self.query_ids[rows, None]), scores, -np.inf)
        all_ids = np.concatenate([self.ids[rows], np.broadcast_to(ids, scores.shape)], axis=1)
        all_scores = np.concatenate([self.scores[rows], scores], axis=1)
        order = np.lexsort((all_ids, -all_scores))[:, : self.ids.shape[1]]
        self.ids[rows] = np.take_along_axis(all_ids, order, axis=1)
        self.scores[rows] = np.take_along_axis(all_scores, order, axis=1)

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query id, partner id, region score) of every partner found, each unordered pair once
        (the orientation of its better score; ties: the query with the smaller id)."""
        found = np.isfinite(self.scores)
        src = np.broadcast_to(self.query_ids[:, None], found.shape)[found]
        dst, region = self.ids[found], self.scores[found]
        lo, hi = np.minimum(src, dst), np.maximum(src, dst)
        order = np.lexsort((src, -region, hi, lo))
        first = np.ones(len(order), dtype=bool)
        first[1:] = (lo[order][1:] != lo[order][:-1]) | (hi[order][1:] != hi[order][:-1])
        keep = np.sort(order[first])
        return src[keep], dst[keep], region[keep]


def describe_shard(source: Store, out: Store, cfg: NearDedupConfig, shard: str, records: str, features: str
                   ) -> UnitResult[RegionsInfo]:
    """Write the shard's region file (float16 [n, 26, 63], records order; a picture without features
    or that fails to decode gets zeros, which match nothing); ``records``, ``features``: the digests
    of its staging records and of its features of ``cfg.model_id``."""
    fp = unit_fingerprint("graph-regions", _code(), [cfg.model_id], [records, features])

    def compute() -> tuple[dict[str, str], RegionsInfo]:
        expected = [(key, ext) for key, ext, _ in shard_images(source, shard)]
        ok = source.read_parquet(feature_keys(cfg.model_id, shard), columns=["ok"])["ok"].to_pylist()
        parts = np.zeros((len(expected), 1 + WINDOWS, region_dims()[1]), np.float16)
        draft = decode_size([region_model()])
        for row, (_, data, error) in enumerate(stream_shard_images(source, shard, expected)):
            if error is None and ok[row]:
                try:
                    parts[row] = region_parts(decode_rgb(data, draft_size=draft))
                except DecodeError:
                    continue
        sha = out.write_npy(regions_path(shard), parts)
        return {regions_path(shard): sha}, RegionsInfo(shard=shard, pictures=len(expected),
                                                       described=int(parts.any(axis=(1, 2)).sum()))

    return run_unit(out, regions_path(shard), fp, compute)


def _regions(out: Store, shard: str, digest: str) -> np.ndarray:
    return np.load(io.BytesIO(read_pinned(out, regions_path(shard), digest, "the graph stage")), allow_pickle=False)


def crop_candidates_shard(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str, shard: str,
                          regions: str, index: UnitResult[IndexInfo]) -> UnitResult[CropsInfo]:
    """Write the shard's crop candidates (memory: its frames, one block and the per-query best k).
    ``shard_table``, ``regions``: SHA-256 of the stage's shard table and of its list of region file digests."""
    rule = index.info["pair_score"]
    fp = unit_fingerprint("graph-crops", _code(), [cfg.crop_candidates, cfg.crop_floor, cfg.search_min_similarity,
                                                   rule], [shard_table, regions])

    def compute() -> tuple[dict[str, str], CropsInfo]:
        nodes = read_shard_table(out, shard_table)[0]
        digests = read_shard_digests(out, "regions", regions, nodes)
        lo, hi = nodes.span(shard)
        frames = _regions(out, shard, digests[nodes.index_of(shard)])[:, 0]
        best = BestPartners(np.arange(lo, hi), cfg.crop_candidates, cfg.crop_floor)
        for other, digest, start in zip(nodes.shards, digests, nodes.offsets[:-1].tolist(), strict=True):
            windows = _regions(out, other, digest)
            for b in range(0, len(windows), WINDOW_BLOCK):
                block = windows[b:b + WINDOW_BLOCK, 1:]
                ids = start + b + np.arange(len(block), dtype=np.int64)
                for q in range(0, len(frames), QUERY_BATCH):
                    rows = slice(q, q + QUERY_BATCH)
                    best.add(rows, ids, best_windows(frames[rows], block))
        src, dst, region = best.pairs()
        own_ids, _, own = load_shard_vectors(source, cfg.model_id, shard, lo)
        vectors = VectorLookup(source, cfg.model_id, nodes, (nodes.index_of(shard), own_ids, own))
        sim = (PairScore.from_json(rule).scores(vectors.vectors(src), vectors.vectors(dst)) if len(src)
               else np.zeros(0, np.float32))
        fresh = sim < np.float32(cfg.search_min_similarity)  # pairs the graph holds are the review's
        table = pa.table({"src": src[fresh], "dst": dst[fresh], "similarity": sim[fresh], "region": region[fresh]},
                         schema=CROP_SCHEMA)
        return ({crops_path(shard): out.write_parquet(crops_path(shard), table)},
                CropsInfo(shard=shard, candidates=int(len(src)), pairs=int(fresh.sum())))

    return run_unit(out, crops_path(shard), fp, compute)
