"""Where per-shard features live and how to read them back.

Layout under the corpus root, one set of files per (model, staging shard)::

    features/{model_id}/{shard}.npy            float16 (default) array [n_ok, dim], rows in shard order
    features/{model_id}/{shard}.keys.parquet   key, ok, error for every image of the staging shard,
                                               in shard order; the npy rows are the ok rows
    features/{model_id}/{shard}.npy.done.json  completion marker, written last: fingerprint
                                               (model id, weights hash, preprocessing, dtype,
                                               code version), count, dim, dtype, random_init

``shard`` is the staging shard's name without extension (``000000``). Later stages
(near-duplicate graph, contamination, reference statistics) read only through
:func:`read_shard_features` and :func:`list_feature_shards`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.storage import Store

KEYS_SCHEMA = pa.schema([("key", pa.string()), ("ok", pa.bool_()), ("error", pa.string())])


def feature_path(model_id: str, shard: str) -> str:
    return f"features/{model_id}/{shard}.npy"


def keys_path(model_id: str, shard: str) -> str:
    return f"features/{model_id}/{shard}.keys.parquet"


def write_shard_features(store: Store, model_id: str, shard: str, keys: Sequence[str],
                         ok: Sequence[bool], errors: Sequence[str | None], features: np.ndarray,
                         marker: dict[str, Any]) -> None:
    """Write one shard's features and keys atomically, then the completion marker."""
    if features.shape[0] != int(np.sum(ok)):
        raise ValueError(f"{features.shape[0]} feature rows for {int(np.sum(ok))} ok records")
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(features), allow_pickle=False)
    store.write_bytes(feature_path(model_id, shard), buf.getvalue())
    table = pa.table({"key": list(keys), "ok": list(ok), "error": list(errors)}, schema=KEYS_SCHEMA)
    store.write_parquet(keys_path(model_id, shard), table)
    store.mark_done(feature_path(model_id, shard), {
        **marker, "count": int(features.shape[0]),
        "dim": int(features.shape[1]) if features.ndim == 2 else 0, "dtype": str(features.dtype),
    })


def read_shard_features(store: Store, model_id: str, shard: str) -> tuple[list[str], np.ndarray]:
    """Keys of the ok records and their features (as stored, usually float16)."""
    table = store.read_parquet(keys_path(model_id, shard))
    keys = [k for k, ok in zip(table["key"].to_pylist(), table["ok"].to_pylist(), strict=True) if ok]
    with store.open(feature_path(model_id, shard)) as f:
        feats = np.load(io.BytesIO(f.read()), allow_pickle=False)
    if feats.shape[0] != len(keys):
        raise ValueError(f"features/{model_id}/{shard}: {feats.shape[0]} rows for {len(keys)} keys")
    return keys, feats


def read_shard_errors(store: Store, model_id: str, shard: str) -> dict[str, str]:
    """Keys whose image could not be embedded, with the reason."""
    table = store.read_parquet(keys_path(model_id, shard))
    return {k: e for k, ok, e in zip(table["key"].to_pylist(), table["ok"].to_pylist(),
                                      table["error"].to_pylist(), strict=True) if not ok}


def list_feature_shards(store: Store, model_id: str) -> list[str]:
    """Completed shards of a model, sorted."""
    return store.completed(f"features/{model_id}", "npy")
