"""Geometric verification of review-band pairs (weight-free).

A global descriptor scores greyscale copies, rotations, caption bars and heavy crops
below the graph threshold although the two images share most of their pixels up to a
simple transform. Local features see that: ORB keypoints, mutual ratio-test matches and a
RANSAC similarity transform; then the pixels under that transform decide, because inliers
alone do not separate copies from unrelated posters set in one typeface. The criteria
(overlap, agreement, agreeing tiles, parallax, the colourless floor and its waiver, the
mirrored try), their thresholds and the evidence behind them: docs/near-duplicates.md.

Deterministic: ORB has no randomness; RANSAC draws from OpenCV's global RNG, which is
reseeded (``cv2.setRNGSeed(seed)``) before every pair, with OpenCV on one thread, so a
pair's result never depends on which pairs ran before it, on the worker or on the run.

The stage unit (one per owner shard) verifies the shard's review pairs (:mod:`tasks.graph.review`),
then its off-centre crop candidates (:mod:`tasks.graph.crops`), and writes
``graph/verified/{shard}.parquet`` (:data:`tasks.graph.files.VERIFIED_SCHEMA`). A row whose two
SHA-256s, floor similarity and verification settings are unchanged is copied from the previous file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image

from corpusforge.contract import UnitResult, read_marker, run_unit, unit_fingerprint
from corpusforge.layout import staging_index, staging_tar
from tasks.graph.files import VERIFIED_SCHEMA, crops_path, review_path, verified_path
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.shared.features.decode import DecodeError, decode_rgb
from tasks.graph.config import (LOWE_RATIO, ORB_FAST_THRESHOLD, ORB_FEATURES, RANSAC_ITERS, RANSAC_PX, RANSAC_SEED,
                                VERIFY_MAX_SIDE, NearDedupConfig, VerificationConfig)
from tasks.graph.nodes import NodeTable, read_shard_table, records_path


def _cv2():
    import cv2

    cv2.setNumThreads(1)
    return cv2


LocalFeatures = tuple[np.ndarray, "np.ndarray | None", np.ndarray, bool]
TILES = 4          # agreement: the overlap is cut into TILES x TILES tiles
FINE_TILES = 8     # agreeing: the share of FINE_TILES x FINE_TILES tiles that agree
TILE_AGREES = 0.5  # NCC of an agreeing tile
TILE_MIN_STD = 2.0  # grey levels: a tile flatter than this in either image has no say
# parallax: a fine tile fully inside the overlap is searched within PARALLAX_PX pixels of where the
# transform puts it; it "agrees only shifted" when its best match, at least TILE_AGREES, lies
# PARALLAX_SHIFT px or more away and beats the aligned correlation by PARALLAX_GAIN
PARALLAX_PX = 4
PARALLAX_SHIFT = 2.0
PARALLAX_GAIN = 0.1
# colourless: fewer than COLOURED_SHARE of the pixels have a channel spread above
# CHROMA_LEVELS (the JPEG chroma noise of a greyscale copy stays below it)
CHROMA_LEVELS = 24
COLOURED_SHARE = 0.01
CACHED_IMAGES = 2048  # local features kept per unit: about 0.6 GB at VERIFY_MAX_SIDE 512
CACHED_INDEXES = 16  # staging indexes kept per unit: a few MB each at 10,000 images per shard
RESULT_FIELDS = ("keypoints", "matches", "inliers", "score", "overlap", "agreement", "agreeing", "parallax",
                 "colourless", "verified", "mirrored")


ORB_BORDER = 31  # OpenCV's default edgeThreshold: no keypoint this close to an edge


def local_features(image: Image.Image) -> LocalFeatures:
    """ORB keypoint coordinates [n, 2] (float32), descriptors [n, 32], the grey image (uint8)
    and whether the picture is colourless (:func:`is_colourless`)."""
    grey = image.convert("L")
    scale = VERIFY_MAX_SIDE / max(grey.size)
    if scale < 1:
        size = (max(1, round(grey.width * scale)), max(1, round(grey.height * scale)))
        grey, image = grey.resize(size, Image.Resampling.BILINEAR), image.resize(size, Image.Resampling.BILINEAR)
    pixels = np.asarray(grey, dtype=np.uint8)
    return (*_keypoints(pixels), pixels, is_colourless(np.asarray(image.convert("RGB"), dtype=np.uint8)))


def mirrored(features: LocalFeatures) -> LocalFeatures:
    """The local features of the same picture mirrored left to right (ORB run on the flipped pixels)."""
    pixels = np.ascontiguousarray(features[2][:, ::-1])
    return (*_keypoints(pixels), pixels, features[3])


def _keypoints(pixels: np.ndarray) -> tuple[np.ndarray, "np.ndarray | None"]:
    cv2 = _cv2()
    points, desc = (), None  # ORB finds nothing within its 31 px border, and its pyramid fails on tiny images
    if min(pixels.shape) > 2 * ORB_BORDER:
        orb = cv2.ORB_create(nfeatures=ORB_FEATURES, fastThreshold=ORB_FAST_THRESHOLD, edgeThreshold=ORB_BORDER)
        points, desc = orb.detectAndCompute(pixels, None)
    return np.array([p.pt for p in points], dtype=np.float32).reshape(-1, 2), desc


def is_colourless(rgb: np.ndarray) -> bool:
    """True when fewer than ``COLOURED_SHARE`` of the pixels ([h, w, 3] uint8) have channels
    further apart than ``CHROMA_LEVELS``: a greyscale picture, also after JPEG."""
    spread = rgb.max(axis=2).astype(np.int16) - rgb.min(axis=2).astype(np.int16)
    return bool((spread > CHROMA_LEVELS).mean() < COLOURED_SHARE)


def aligned_agreement(transform: np.ndarray, grey_a: np.ndarray, grey_b: np.ndarray
                      ) -> tuple[float, float, float, float]:
    """(overlap, agreement, agreeing, parallax) of A warped onto B by ``transform`` (2 x 3, A's pixels to B's).

    overlap: pixels of B covered by A over the smaller picture's area (A's area scaled by the transform);
    agreement: median NCC of the textured ``TILES`` grid tiles over the overlap's bounding box; agreeing:
    the share of the textured ``FINE_TILES`` tiles with NCC >= ``TILE_AGREES`` (both 0 when none is textured)."""
    cv2 = _cv2()
    h, w = grey_b.shape
    warped = cv2.warpAffine(grey_a.astype(np.float32), transform, (w, h), flags=cv2.INTER_LINEAR)
    cover = cv2.warpAffine(np.ones(grey_a.shape, np.uint8), transform, (w, h), flags=cv2.INTER_NEAREST)
    scale2 = float(transform[0, 0] ** 2 + transform[1, 0] ** 2)
    overlap = float(cover.sum()) / max(1.0, min(h * w, grey_a.size * scale2))
    inside = cv2.erode(cover, np.ones((5, 5), np.uint8)) > 0  # no interpolated border pixels
    if inside.sum() < 100:
        return min(overlap, 1.0), 0.0, 0.0, 0.0
    ys, xs = np.nonzero(inside)
    box = (int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1)
    target = grey_b.astype(np.float32)
    coarse = _tile_correlations(warped, target, inside, box, TILES)
    fine = _tile_correlations(warped, target, inside, box, FINE_TILES)
    agreeing = float(np.mean(np.asarray(fine) >= TILE_AGREES)) if fine else 0.0
    parallax = _parallax(warped, target, inside, box)
    return min(overlap, 1.0), float(np.median(coarse)) if coarse else 0.0, agreeing, parallax


def _parallax(warped: np.ndarray, target: np.ndarray, inside: np.ndarray, box: tuple[int, int, int, int]) -> float:
    """The share of the fine grid's agreeing tiles that agree only shifted (the ``PARALLAX_*`` constants;
    0 when no tile qualifies). A copy is one planar transform of its original, so once aligned every
    tile agrees where it is put; two viewpoints of a 3-D scene align on one depth and differ by parallax."""
    cv2 = _cv2()
    r = PARALLAX_PX
    agree = shifted = 0
    for ys, xs in _tiles(box, FINE_TILES):
        if min(ys.stop - ys.start, xs.stop - xs.start) < 4 * r or not inside[ys, xs].all():
            continue
        template = warped[ys.start + r:ys.stop - r, xs.start + r:xs.stop - r]
        if template.std() < TILE_MIN_STD or target[ys, xs].std() < TILE_MIN_STD:
            continue
        scores = cv2.matchTemplate(target[ys, xs], template, cv2.TM_CCOEFF_NORMED)
        dy, dx = np.unravel_index(int(np.argmax(scores)), scores.shape)
        best = float(scores[dy, dx])
        if best < TILE_AGREES:
            continue
        agree += 1
        shifted += bool(np.hypot(dx - r, dy - r) >= PARALLAX_SHIFT and best - float(scores[r, r]) >= PARALLAX_GAIN)
    return shifted / agree if agree else 0.0


def _tiles(box: tuple[int, int, int, int], n: int) -> Iterator[tuple[slice, slice]]:
    """(rows, columns) of each tile of an ``n`` x ``n`` grid over ``box`` (y0, y1, x0, x1), row by row."""
    y0, y1, x0, x1 = box
    for ty in range(n):
        for tx in range(n):
            yield (slice(y0 + (y1 - y0) * ty // n, y0 + (y1 - y0) * (ty + 1) // n),
                   slice(x0 + (x1 - x0) * tx // n, x0 + (x1 - x0) * (tx + 1) // n))


def _tile_correlations(warped: np.ndarray, target: np.ndarray, inside: np.ndarray, box: tuple[int, int, int, int],
                       n: int) -> list[float]:
    """NCC of each textured tile of an ``n`` x ``n`` grid over ``box`` (y0, y1, x0, x1), inside pixels only."""
    scores = []
    for tile in _tiles(box, n):
        m = inside[tile]
        if m.sum() < 50:
            continue
        a, b = warped[tile][m].astype(np.float64), target[tile][m].astype(np.float64)
        a, b = a - a.mean(), b - b.mean()
        if a.std() < TILE_MIN_STD or b.std() < TILE_MIN_STD:
            continue
        scores.append(float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum())))
    return scores


def verify_pair(a: LocalFeatures, b: LocalFeatures, cfg: VerificationConfig, similarity: float) -> dict[str, Any]:
    """Matches, RANSAC inliers, overlap, agreement, agreeing, score and verdict for two images'
    local features; ``similarity``: the pair's global similarity (the floor for colourless pictures)."""
    cv2 = _cv2()
    (xa, da, ga, ca), (xb, db, gb, cb) = a, b
    out = {"keypoints": int(min(len(xa), len(xb))), "matches": 0, "inliers": 0, "score": 0.0, "overlap": 0.0,
           "agreement": 0.0, "agreeing": 0.0, "parallax": 0.0, "colourless": bool(ca or cb), "verified": False}
    if da is None or db is None or len(xa) < 2 or len(xb) < 2:
        return out
    matcher = cv2.BFMatcher(cv2.NORM_HAMMING)
    back = {m[0].queryIdx: m[0].trainIdx for m in matcher.knnMatch(db, da, k=1) if m}
    # ratio test, then mutual best matches only: one keypoint never supports many matches
    good = [m[0] for m in matcher.knnMatch(da, db, k=2)
            if len(m) == 2 and m[0].distance < LOWE_RATIO * m[1].distance and back.get(m[0].trainIdx) == m[0].queryIdx]
    out["matches"] = len(good)
    if len(good) < max(3, cfg.min_inliers):
        return out
    src = xa[[m.queryIdx for m in good]]
    dst = xb[[m.trainIdx for m in good]]
    cv2.setRNGSeed(RANSAC_SEED)
    transform, mask = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC, ransacReprojThreshold=RANSAC_PX,
                                                  maxIters=RANSAC_ITERS, confidence=0.999, refineIters=10)
    inliers = int(mask.sum()) if mask is not None else 0
    out["inliers"] = inliers
    out["score"] = float(np.float32(inliers / max(1, out["keypoints"])))
    if transform is None or inliers < cfg.min_inliers:
        return out
    # similarity transform [[s cos, -s sin, tx], [s sin, s cos, ty]]
    out["angle"] = float(np.degrees(np.arctan2(transform[1, 0], transform[0, 0])))
    out["scale"] = float(np.hypot(transform[0, 0], transform[1, 0]))
    overlap, agreement, agreeing, parallax = aligned_agreement(transform, ga, gb)
    out["overlap"], out["agreement"] = float(np.float32(overlap)), float(np.float32(agreement))
    out["agreeing"], out["parallax"] = float(np.float32(agreeing)), float(np.float32(parallax))
    out["verified"] = bool(overlap >= cfg.min_overlap and agreement >= cfg.min_agreement
                           and agreeing >= cfg.min_agreeing_tiles and parallax <= cfg.max_parallax
                           and colour_ok(out, cfg, similarity))
    return out


def colour_ok(result: dict[str, Any], cfg: VerificationConfig, similarity: float) -> bool:
    """The colourless floor: a pair with colour on both sides passes; without, its global
    similarity must exceed ``colourless_min_similarity`` unless its pixels agree near-perfectly
    (median ``agreement`` and ``agreeing`` share at or above the waiver's bars: an aligned copy)."""
    waived = (result["agreement"] >= cfg.colourless_waiver_agreement
              and result["agreeing"] >= cfg.colourless_waiver_agreeing)
    return not result["colourless"] or similarity > cfg.colourless_min_similarity or waived


def verify_with_mirror(a: LocalFeatures, b: LocalFeatures, b_mirrored: Callable[[], LocalFeatures] | None,
                       cfg: VerificationConfig, similarity: float) -> dict[str, Any]:
    """:func:`verify_pair`, and when that fails and ``b_mirrored`` is given (a model that is not
    flip-symmetric), once more against B mirrored: the first verdict that passes, else the plain
    try's evidence; ``mirrored`` says which."""
    plain = verify_pair(a, b, cfg, similarity)
    if plain["verified"] or b_mirrored is None:
        return {**plain, "mirrored": False}
    flipped = verify_pair(a, b_mirrored(), cfg, similarity)
    return {**flipped, "mirrored": True} if flipped["verified"] else {**plain, "mirrored": False}


def floor_similarity(similarity: float, region: float | None) -> float:
    """What a pair's colourless floor is judged on: its global similarity, or for an off-centre
    crop candidate (tasks/graph/crops.py) the better of that and the region score that found it
    (a greyscale original's corner crop scores low globally for the same reason any corner crop does)."""
    return similarity if region is None else max(similarity, region)


def settings_fingerprint(cfg: VerificationConfig, mirror: bool) -> str:
    """What a pair's verdict depends on besides the two images' bytes (``mirror``: review pairs
    get the mirrored try, :attr:`NearDedupConfig.mirroring`)."""
    fields = {k: v for k, v in cfg.recorded().items() if k not in {"mode", "review_low", "review_k"}}
    return unit_fingerprint("verify-pair", code_version(__name__), [fields, mirror], [])


class _Images:
    """Ranged reads of staged images by key, their local features kept for the
    ``CACHED_IMAGES`` most recently used: a unit's pairs reach images all over the corpus,
    and each entry holds the grey picture (up to ``VERIFY_MAX_SIDE``² bytes, 0.26 MB at 512), so
    an unbounded cache would grow with the shard. An evicted image is decoded again when
    a later pair needs it (same bytes, same features). The staging indexes that locate the
    images are kept the same way, for the ``CACHED_INDEXES`` most recently used shards:
    at 8,000 shards a unit's pairs can reach thousands of them."""

    def __init__(self, source: Store, nodes: NodeTable):
        self.source, self.nodes = source, nodes
        self._index: OrderedDict[str, dict[int, dict[str, Any]]] = OrderedDict()
        self._feats: OrderedDict[tuple[int, bool], LocalFeatures] = OrderedDict()

    def row(self, node: int) -> tuple[str, int]:
        s = int(self.nodes.shard_of(np.array([node]))[0])
        return self.nodes.shards[s], node - int(self.nodes.offsets[s])

    def features(self, node: int, flipped: bool = False) -> LocalFeatures:
        """The node's local features, or (``flipped``) those of its mirror image."""
        if (node, flipped) in self._feats:
            self._feats.move_to_end((node, flipped))
        elif flipped:
            self._feats[(node, True)] = mirrored(self.features(node))
        else:
            shard, row = self.row(node)
            entry = self._shard_index(shard)[row]
            data = self.source.read_range(staging_tar(shard), entry["offset"], entry["size"])
            try:
                image = decode_rgb(data, draft_size=VERIFY_MAX_SIDE)
            except DecodeError:
                image = Image.new("RGB", (1, 1))
            self._feats[(node, False)] = local_features(image)
        if len(self._feats) > CACHED_IMAGES:
            self._feats.popitem(last=False)
        return self._feats[(node, flipped)]

    def _shard_index(self, shard: str) -> dict[int, dict[str, Any]]:
        """Row in the shard's records -> its image's staging index entry (offset, size)."""
        if shard in self._index:
            self._index.move_to_end(shard)
        else:
            keys = self.source.read_parquet(records_path(shard), columns=["key"])["key"].to_pylist()
            index = self.source.read_parquet(staging_index(shard)).to_pylist()
            by_key = {r["key"]: r for r in index if r["ext"] not in ("txt", "json")}
            self._index[shard] = {i: by_key[k] for i, k in enumerate(keys)}
            if len(self._index) > CACHED_INDEXES:
                self._index.popitem(last=False)
        return self._index[shard]


def records_fingerprint(records_digests: dict[str, str]) -> str:
    """One digest of every staging shard's records file: a verified pair reads images of any shard."""
    return unit_fingerprint("graph-verify-records", "", [], sorted(records_digests.items()))


def verify_shard(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str, shard: str,
                 review_digest: str, records: str, crops_digest: str | None = None) -> UnitResult:
    """Verify the review pairs owned by ``shard`` and, with ``crops_digest`` (the SHA-256 of
    its crop candidates file), the shard's off-centre crop candidates (one unit); returns the
    marker. ``records``: :func:`records_fingerprint` of the corpus."""
    settings = settings_fingerprint(cfg.verification, cfg.mirroring)
    fp = unit_fingerprint("graph-verify", code_version(__name__), [settings], [review_digest, records, crops_digest])
    return run_unit(out, verified_path(shard), fp,
                    lambda: _verify(source, out, cfg, read_shard_table(out, shard_table)[0], shard,
                                    crops_digest is not None))


def _previous(out: Store, shard: str, settings: str) -> dict[tuple[str, str, float, bool], dict[str, Any]]:
    """Rows of the last verification of this shard made with the same settings, by SHA pair, the
    similarity its colourless floor was judged on (:func:`floor_similarity`) and whether it was a
    crop candidate (which gets no mirrored try): what a verdict depends on besides the settings,
    so a pair whose score or kind moved (a crop candidate's region, a feature model's new scores)
    is verified again, as a fresh build would."""
    path = verified_path(shard)
    marker = read_marker(out, path)
    if (marker is None or marker.info.get("settings") != settings or not out.exists(path)
            or out.sha256(path) != marker.outputs.get(path)):
        return {}
    rows = out.read_parquet(verified_path(shard)).to_pylist()
    return {(r["sha_a"], r["sha_b"], floor_similarity(r["similarity"], r["region"]), r["region"] is not None): r
            for r in rows}


def _verify(source: Store, out: Store, cfg: NearDedupConfig, nodes: NodeTable, shard: str, crops: bool
            ) -> tuple[dict[str, str], dict[str, Any]]:
    vc = cfg.verification
    settings = settings_fingerprint(vc, cfg.mirroring)
    previous = _previous(out, shard, settings)
    pairs = out.read_parquet(review_path(shard)).to_pydict()
    pairs["region"] = [None] * len(pairs["src"])
    if crops:  # after the review's pairs, which it never repeats (tasks/graph/crops.py)
        for name, values in out.read_parquet(crops_path(shard)).to_pydict().items():
            pairs[name] += values
    images = _Images(source, nodes)
    meta: dict[str, tuple[list[str], list[str]]] = {}

    def key_sha(node: int) -> tuple[str, str]:
        s, row = images.row(node)
        if s not in meta:
            t = source.read_parquet(records_path(s), columns=["key", "sha256"])
            meta[s] = (t["key"].to_pylist(), t["sha256"].to_pylist())
        return meta[s][0][row], meta[s][1][row]

    rows = []
    for a, b, s, region in zip(pairs["src"], pairs["dst"], pairs["similarity"], pairs["region"], strict=True):
        (ka, ha), (kb, hb) = key_sha(a), key_sha(b)
        old = previous.get((ha, hb, floor_similarity(s, region), region is not None))
        if old is not None:
            result = {k: old[k] for k in RESULT_FIELDS}
        else:
            mirror = cfg.mirroring and region is None  # the model's own band: not flip-symmetric
            result = verify_with_mirror(images.features(a), images.features(b),
                                        (lambda b=b: images.features(b, flipped=True)) if mirror else None,
                                        vc, floor_similarity(s, region))
            result = {k: result[k] for k in RESULT_FIELDS}
        rows.append({"src": a, "dst": b, "key_a": ka, "key_b": kb, "sha_a": ha, "sha_b": hb, "similarity": s,
                     **result, "region": region})
    table = pa.Table.from_pylist(rows, schema=VERIFIED_SCHEMA)
    outputs = {verified_path(shard): out.write_parquet(verified_path(shard), table)}
    return outputs, {"settings": settings, "pairs": len(rows), "verified": int(sum(r["verified"] for r in rows)),
                     "mirrored": int(sum(r["verified"] and r["mirrored"] for r in rows))}


def iter_verified(out: Store, nodes: NodeTable):
    """(src, dst, crop, mirrored) of verified pairs, one shard at a time: global ids, whether the
    pair was an off-centre crop candidate and whether it passed as a mirror image."""
    for shard in nodes.shards:
        t = out.read_parquet(verified_path(shard), columns=["src", "dst", "verified", "region", "mirrored"])
        ok = t["verified"].to_numpy(zero_copy_only=False)
        crop = t["region"].is_valid().to_numpy(zero_copy_only=False)
        flip = t["mirrored"].to_numpy(zero_copy_only=False)
        yield (t["src"].to_numpy()[ok].astype(np.int64), t["dst"].to_numpy()[ok].astype(np.int64), crop[ok],
               flip[ok])

