"""Benchmark: pickled parameters per graph fan-out task at S = 1k and 10k staging shards.

Every graph query, recall, merge and verify task is submitted with keyword parameters
that Prefect walks and Dask pickles (cloudpickle) for each task. Before issue 22 each
carried the whole ``NodeTable`` and the ``digests`` map (O(S) bytes per task, O(S²)
through the scheduler per fan-out); now each carries names and digests only and reads
the shared table from ``work/graph/shards.parquet``. The "before" column rebuilds the
old parameter dicts (``dict(source, out, cfg, nodes, shard, info, digests)``, and for
verify ``records_digests`` of every shard); the "after" column takes the stage's own
call builders (``tasks.graph.stage.shard_calls``, ``merge_groups``). Synthetic: shard
names ``000000…``, random 64-hex digests, no features. Usage:
``python bench/graph_params.py [--shards 1000 10000]``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile

import cloudpickle
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from corpusforge.contract import UnitResult  # noqa: E402
from tasks.graph.files import GRAPH_INDEX, GRAPH_INDEX_LISTS
from corpusforge.storage import Store  # noqa: E402
from tasks.graph.config import NearDedupConfig  # noqa: E402
from tasks.graph.edges import found_fingerprint, merge_groups  # noqa: E402
from tasks.graph.nodes import NodeTable, write_shard_table  # noqa: E402
from tasks.graph.stage import shard_calls  # noqa: E402
from tasks.graph.verify import records_fingerprint  # noqa: E402

PER_SHARD = 10_000  # images per staging shard (the staging default)


def _size(params: dict) -> int:
    return len(cloudpickle.dumps(params))


def measure(n_shards: int, root: str) -> dict[str, int]:
    """Bytes of one task's pickled parameters, before and after, per fan-out."""
    store = Store(root)
    cfg = NearDedupConfig()
    shards = [f"{i:06d}" for i in range(n_shards)]
    nodes = NodeTable(tuple(shards), np.arange(n_shards + 1, dtype=np.int64) * PER_SHARD)
    digests = {s: secrets.token_hex(32) for s in shards}
    records = {s: secrets.token_hex(32) for s in shards}
    info = {"plan": {"kind": "ivf", "factory": "IVF4096,SQfp16", "nlist": 4096, "nprobe": 32, "n_train": 262144,
                     "n_vectors": n_shards * PER_SHARD, "storage": "sq", "exact_scores": False},
            "n_vectors": n_shards * PER_SHARD, "dim": 512, "pair_score": None, "recall_queries": 1000,
            "gpu_build": False}
    index = UnitResult(secrets.token_hex(16), {GRAPH_INDEX: secrets.token_hex(32), GRAPH_INDEX_LISTS: secrets.token_hex(32)}, secrets.token_hex(32), info,
                       action="computed")
    table = write_shard_table(store, nodes, digests)
    shard = shards[n_shards // 2]
    common = dict(source=store, out=store, cfg=cfg, nodes=nodes)
    group = merge_groups(nodes, [1] * n_shards, 1000)[0]
    return {
        "query/recall before": _size(dict(common, shard=shard, info=info, digests=digests)),
        "query/recall after": _size(shard_calls(store, store, cfg, table, digests, index)[n_shards // 2]),
        "merge before": _size(dict(out=store, nodes=nodes, group=list(shards[:n_shards // 1000 or 1]),
                                   digests=digests, found_digests=list(digests.values()))),
        "merge after": _size(dict(out=store, shard_table=table, group=group,
                                  found=found_fingerprint(list(digests.values())))),
        "verify before": _size(dict(common, shard=shard, review_digest=digests[shard], records_digests=records)),
        "verify after": _size(dict(source=store, out=store, cfg=cfg, shard_table=table, shard=shard,
                                   review_digest=digests[shard], records=records_fingerprint(records))),
        "shared table file": os.path.getsize(os.path.join(root, "work", "graph", "shards.parquet")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1000, 10_000])
    args = parser.parse_args()
    rows = {}
    for n in args.shards:
        with tempfile.TemporaryDirectory() as root:
            rows[n] = measure(n, root)
    names = list(next(iter(rows.values())))
    print(f"{'bytes per task':<22}" + "".join(f"{f'S = {n:,}':>14}" for n in rows))
    for name in names:
        print(f"{name:<22}" + "".join(f"{rows[n][name]:>14,}" for n in rows))


if __name__ == "__main__":
    main()
