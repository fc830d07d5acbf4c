"""Building the near-duplicate index: one task for a flat index; train, add, merge for IVF.

    flat: prepare (1 task: every vector added, the index written whole)
    ivf:  prepare (1 task: train on the seeded sample, at most ``index.advanced.max_train`` vectors)
          → add (1 task per block of staging shards, about ADD_BLOCK_BYTES of lists each)
          → merge (1 task: every block's lists into graph/index/index.ivfdata)

The prepare task also chooses the index and draws the recall sample (it reads every shard
once), so the driver reads no feature marker. Every step is a unit of the stage contract: a
rerun whose training gives the same bytes adds again only the blocks whose shards changed (keys:
docs/near-duplicates.md, "An IVF index no query worker holds whole").

Memory per task: the prepare task holds its training sample (2 M × 512 float32 = 4 GB at
the cap, and FAISS's residuals of it), an add task one block's lists, the trained index
and one shard's vectors; the merge maps one range of lists at a time (``MERGE_RANGE_BYTES``
of output and the blocks' pages of it) and holds the trained index, each list's offsets
and each block's. Lists file format and query side: :mod:`tasks.graph.ondisk`.
"""

from __future__ import annotations

import io
import tempfile
from typing import TypedDict

import faiss
import numpy as np

from corpusforge.contract import (FanOut, Marker, StageSummary, Unit, UnitResult, digest_of, in_process, prune,
                                  remove_tree, require_marker, run_unit, summarise, unit_fingerprint)
from corpusforge.faults import fault_point
from corpusforge.feature_files import require_all_features
from corpusforge.hashing import sha256_file, stable_uniform
from tasks.graph.files import (GRAPH_INDEX, GRAPH_INDEX_BLOCKS, GRAPH_INDEX_LISTS, GRAPH_INDEX_TRAINED,
                               GRAPH_INDEX_WORK, GRAPH_RECALL_IDS, GRAPH_RECALL_VECTORS, index_block_path)
from corpusforge.storage import Store
from corpusforge.tarshard import HashingWriter
from corpusforge.version import code_version
from tasks.graph import index as fx
from tasks.graph import ondisk
from tasks.graph.config import NearDedupConfig
from tasks.graph.edges import IndexInfo, group_shards, index_choice
from tasks.graph.nodes import NodeTable, load_shard_vectors, read_shard_table, rows_in_order
from tasks.shared.pair_score import PairScore

# Lists (codes and ids) one add task builds: 0.9 M vectors of IVF-PQ64 (72 B each), 65k of
# 512-d SQfp16; a shard larger than that is a block of its own.
ADD_BLOCK_BYTES = 64 << 20


class BlockInfo(TypedDict):
    """An add unit's marker info: the shards it added and their vectors."""

    shards: int
    vectors: int
    gpu_add: bool


def build_index(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str,
                fan_out: FanOut = in_process) -> tuple[UnitResult[IndexInfo], StageSummary | None]:
    """Build and save the index, each unit skipped when already built from the same inputs.

    ``shard_table``: SHA-256 of the stage's shard table (tasks/graph/nodes.py). Returns the
    index's unit result (the queries read its choice, fingerprint and lists' SHA-256) and, for
    IVF, the summary of its add units. ``fan_out`` runs each step's units (a flow: as Prefect tasks)."""
    first = fan_out(PREPARE_INDEX, [dict(source=source, out=out, cfg=cfg, shard_table=shard_table)])[0]
    if first.info["plan"]["kind"] == "flat":  # an IVF build before this one leaves nothing behind
        out.remove(GRAPH_INDEX_LISTS)
        remove_tree(out, GRAPH_INDEX_WORK)
        return first, None
    nodes, _ = read_shard_table(out, shard_table)
    blocks = index_blocks(nodes, fx.IndexChoice.from_json(first.info["plan"]))
    prune(out, GRAPH_INDEX_BLOCKS, [b[0] for b in blocks])
    added = fan_out(ADD_BLOCK, [dict(source=source, out=out, cfg=cfg, shard_table=shard_table, block=b,
                                     trained=first.digest) for b in blocks])
    merged = fan_out(MERGE_BLOCKS, [dict(out=out, shard_table=shard_table, trained=first.digest,
                                         blocks=blocks_digest([a.digest for a in added]))])[0]
    return merged, summarise("graph.blocks", added)


def index_blocks(nodes: NodeTable, choice: fx.IndexChoice) -> list[tuple[str, str]]:
    """Contiguous groups of shards, (first, last), each with at most ADD_BLOCK_BYTES of lists
    (or one shard): fixed by the node table, so every task derives the same blocks."""
    most = max(1, ADD_BLOCK_BYTES // choice.bytes_per_vector)
    counts = np.diff(nodes.offsets)
    blocks, start, held = [], 0, 0
    for i, count in enumerate(counts.tolist()):
        if i > start and held + count > most:
            blocks.append((nodes.shards[start], nodes.shards[i - 1]))
            start, held = i, 0
        held += count
    if nodes.shards:
        blocks.append((nodes.shards[start], nodes.shards[-1]))
    return blocks


def blocks_digest(digests: list[str]) -> str:
    """One digest for the block units' outputs, in block order (what the merge reads)."""
    return digest_of({str(i): d for i, d in enumerate(digests)})


def prepare_index(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str) -> UnitResult[IndexInfo]:
    """Choose the index and draw the recall sample; build a flat index whole, train an IVF one.

    Returns the index's unit result (flat) or the trained index's (IVF)."""
    nodes, _ = read_shard_table(out, shard_table)
    markers = [m.info for m in require_all_features(source, cfg.model_id, nodes.shards)]
    choice, rule, n_vectors, dim = index_choice(cfg, markers)
    flat = choice.kind == "flat"
    fp = unit_fingerprint("graph-index" if flat else "graph-index-train", code_version(__name__),
                          [choice.to_json(), cfg.seed, cfg.recall_queries, rule.to_json()], shard_table)

    def compute() -> tuple[dict[str, str], IndexInfo]:
        fx.set_threads(cfg.index.faiss_threads)
        index = fx.new_index(choice, cfg.seed)
        train, train_keys, recall_ids, recall_vecs = [], [], [], []
        train_rate, recall_rate = choice.n_train / max(n_vectors, 1), cfg.recall_queries / max(n_vectors, 1)
        for shard, offset in zip(nodes.shards, nodes.offsets[:-1], strict=False):
            ids, keys, x = load_shard_vectors(source, cfg.model_id, shard, int(offset))
            if flat and len(ids):
                index.add_with_ids(rule.candidate_forms(x), ids)
            if not flat:
                pick, u = _sample(cfg.seed, "train", keys, train_rate)
                train.append(rule.candidate_forms(x[pick]))
                train_keys.append(u)
            pick, _ = _sample(cfg.seed, "recall", keys, recall_rate)
            recall_ids.append(ids[pick])
            recall_vecs.append(x[pick])
        gpu = False
        if not flat:
            index, gpu = fx.maybe_gpu(index, cfg.index.use_gpu)
            fx.train_index(index, _in_key_order(train, train_keys, choice.dim))
            if gpu:
                index = faiss.index_gpu_to_cpu(index)
        q_ids = np.concatenate(recall_ids) if recall_ids else np.zeros(0, np.int64)
        q = np.concatenate(recall_vecs) if recall_vecs else np.zeros((0, dim), np.float32)
        order = np.argsort(q_ids)
        main = GRAPH_INDEX if flat else GRAPH_INDEX_TRAINED
        outputs = {GRAPH_RECALL_IDS: out.write_npy(GRAPH_RECALL_IDS, q_ids[order]),
                   GRAPH_RECALL_VECTORS: out.write_npy(GRAPH_RECALL_VECTORS, q[order])}
        with out.atomic_write(main) as f:
            sink = HashingWriter(f)
            fx.write_index(index, sink)
        outputs[main] = sink.sha256
        return outputs, {"plan": choice.to_json(), "n_vectors": n_vectors, "dim": dim, "pair_score": rule.to_json(),
                         "recall_queries": int(len(q_ids)), "gpu_build": gpu}

    return run_unit(out, GRAPH_INDEX if flat else GRAPH_INDEX_TRAINED, fp, compute)


def add_block(source: Store, out: Store, cfg: NearDedupConfig, shard_table: str, block: tuple[str, str],
              trained: str) -> UnitResult[BlockInfo]:
    """Add a block's shards, in order, to a copy of the trained index; write its lists to
    ``work/graph/index/blocks/{first}.ivf``. ``trained``: digest of the trained index's unit."""
    nodes, digests = read_shard_table(out, shard_table)
    shards = group_shards(nodes, block)
    rel = index_block_path(shards[0])
    fp = unit_fingerprint("graph-index-block", code_version(__name__), cfg.model_id,
                          [trained, [(s, int(nodes.offsets[nodes.index_of(s)]), digests[s]) for s in shards]])

    def compute() -> tuple[dict[str, str], BlockInfo]:
        fault_point("graph.index.add", shards[0])  # tests only: off unless CORPUSFORGE_FAULT
        rule = PairScore.from_json(_trained_marker(out, trained).info["pair_score"])
        fx.set_threads(cfg.index.faiss_threads)
        with out.open(GRAPH_INDEX_TRAINED) as f:
            index, gpu = fx.maybe_gpu(fx.read_index(f), cfg.index.use_gpu)
        for shard in shards:
            ids, _, x = load_shard_vectors(source, cfg.model_id, shard, int(nodes.offsets[nodes.index_of(shard)]))
            if len(ids):
                index.add_with_ids(rule.candidate_forms(x), ids)
        if gpu:
            index = faiss.index_gpu_to_cpu(index)
        with out.atomic_write(rel) as f:
            sink = HashingWriter(f)
            ondisk.write_lists(index, sink)
        return {rel: sink.sha256}, {"shards": len(shards), "vectors": int(index.ntotal), "gpu_add": gpu}

    return run_unit(out, rel, fp, compute)


def merge_blocks(out: Store, shard_table: str, trained: str, blocks: str) -> UnitResult[IndexInfo]:
    """Merge every block's lists, in block order, into the index's on-disk lists; write the
    index (without its lists) to graph/index/index.faiss. ``blocks``: :func:`blocks_digest`
    of the add units. A remote store's blocks are copied to a local temp folder first."""
    fp = unit_fingerprint("graph-index", code_version(__name__), [], [trained, blocks])

    def compute() -> tuple[dict[str, str], IndexInfo]:
        info = _trained_marker(out, trained).info
        nodes, _ = read_shard_table(out, shard_table)
        names = [index_block_path(first) for first, _ in index_blocks(nodes, fx.IndexChoice.from_json(info["plan"]))]
        markers = [require_marker(out, name, "graph index block") for name in names]
        if blocks_digest([m.digest for m in markers]) != blocks:
            raise ValueError(f"{out.path(GRAPH_INDEX_BLOCKS)} changed while the graph stage ran: another build "
                             f"writes to the same output")
        with out.open(GRAPH_INDEX_TRAINED) as f:
            index = fx.read_index(f)
        header = io.BytesIO()
        with tempfile.TemporaryDirectory(prefix="corpusforge-blocks-") as tmp, \
                out.atomic_local_file(GRAPH_INDEX_LISTS) as lists_path:
            paths = [ondisk.local_file(out, name, m.outputs[name], tmp) for name, m in zip(names, markers, strict=True)]
            fx.write_index(ondisk.merge_lists(index, paths, lists_path, GRAPH_INDEX_LISTS.rsplit("/", 1)[-1]), header)
            lists_sha = sha256_file(lists_path)
        outputs = {GRAPH_INDEX_LISTS: lists_sha, GRAPH_INDEX: out.write_bytes(GRAPH_INDEX, header.getvalue())}
        return outputs, {**info, "blocks": len(names)}

    return run_unit(out, GRAPH_INDEX, fp, compute)


def _trained_marker(out: Store, trained: str) -> Marker[IndexInfo]:
    marker = require_marker(out, GRAPH_INDEX_TRAINED, "graph index training")
    if marker.digest != trained:
        raise ValueError(f"{out.path(GRAPH_INDEX_TRAINED)} changed while the graph stage ran: another build "
                         f"writes to the same output")
    return marker


def _sample(seed: int, salt: str, keys: list[str], rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``keys`` chosen at ``rate`` by a seeded key hash, and their hash values."""
    u = np.fromiter((stable_uniform(seed, f"{salt}:{k}") for k in keys), dtype=np.float64, count=len(keys))
    pick = np.flatnonzero(u < rate)
    return pick, u[pick]


def _in_key_order(parts: list[np.ndarray], keys: list[np.ndarray], dim: int) -> np.ndarray:
    """The rows of ``parts`` in one array, ordered by their sample ``keys`` (stable), so the
    sample does not depend on shard order."""
    return rows_in_order(parts, np.argsort(np.concatenate(keys) if keys else np.zeros(0), kind="stable"), dim)


PREPARE_INDEX = Unit(prepare_index, "graph-build-index", probe=True)
ADD_BLOCK = Unit(add_block, "graph-index-add", probe=True)
MERGE_BLOCKS = Unit(merge_blocks, "graph-index-merge", probe=True)
