"""Per-shard feature files: how the feature stage writes them and every later stage reads them.

One set of files per (model, staging shard), paths from :mod:`corpusforge.layout` (the tree is in
docs/architecture.md, "Output layout"): the vectors (float16 by default, [n_ok, dim], the ok rows
in shard order), the keys (key, sha256, ok, error of every image) and the marker, whose ``info``
holds the model fingerprint, count, dim, dtype and random_init. A consumer's ``subset`` (e.g.
``stats``) has the same files for only the records it selected; every function here takes it
(None: every image of the shard).

Later stages (near-duplicate graph, contamination, reference statistics) read only
through these functions, so the feature stage's internals stay its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.contract import (Marker, completed_units, finish_unit, prune, read_marker, remove_tree,
                                  require_marker, require_markers)
from corpusforge.layout import (FEATURE_KEYS_SCHEMA, FEATURES_DIR, feature_keys, feature_subset_dir, feature_vectors,
                                features_dir)
from corpusforge.storage import Store


def write_shard_features(store: Store, model_id: str, shard: str, keys: Sequence[str], shas: Sequence[str | None],
                         ok: Sequence[bool], errors: Sequence[str | None], features: np.ndarray,
                         fp: str, info: dict[str, Any], subset: str | None = None) -> Marker:
    """Write one shard's features and keys atomically, then the unit's marker; return it."""
    if features.shape[0] != int(np.sum(ok)):
        raise ValueError(f"{features.shape[0]} feature rows for {int(np.sum(ok))} ok records")
    table = pa.table({"key": list(keys), "sha256": list(shas), "ok": list(ok), "error": list(errors)},
                     schema=FEATURE_KEYS_SCHEMA)
    vectors, keys_path = feature_vectors(model_id, shard, subset), feature_keys(model_id, shard, subset)
    outputs = {vectors: store.write_npy(vectors, features), keys_path: store.write_parquet(keys_path, table)}
    info = {**info, "count": int(features.shape[0]), "dim": int(features.shape[1]) if features.ndim == 2 else 0,
            "dtype": str(features.dtype)}
    return finish_unit(store, vectors, fp, outputs, info)


def feature_marker(store: Store, model_id: str, shard: str, subset: str | None = None) -> Marker | None:
    """The marker of a (model, shard) unit, or None when it never completed."""
    return read_marker(store, feature_vectors(model_id, shard, subset))


def require_features(store: Store, model_id: str, shard: str, subset: str | None = None) -> Marker:
    """The marker of a (model, shard) unit; a clear error when it is missing."""
    return require_marker(store, feature_vectors(model_id, shard, subset), _missing(model_id))


def require_all_features(store: Store, model_id: str, shards: Iterable[str]) -> Iterator[Marker]:
    """:func:`require_features` of each shard, in order, the markers read side by side
    (:func:`corpusforge.contract.require_markers`): S serial round trips on S3 are hours."""
    return require_markers(store, (feature_vectors(model_id, shard) for shard in shards), _missing(model_id))


def _missing(model_id: str) -> str:
    return f"features of {model_id}: extract features first (corpusforge extract-features)"


def read_shard_features(store: Store, model_id: str, shard: str, subset: str | None = None
                        ) -> tuple[list[str], np.ndarray]:
    """Keys of the ok records and their features (as stored, usually float16)."""
    table = store.read_parquet(feature_keys(model_id, shard, subset))
    keys = [k for k, ok in zip(table["key"].to_pylist(), table["ok"].to_pylist(), strict=True) if ok]
    feats = store.read_npy(feature_vectors(model_id, shard, subset))
    if feats.shape[0] != len(keys):
        raise ValueError(f"{feature_vectors(model_id, shard, subset)}: {feats.shape[0]} rows for {len(keys)} keys")
    return keys, feats


def read_feature_rows(store: Store, model_id: str, shard: str, records: np.ndarray) -> np.ndarray:
    """The stored features of the shard's records at rows ``records`` (sorted, unique, each an
    ok record), read by ranges of the vectors file: its header, then one read per run of
    consecutive rows, never the whole file (a query rescoring a few candidates per shard
    reaches shards all over the corpus). The keys file lists every record in shard order,
    so a record's vector row is the count of ok records before it."""
    ok = store.read_parquet(feature_keys(model_id, shard), columns=["ok"])["ok"].to_numpy(zero_copy_only=False)
    if len(records) and records[-1] >= len(ok) or not ok[records].all():
        raise ValueError(f"{feature_keys(model_id, shard)}: rows {records[:3].tolist()}… are not all embedded records")
    rows = np.cumsum(ok)[records] - 1
    with store.open(feature_vectors(model_id, shard)) as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if fortran or len(shape) != 2:
            raise ValueError(f"{feature_vectors(model_id, shard)}: not a C-ordered 2-d array")
        start, row_bytes = f.tell(), shape[1] * dtype.itemsize
        out = np.empty((len(rows), shape[1]), dtype=dtype)
        runs = np.flatnonzero(np.diff(rows) != 1) + 1  # starts of runs of consecutive rows
        for lo, hi in zip(np.concatenate([[0], runs]), np.concatenate([runs, [len(rows)]]), strict=True):
            f.seek(start + int(rows[lo]) * row_bytes)
            out[lo:hi] = np.frombuffer(f.read(int(hi - lo) * row_bytes), dtype=dtype).reshape(hi - lo, shape[1])
    return out


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
        for subset in [None, *store.listdir(f"{features_dir(model)}/subsets")]:
            prune_subset(store, model, subset, shards)


def prune_subset(store: Store, model_id: str, subset: str | None, shards: list[str]) -> None:
    """Keep a consumer's subset features (``subset`` None: of every image) of exactly ``shards``
    (with their markers)."""
    for sub in ("vectors", "keys"):
        prune(store, f"{feature_subset_dir(model_id, subset)}/{sub}", shards)
