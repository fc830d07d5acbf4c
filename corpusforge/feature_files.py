"""Per-shard feature files: how the feature stage writes them and every later stage reads them.

One set of files per (model, staging shard), paths from :mod:`corpusforge.layout`::

    features/{model_id}/vectors/{shard}.npy    float16 (default) array [n_ok, dim], rows in shard order
    features/{model_id}/keys/{shard}.parquet   key, sha256, ok, error for every image of the shard,
                                               in shard order; the npy rows are the ok rows
    _markers/features/{model_id}/vectors/{shard}.npy.json   the unit's marker (stage contract);
                                               ``info``: model fingerprint, count, dim, dtype, random_init
    features/{model_id}/subsets/{subset}/…     the same three files for only the records one consumer
                                               selected (``subset``, e.g. ``stats``); every function
                                               here takes ``subset`` (None: every image of the shard)

Later stages (near-duplicate graph, contamination, reference statistics) read only
through these functions, so the feature stage's internals stay its own.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.contract import (Marker, completed_units, finish_unit, prune, read_marker, remove_tree,
                                  require_marker)
from corpusforge.layout import (FEATURE_KEYS_SCHEMA, FEATURES_DIR, feature_keys, feature_subset_dir, feature_vectors,
                                features_dir)
from corpusforge.storage import Store


def write_shard_features(store: Store, model_id: str, shard: str, keys: Sequence[str], shas: Sequence[str | None],
                         ok: Sequence[bool], errors: Sequence[str | None], features: np.ndarray,
                         fp: str, info: dict[str, Any], subset: str | None = None) -> Marker:
    """Write one shard's features and keys atomically, then the unit's marker; return it."""
    if features.shape[0] != int(np.sum(ok)):
        raise ValueError(f"{features.shape[0]} feature rows for {int(np.sum(ok))} ok records")
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(features), allow_pickle=False)
    table = pa.table({"key": list(keys), "sha256": list(shas), "ok": list(ok), "error": list(errors)},
                     schema=FEATURE_KEYS_SCHEMA)
    vectors, keys_path = feature_vectors(model_id, shard, subset), feature_keys(model_id, shard, subset)
    outputs = {vectors: store.write_bytes(vectors, buf.getvalue()), keys_path: store.write_parquet(keys_path, table)}
    info = {**info, "count": int(features.shape[0]), "dim": int(features.shape[1]) if features.ndim == 2 else 0,
            "dtype": str(features.dtype)}
    return finish_unit(store, vectors, fp, outputs, info)


def feature_marker(store: Store, model_id: str, shard: str, subset: str | None = None) -> Marker | None:
    """The marker of a (model, shard) unit, or None when it never completed."""
    return read_marker(store, feature_vectors(model_id, shard, subset))


def require_features(store: Store, model_id: str, shard: str, subset: str | None = None) -> Marker:
    """The marker of a (model, shard) unit; a clear error when it is missing."""
    return require_marker(store, feature_vectors(model_id, shard, subset),
                          f"features of {model_id}: extract features first (corpusforge extract-features)")


def read_shard_features(store: Store, model_id: str, shard: str, subset: str | None = None
                        ) -> tuple[list[str], np.ndarray]:
    """Keys of the ok records and their features (as stored, usually float16)."""
    table = store.read_parquet(feature_keys(model_id, shard, subset))
    keys = [k for k, ok in zip(table["key"].to_pylist(), table["ok"].to_pylist(), strict=True) if ok]
    with store.open(feature_vectors(model_id, shard, subset)) as f:
        feats = np.load(io.BytesIO(f.read()), allow_pickle=False)
    if feats.shape[0] != len(keys):
        raise ValueError(f"{feature_vectors(model_id, shard, subset)}: {feats.shape[0]} rows for {len(keys)} keys")
    return keys, feats


def read_shard_errors(store: Store, model_id: str, shard: str, subset: str | None = None) -> dict[str, str]:
    """Keys whose image could not be embedded, with the reason."""
    table = store.read_parquet(feature_keys(model_id, shard, subset))
    return {k: e for k, ok, e in zip(table["key"].to_pylist(), table["ok"].to_pylist(),
                                      table["error"].to_pylist(), strict=True) if not ok}


def list_feature_shards(store: Store, model_id: str) -> list[str]:
    """Completed shards of a model, sorted."""
    return completed_units(store, f"{features_dir(model_id)}/vectors", ".npy")


def prune_features(store: Store, models: set[str], shards: list[str]) -> None:
    """Keep exactly the features of ``models`` × ``shards``: folders of other models and files
    of other shards (with their markers) are removed before anything lists them."""
    for name in store.listdir(FEATURES_DIR):
        if name not in models:
            remove_tree(store, features_dir(name))
    for model in models:
        for sub in ("vectors", "keys"):
            prune(store, f"{features_dir(model)}/{sub}", shards)
        for subset in store.listdir(f"{features_dir(model)}/subsets"):
            prune_subset(store, model, subset, shards)


def prune_subset(store: Store, model_id: str, subset: str, shards: list[str]) -> None:
    """Keep a consumer's subset features of exactly ``shards`` (with their markers)."""
    for sub in ("vectors", "keys"):
        prune(store, f"{feature_subset_dir(model_id, subset)}/{sub}", shards)
