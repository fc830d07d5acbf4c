"""Global node ids for the similarity graph and the reads that attach vectors to them.

A node is one image of a staging shard. Its id is ``offset(shard) + row``, where ``row``
is the image's position in ``staging/records/{shard}.parquet`` and the offsets are the
cumulative row counts of the shards in sorted order: ids are int64, dense, and do not
depend on the order in which shards were listed. Images whose features failed have a
node (and end up kept, without edges) but no vector.

The node table, every shard's feature digest and the per-shard digest lists the one-off tasks
fingerprint are written once as files (:func:`write_shard_table`, :func:`write_shard_digests`) and
tasks get their SHA-256: as parameters they would be O(S) bytes per task, O(S²) through the
scheduler per fan-out (docs/near-duplicates.md, "The driver's parameters at scale"). A file whose
digest differs is refused: a task never works from another run's table.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.contract import read_pinned
from corpusforge.feature_files import read_shard_features
from tasks.graph.files import GRAPH_SHARD_TABLE, SHARD_DIGESTS_SCHEMA, SHARD_TABLE_SCHEMA, graph_digests_path
from corpusforge.layout import staging_records as records_path
from corpusforge.storage import Store
from tasks.shared.pair_score import unit_rows


@dataclass(frozen=True)
class NodeTable:
    """Shards in id order with their first node id; ``offsets[-1]`` is the node count."""

    shards: tuple[str, ...]
    offsets: np.ndarray  # int64 [len(shards) + 1]

    @property
    def n_nodes(self) -> int:
        return int(self.offsets[-1])

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """Index into ``shards`` of each node id."""
        return np.searchsorted(self.offsets, np.asarray(ids, dtype=np.int64), side="right") - 1

    @cached_property
    def positions(self) -> dict[str, int]:
        """Shard -> its index in ``shards``, built once (tasks look shards up per file; S can be 10⁵)."""
        return {s: i for i, s in enumerate(self.shards)}

    def index_of(self, shard: str) -> int:
        return self.positions[shard]

    def span(self, shard: str) -> tuple[int, int]:
        i = self.index_of(shard)
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def to_json(self) -> dict:
        return {"shards": list(self.shards), "offsets": [int(o) for o in self.offsets]}

    @classmethod
    def from_json(cls, obj: dict) -> NodeTable:
        return cls(tuple(obj["shards"]), np.asarray(obj["offsets"], dtype=np.int64))


def number_nodes(store: Store, shards: list[str]) -> NodeTable:
    """Offsets from the records files' row counts (parquet footers only, no data read)."""
    ordered = tuple(sorted(set(shards)))
    counts = []
    for shard in ordered:
        with store.open(records_path(shard)) as f:
            counts.append(pq.ParquetFile(f).metadata.num_rows)
    offsets = np.zeros(len(ordered) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return NodeTable(ordered, offsets)


def write_shard_table(out: Store, nodes: NodeTable, digests: dict[str, str]) -> str:
    """Write the node table and each shard's feature digest for the tasks; return its SHA-256."""
    table = pa.table({"shard": list(nodes.shards), "start": nodes.offsets[:-1], "stop": nodes.offsets[1:],
                      "features": [digests[s] for s in nodes.shards]}, schema=SHARD_TABLE_SCHEMA)
    return out.write_parquet(GRAPH_SHARD_TABLE, table)


_TABLE_CACHE: dict[tuple[str, str], tuple[NodeTable, dict[str, str]]] = {}


def read_shard_table(out: Store, digest: str) -> tuple[NodeTable, dict[str, str]]:
    """The node table and feature digests written as ``digest``, read once per process and kept."""
    key = (out.root, digest)
    if key not in _TABLE_CACHE:
        t = pq.read_table(io.BytesIO(read_pinned(out, GRAPH_SHARD_TABLE, digest, "the graph stage")))
        shards = t["shard"].to_pylist()
        offsets = np.concatenate([[0], t["stop"].to_numpy()]).astype(np.int64)  # the first shard starts at 0
        _TABLE_CACHE.clear()
        _TABLE_CACHE[key] = (NodeTable(tuple(shards), offsets), dict(zip(shards, t["features"].to_pylist(),
                                                                         strict=True)))
    return _TABLE_CACHE[key]


def write_shard_digests(out: Store, kind: str, nodes: NodeTable, digests: list[str]) -> str:
    """Write one digest per shard of ``nodes`` (in node order) as the list ``kind``; return its SHA-256."""
    table = pa.table({"shard": list(nodes.shards), "digest": digests}, schema=SHARD_DIGESTS_SCHEMA)
    return out.write_parquet(graph_digests_path(kind), table)


def read_shard_digests(out: Store, kind: str, digest: str, nodes: NodeTable) -> list[str]:
    """The list ``kind`` written as ``digest``, one digest per shard of ``nodes`` in node order."""
    t = pq.read_table(io.BytesIO(read_pinned(out, graph_digests_path(kind), digest, "the graph stage")))
    if tuple(t["shard"].to_pylist()) != nodes.shards:
        raise ValueError(f"{out.path(graph_digests_path(kind))} lists other shards than the graph's node table")
    return t["digest"].to_pylist()


def load_shard_vectors(store: Store, model_id: str, shard: str, offset: int
                       ) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Node ids, keys and unit float32 vectors of one shard's embedded images, in shard order."""
    record_keys = store.read_parquet(records_path(shard), columns=["key"])["key"].to_pylist()
    row_of = {k: i for i, k in enumerate(record_keys)}
    keys, feats = read_shard_features(store, model_id, shard)
    missing = [k for k in keys if k not in row_of]
    if missing:
        raise ValueError(f"features/{model_id}/{shard}: keys not in {records_path(shard)}: {missing[:3]}")
    ids = offset + np.fromiter((row_of[k] for k in keys), dtype=np.int64, count=len(keys))
    x = unit_rows(feats) if len(keys) else np.zeros((0, feats.shape[-1]), np.float32)
    if np.any(np.diff(ids) <= 0):  # lookups by id need them ascending
        order = np.argsort(ids, kind="stable")
        ids, keys, x = ids[order], [keys[i] for i in order], x[order]
    return ids, keys, x


def rows_in_order(parts: list[np.ndarray], order: np.ndarray, dim: int) -> np.ndarray:
    """The rows of ``parts`` (as if concatenated) taken in ``order``, in one float32 array.
    Each part is dropped from ``parts`` once placed, so a sample is held once and a part,
    not twice as by a concatenate and a take."""
    slot = np.empty(len(order), np.int64)
    slot[order] = np.arange(len(order))
    rows = np.empty((len(order), dim), np.float32)
    end = len(order)
    while parts:  # the last part first
        part = parts.pop()
        rows[slot[end - len(part):end]] = part
        end -= len(part)
    return rows
