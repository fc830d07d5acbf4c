"""A tiny corpus for the near-duplicate graph tests: staging files and planted features.

Every image is a real (tiny, distinct) PNG in a real staging tar, so calibration
thumbnails and SHA-256 checks run on actual bytes. Features are unit vectors in
clusters: each cluster has a base image and variants at chosen similarities, which
plants pairs above 0.9625, between 0.90 and 0.9625, and chains.
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
from PIL import Image

from corpusforge.chunking import cut_name
from corpusforge.feature_files import write_shard_features
from corpusforge.layout import staging_records
from corpusforge.storage import Store
from corpusforge.tarshard import Sample
from tests.staging_files import write_staging_shard


def png(seed: int, size: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def at_similarity(base: np.ndarray, sim: float, rng: np.random.Generator) -> np.ndarray:
    """A unit vector with cosine ``sim`` to the unit vector ``base``."""
    r = rng.standard_normal(base.shape)
    r -= (r @ base) * base
    return unit(sim * base + np.sqrt(1 - sim**2) * unit(r))


def planted_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    """Clusters of 1–7 images around random bases, variants at mixed similarities."""
    rng = np.random.default_rng(seed)
    out = []
    sims = [0.99, 0.97, 0.95, 0.93, 0.91, 0.975, 0.88]
    while len(out) < n:
        base = unit(rng.standard_normal(dim))
        out.append(base)
        for j in range(int(rng.integers(0, 7))):
            anchor = out[-1] if j % 3 == 2 else base  # some variants chain off the previous one
            out.append(at_similarity(anchor, sims[int(rng.integers(0, len(sims)))], rng))
    return np.stack(out[:n]).astype(np.float32)


def write_corpus(root: str, n_shards: int = 3, per_shard: int = 40, dim: int = 32, seed: int = 0,
                 model_id: str = "wfd", vectors: np.ndarray | None = None, failed: set[str] = frozenset(),
                 sha_override: dict[str, str] | None = None, model: dict | None = None
                 ) -> tuple[Store, list[str], dict[str, np.ndarray]]:
    """Write staging records/index/tars with their marker, and features; return the store,
    the shards (in write order) and key → vector. ``model``: the feature model's fingerprint
    in the features' markers (default ``{"id": model_id}``).

    Shards are named as the staging stage names them: by the key hash of their last record
    (:func:`corpusforge.chunking.cut_name`), so sorted order differs from write order.
    """
    store = Store(root)
    n = n_shards * per_shard
    x = planted_vectors(n, dim, seed) if vectors is None else vectors
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(n)  # spread clusters over shards
    sizes = [(8, 8), (12, 8), (8, 12), (16, 16)]
    shards, by_key = [], {}
    for s in range(n_shards):
        recs, samples, keys, shas, ok, errs, feats = [], [], [], [], [], [], []
        for i in range(per_shard):
            g = int(order[s * per_shard + i])
            key = f"img_{g:05d}"
            w, h = sizes[int(rng.integers(0, len(sizes)))]
            data = png(seed * 100003 + g, (w, h))
            sha = (sha_override or {}).get(key, hashlib.sha256(data).hexdigest())
            recs.append({"key": key, "part": 0, "row": g, "sha256": sha, "width": w, "height": h,
                         "source": "test", "caption_type": "short", "ext": "png", "bytes": len(data)})
            samples.append(Sample(key, {"png": data, "txt": b"a caption", "json": b"{}"}))
            keys.append(key)
            shas.append(sha)
            if key in failed:
                ok.append(False)
                errs.append("decode error")
            else:
                ok.append(True)
                errs.append(None)
                feats.append(x[g])
                by_key[key] = x[g]
        shard = cut_name(keys[-1], 1)
        shards.append(shard)
        write_staging_shard(store, shard, recs, samples)
        arr = np.stack(feats).astype(np.float16) if feats else np.zeros((0, x.shape[1]), np.float16)
        write_shard_features(store, model_id, shard, keys, shas, ok, errs, arr, f"test-{seed}-{shard}",
                             {"model": model or {"id": model_id}, "random_init": False})
    return store, shards, by_key


def node_vectors(store, shards, by_key):
    """Node ids of the vectors in ``by_key`` and their rows as the feature files hold them
    (float16), made unit in float64."""
    ids, vecs, offset = [], [], 0
    for shard in sorted(shards):  # node id = rows of the shards before + row in its shard
        keys = store.read_parquet(staging_records(shard))["key"].to_pylist()
        for r, k in enumerate(keys):
            if k in by_key:
                ids.append(offset + r)
                vecs.append(by_key[k])
        offset += len(keys)
    x = np.asarray(vecs, dtype=np.float16).astype(np.float64)
    return np.asarray(ids), x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force_edges(store, shards, by_key, threshold):
    """All pairs >= threshold among every vector, by one numpy product, keyed by node id."""
    ids, x = node_vectors(store, shards, by_key)
    s = x @ x.T
    i, j = np.nonzero(np.triu(s >= threshold, k=1))
    return {(min(ids[a], ids[b]), max(ids[a], ids[b])): s[a, b] for a, b in zip(i, j, strict=True)}
