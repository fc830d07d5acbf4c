"""The fixed evaluation caption set (GPIC §3): the captions users generate images from.

The test records with the N smallest ``stable_uniform(seed, key)`` (default 50,000, capped by
the test split's size), by the one rule (:class:`tasks.shared.sampling.SmallestKeys`) and default
seed of the reference statistics' Test-50K subset, so both are the same images; written as
``eval_captions.parquet`` in key order, its SHA-256 in the receipt (docs/captioning.md).

One task on the cluster, never the flow process, with memory bounded by the set's size and a
batch of assignment rows, not by the test split: it reads the test split's release assignment
files (named in ``work/eval_plans.parquet``, pinned by SHA-256) twice, a batch at a time — the
keys, keeping the N smallest, then the chosen rows — and input captions at the ``.txt`` spans
they list. The file is the same bytes as a sort of the whole split would give.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field

from corpusforge.config import StrictModel
from corpusforge.contract import Unit, read_pinned
from corpusforge.layout import staging_tar
from tasks.release.files import release_assignment_path
from tasks.captions.files import EVAL_CAPTIONS, EVAL_CAPTIONS_SCHEMA
from corpusforge.storage import Store
from tasks.shared.sampling import SmallestKeys

TEST = "test"
EVAL_ASSIGNMENTS = "work/eval_plans.parquet"  # the test split's release assignment names, in the release's order
EVAL_ASSIGNMENTS_SCHEMA = pa.schema([("shard", pa.string())])
_ASSIGNMENT_COLUMNS = ["key", "staging_shard", "caption", "caption_type", "members"]


class EvalCaptionsConfig(StrictModel):
    """Size and seed of the evaluation caption set."""

    size: int = Field(50_000, ge=1, description="Captions in the set (capped by the test split's size).")
    seed: int = Field(1, description="Seed of the sample; 1 = the reference statistics' Test-50K subset seed.")


def write_test_assignment_list(store: Store, release: dict[str, Any]) -> str:
    """Write the names of the test split's release assignment files (``release``: the summary of
    :func:`tasks.release.assign_release_files`) for :func:`write_eval_captions`; return the SHA-256
    it is handed."""
    names = [name for name, shard in release["shards"].items() if shard["split"] == TEST]
    return store.write_parquet(EVAL_ASSIGNMENTS, pa.table({"shard": names}, schema=EVAL_ASSIGNMENTS_SCHEMA))


def _assignments(store: Store, assignments: str) -> list[str]:
    data = read_pinned(store, EVAL_ASSIGNMENTS, assignments, "the evaluation caption set")
    return pq.read_table(io.BytesIO(data))["shard"].to_pylist()


def _assignment_batches(store: Store, name: str, columns: list[str], rows: int = 4096) -> Iterator[pa.RecordBatch]:
    """One release assignment file's ``columns`` in batches of ``rows``: the task holds a batch
    of a file, not a whole file (a release shard's size is a config field)."""
    with store.open(release_assignment_path(name)) as f:
        yield from pq.ParquetFile(f).iter_batches(batch_size=rows, columns=columns, use_threads=False)


def _txt_span(members: list[dict[str, Any]]) -> tuple[int, int]:
    span = next(m for m in members if m["ext"] == "txt")
    return span["offset"], span["size"]


def _input_captions(source: Store, rows: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], str]]:
    """Each row without a model caption with its input caption, read at its ``.txt`` span:
    per staging shard, one open file read in offset order (local) or one batch of ranged
    reads (an object store)."""
    by_shard: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["caption"] is None:
            by_shard.setdefault(r["staging_shard"], []).append(r)
    for shard in sorted(by_shard):
        todo = sorted(by_shard[shard], key=lambda r: _txt_span(r["members"]))
        spans = [_txt_span(r["members"]) for r in todo]
        for r, data in zip(todo, _read_spans(source, staging_tar(shard), spans), strict=True):
            yield r, data.decode("utf-8", "replace")


def _read_spans(store: Store, rel: str, spans: list[tuple[int, int]]) -> list[bytes]:
    """The bytes at ``spans`` (offset, size) of one file."""
    if store.remote:  # an empty span is no range an object store serves: b"" without a request
        path = store.path(rel)
        wanted = [(o, n) for o, n in spans if n]
        got = iter(store.fs.cat_ranges([path] * len(wanted), [o for o, _ in wanted], [o + n for o, n in wanted],
                                       on_error="raise") if wanted else [])
        out = [next(got) if n else b"" for _, n in spans]
    else:
        with store.open(rel) as f:
            out = []
            for offset, size in spans:
                f.seek(offset)
                out.append(f.read(size))
    for data, (offset, size) in zip(out, spans, strict=True):
        if len(data) != size:
            raise OSError(f"short read of {rel}: wanted {size} bytes at {offset}, got {len(data)}")
    return out


class CaptionSet(TypedDict):
    """What the receipt records about the set (:func:`write_eval_captions`)."""

    path: str
    sha256: str
    captions: int
    test_records: int
    size: int
    seed: int
    rule: str


def write_eval_captions(store: Store, assignments: str, cfg: EvalCaptionsConfig,
                        source: Store | None = None) -> CaptionSet:
    """Write the set (``assignments``: the SHA-256 from :func:`write_test_assignment_list`); return
    what the receipt records about it. ``source`` holds the staging shards (default ``store``)."""
    source = source or store
    names = _assignments(store, assignments)
    smallest = SmallestKeys(cfg.size, cfg.seed)
    test_records = 0
    for name in names:
        for batch in _assignment_batches(store, name, ["key"]):
            keys = batch["key"].to_pylist()
            test_records += len(keys)
            smallest.add(keys)
    chosen = pa.array(sorted(smallest.keys()), pa.string())
    rows: list[dict[str, Any]] = []
    for name in names:
        for batch in _assignment_batches(store, name, _ASSIGNMENT_COLUMNS):
            picked = batch.filter(pc.is_in(batch["key"], value_set=chosen))
            rows += [{**r, "shard": name} for r in picked.to_pylist()]
    for r, caption in _input_captions(source, rows):
        r["caption"] = caption
    rows.sort(key=lambda r: r["key"])  # stable: a key twice keeps the files' order
    table = pa.Table.from_pylist([{c: r[c] for c in EVAL_CAPTIONS_SCHEMA.names} for r in rows],
                                 schema=EVAL_CAPTIONS_SCHEMA)
    sha = store.write_parquet(EVAL_CAPTIONS, table)
    return {"path": EVAL_CAPTIONS, "sha256": sha, "captions": len(rows), "test_records": test_records,
            "size": cfg.size, "seed": cfg.seed,
            "rule": "the test records with the smallest blake2b(seed:key) priority, in key order"}


WRITE_EVAL_CAPTIONS = Unit(write_eval_captions, "write-eval-captions")
