"""Which corpus images a scan may match: the keys of chosen splits, per staging shard.

A corpus's features cover every staged image, including near-duplicates the build removed and
the held-out splits; "the training corpus" is the manifest's ``kept`` rows of the training
split(s). One unit streams the manifest once and writes ``select/{name}/{shard}.parquet`` (key,
split) per staging shard. Memory: the selected keys of the corpus, ~40 bytes each (4 GB at
100M) — like the near-duplicate decisions, the one step that holds per-record metadata.
"""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.contract import UnitResult, prune, read_marker, read_pinned, run_unit, unit_fingerprint
from corpusforge.layout import MANIFEST_DIR
from tasks.contamination.files import CONTAMINATION_SELECT, SELECT_SCHEMA, select_path
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.version import code_version

SHARD_LIST = "_shards"  # the selection's shard list, beside its per-shard files
SHARD_LIST_SCHEMA = pa.schema([("shard", pa.string())])


def file_digest(store: Store, rel: str) -> str:
    """The digest a downstream fingerprint uses for ``rel``: its marker's, else its SHA-256."""
    marker = read_marker(store, rel)
    if marker is not None and rel in marker.outputs:
        return marker.outputs[rel]
    return store.sha256(rel)


def manifest_parts(corpus: Store) -> list[str]:
    parts = [n for n in corpus.listdir(MANIFEST_DIR) if n.endswith(".parquet") and not n.startswith(".")]
    if not parts:
        raise FileNotFoundError(f"{corpus.root} has no manifest: a split selection needs a built corpus")
    return [f"{MANIFEST_DIR}/{n}" for n in parts]


def selection_name(label: str, splits: list[str]) -> str:
    return f"{label}-{'-'.join(sorted(splits))}"


def shard_list_path(name: str) -> str:
    return f"{CONTAMINATION_SELECT}/{name}/{SHARD_LIST}.parquet"


def write_shard_list(out: Store, name: str, shards: list[str]) -> str:
    """Write the shards a selection covers, in order; return the SHA-256 :func:`select_splits`
    gets (a task's parameters name the list, never the corpus's every shard)."""
    return out.write_parquet(shard_list_path(name), pa.table({"shard": list(shards)}, schema=SHARD_LIST_SCHEMA))


def select_splits(corpus: Store, out: Store, name: str, splits: list[str], shards: str) -> UnitResult:
    """Write the per-shard key lists of ``splits`` (kept rows only) for every shard of the list
    ``shards`` (the SHA-256 from :func:`write_shard_list`); info: selected per split, shard digests."""
    parts = manifest_parts(corpus)
    fp = unit_fingerprint("contamination-select", code_version(__name__), sorted(splits),
                          [[p, file_digest(corpus, p)] for p in parts] + [shards])
    folder = f"{CONTAMINATION_SELECT}/{name}"
    listed = pq.read_table(io.BytesIO(read_pinned(out, shard_list_path(name), shards, "a split selection")))
    shards = listed["shard"].to_pylist()
    prune(out, folder, set(shards) | {"_all", SHARD_LIST})
    rel = f"{folder}/_all.json"

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        wanted = set(splits)
        by_shard: dict[str, list[tuple[str, str]]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        for p in parts:
            with corpus.open(p) as f:
                for batch in pq.ParquetFile(f).iter_batches(columns=["key", "status", "split", "staging_shard"]):
                    for key, status, split, shard in zip(*(batch.column(i).to_pylist() for i in range(4)),
                                                         strict=True):
                        if status == Status.KEPT and split in wanted and shard:
                            by_shard[shard].append((key, split))
                            counts[split] += 1
        outputs, digests = {}, {}
        for shard in shards:
            rows = sorted(by_shard.get(shard, []))
            table = pa.table({"key": [k for k, _ in rows], "split": [s for _, s in rows]}, schema=SELECT_SCHEMA)
            outputs[select_path(name, shard)] = digests[shard] = out.write_parquet(select_path(name, shard), table)
        outputs[rel] = out.write_json(rel, {"splits": sorted(splits), "counts": dict(sorted(counts.items()))})
        return outputs, {"splits": sorted(splits), "counts": dict(sorted(counts.items())), "digests": digests}

    return run_unit(out, rel, fp, compute)


def read_selection(out: Store, name: str, shard: str) -> dict[str, str]:
    """Selected keys of one shard → their split."""
    t = out.read_parquet(select_path(name, shard))
    return dict(zip(t["key"].to_pylist(), t["split"].to_pylist(), strict=True))
