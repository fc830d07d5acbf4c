"""Scale benchmark of the build's global steps, without images: growth laws and bounds at 10⁸.

For each size N it writes synthetic inputs in the real formats with the real writers and
markers (ingest rows and their dedup tables with ~3 % exact duplicates, staging tars,
indexes and records, float16 features with ~5 % planted near-duplicates in a 512-d
learned-model shape and the wfd shape, near-duplicate decisions with ~5 % of the staged
records in components of 2 to 5 spread over the corpus, which release assignment reads as a
default build's does, a source folder), with P = N / partition_size
ingest partitions and S = N / shard_size staging shards as the defaults set them. Then
each step runs in its own process (``--child``) and reports wall time, CPU time, peak
RSS above the process's resident size when the step started (``/proc/self/clear_refs``
resets the peak; a step of several tasks, the index build, resets it before each task and
reports the largest task's), files opened and bytes read through fsspec (a counting local
filesystem registered for ``file://`` in the child, so every ``Store`` uses it; files FAISS
maps itself, the index's lists, are added), the number of tasks and the largest pickled
parameters of one task. Peak RSS counts the pages of mapped files a task touched too. The
child runs Arrow on the C allocator (:func:`measure` says why), so a peak is what the step
allocates, not what a pool keeps.

The table fits time, peak memory, files opened and parameter size as ``a·N^b`` (log-log
least squares over the sizes run) and, beside it, the straight line through the last two sizes,
and projects both to 10⁸ and 10⁹ (bounds checked at 10⁸ on the larger); a step the stage refuses
above a size (the graph index of wfd and of 512-d SQfp16, :func:`refused_above`) says so and
projects nothing past it. Bounds (issue 22):
a linear step fits b ≤ 1.1 (fit and last two sizes) for CPU time (wall time is shown too, but on a shared 2-core
machine it measures the neighbours as much as the step) and files opened; the flow process ≤ 2 GB and any
task ≤ 16 GB at 10⁸; ≤ 64 KB of parameters per task; ≤ 20,000 task runs per build. Steps
listed in :data:`FIXED` must meet them (exit 1 otherwise); the others are reported. Task
runs per build are computed, not run: each fan-out's unit count at N through
:func:`corpusforge.cluster.batch_count`.

Steps are a registry of small adapters (:data:`STEPS`): one function per step that calls
the step's real code the way the flow does and returns its task count and parameters,
so a rewritten step is plugged in by editing its adapter.

Usage: ``python bench/scale.py [--quick] [--sizes 10000 100000 1000000] [--steps ...]
[--work DIR] [--keep]``. ``--quick``: 10k and 100k (the scale guard,
tests/test_scale_guard.py, runs it over :data:`GUARDED`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
PROJECT = (10**8, 10**9)  # projected to; the bounds hold at 10⁸ (PROJECT[0]), 10⁹ is shown
EXACT_DUP_RATE = 0.03
NEAR_DUP_RATE = 0.05
NEAR_DUP_SIZES = (2, 3, 4, 5)  # the near-duplicate decisions' components, sizes in turn (write_decisions)
MODEL_512 = "bench512"
MODEL_WFD = "wfd"
FLOW_BOUND = 2 << 30
TASK_BOUND = 16 << 30
PARAMS_BOUND = 64 << 10
RUNS_BOUND = 20_000
GROWTH_BOUND = 1.1
REPEAT_BELOW_S = 1.0  # a step under this much CPU time at a size is measured REPEATS times (measure_least)
REPEATS = 5
PREFECT_SLOTS = 64  # worker threads assumed for the task-run projection (batch_count caps it at 500 per fan-out)
# Steps rewritten to meet the bounds: the benchmark exits 1 when one of these breaks one.
# Area modules (bench/scale_steps/) append their own.
FIXED: list[str] = ["exact_dedup", "release_plan", "release_writer", "receipt", "folder_listing"]
# The scale guard (tests/test_scale_guard.py, --quick) runs these: every bounded step (it fails
# when a name in FIXED is missing here).
GUARDED: list[str] = list(FIXED)


# ---- counting filesystem (in the child) ------------------------------------------------

class CountingFile:
    """A file that adds what is read from it to :class:`CountingFileSystem`'s count."""

    def __init__(self, f: Any):
        self._f = f

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        CountingFileSystem.bytes_read += len(data)
        return data

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)
        CountingFileSystem.bytes_read += n or 0
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)

    def __enter__(self) -> CountingFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()


class CountingFileSystem(LocalFileSystem):
    """The local filesystem, counting files opened for reading and bytes read; with
    ``paths`` a list, the paths opened are appended to it (tests)."""

    opened = 0
    bytes_read = 0
    paths: list[str] | None = None

    @classmethod
    def reset(cls, paths: list[str] | None = None) -> None:
        cls.opened, cls.bytes_read, cls.paths = 0, 0, paths

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        f = super()._open(path, mode, **kwargs)
        if "r" in mode:
            CountingFileSystem.opened += 1
            if CountingFileSystem.paths is not None:
                CountingFileSystem.paths.append(self._strip_protocol(path))
            return CountingFile(f)
        return f


def install_counting_fs() -> type[CountingFileSystem]:
    """Count every local read of this process: every ``Store`` made after this uses it."""
    for protocol in ("file", "local"):
        fsspec.register_implementation(protocol, CountingFileSystem, clobber=True)
    return CountingFileSystem


# ---- sizes and synthetic inputs ---------------------------------------------------------

@dataclass(frozen=True)
class Scale:
    """The unit counts the defaults give for N records."""

    n: int
    parts: int
    shards: int
    buckets: int

    @classmethod
    def of(cls, n: int) -> Scale:
        from tasks.ingest.sources import SourceConfig
        from tasks.staging.stage import StagingConfig

        parts = math.ceil(n / SourceConfig().partition_size)
        return cls(n, parts, max(1, round(n / StagingConfig().shard_size)), StagingConfig().buckets_for(parts))

    @property
    def kept(self) -> int:
        return self.n - int(self.n * EXACT_DUP_RATE)

    @property
    def released(self) -> int:
        """The staged records the release assigns: those near-duplicate decisions keep."""
        components, members = near_dup_components(self.kept)
        return self.kept - members + components

    @property
    def release_shards(self) -> int:
        from tasks.release.splits import SplitConfig

        return math.ceil(self.released / SplitConfig().shard_size)

    def fan_outs(self) -> dict[str, int]:
        """Units of each fan-out of a build (flows/build_corpus.py, tasks/ingest/exact_dedup.py,
        tasks/graph/stage.py, tasks/release/publish.py): one entry per ``run_tasks`` call; graph merge
        at its most, one group per shard (merge_groups sizes groups by found pairs), after its one
        routing task; the index
        as a 512-d model's 10⁸ build plans it (IVF-PQ above flat_max_vectors: add blocks, merge);
        the off-centre crop candidates' two units per shard with the flat index only (tasks/graph/crops.py)."""
        from tasks.ingest.exact_dedup import partition_groups
        from tasks.graph import build
        from tasks.graph.config import IndexConfig
        from bench.scale_steps.graph import IVF_PQ
        from tasks.graph.index import choose_index

        groups = len(partition_groups(self.parts, self.buckets))
        choice = choose_index(IndexConfig(**IVF_PQ) if self.kept > IndexConfig().flat_max_vectors else IndexConfig(),
                              self.kept, 512)
        blocks = math.ceil(self.kept * choice.bytes_per_vector / build.ADD_BLOCK_BYTES) if choice.kind == "ivf" else 0
        return {"plan inputs": 1, "ingest": self.parts, "exchange keys": groups, "duplicate keys": self.buckets,
                "exchange hashes": groups, "exact duplicates": self.buckets, "resolve": groups,
                "staging": self.shards, "features": self.shards, "graph index": 1, "graph index add": blocks,
                "graph index merge": int(blocks > 0), "graph query": self.shards,
                "graph recall refs": self.shards, "graph merge routing": 1, "graph merge": self.shards, "graph recall": 1,
                "graph review": 1, "graph crop regions": self.shards * (choice.kind == "flat"),
                "graph crop candidates": self.shards * (choice.kind == "flat"), "graph verify": self.shards,
                "graph calibration": 1,
                "release plan": 1, "release": self.release_shards, "manifest": self.parts}

    def prefect_runs(self, slots: int = PREFECT_SLOTS) -> tuple[int, int]:
        """Task runs of a build: (one per unit, as before issue 22; batched as
        :func:`corpusforge.cluster.run_tasks` batches them on ``slots`` worker threads),
        plus the graph decisions and collision tasks the graph stage submits itself."""
        from corpusforge.cluster import batch_count

        units = self.fan_outs()
        return sum(units.values()) + 2, sum(batch_count(n, slots) for n in units.values()) + 2


def near_dup_components(kept: int) -> tuple[int, int]:
    """The near-duplicate components among ``kept`` staged records and the records in them:
    sizes NEAR_DUP_SIZES in turn, as many as NEAR_DUP_RATE of the records fill."""
    cycles, rest = divmod(int(kept * NEAR_DUP_RATE), sum(NEAR_DUP_SIZES))
    last = sum(1 for filled in itertools.accumulate(NEAR_DUP_SIZES) if filled <= rest)
    return (cycles * len(NEAR_DUP_SIZES) + last,
            cycles * sum(NEAR_DUP_SIZES) + sum(NEAR_DUP_SIZES[:last]))


def _key(i: int) -> str:
    return f"k{i:09d}"


def _sha(i: int) -> str:
    import hashlib

    return hashlib.sha256(i.to_bytes(8, "little")).hexdigest()


def _content(n: int) -> np.ndarray:
    """Content id of each record: ~3 % are byte-identical copies of an earlier record."""
    rng = np.random.default_rng(1)
    content = np.arange(n)
    dup = rng.choice(n, size=int(n * EXACT_DUP_RATE), replace=False)
    content[dup] = rng.integers(0, n, size=len(dup))
    return content


def write_ingest(store, sc: Scale) -> None:
    """Ingest rows, dedup tables and markers for every partition (as ingest writes them)."""
    import pyarrow as pa

    from corpusforge.contract import finish_unit
    from corpusforge.layout import INGEST_SCHEMA
    from tasks.ingest.files import ingest_path
    from tasks.ingest.exact_dedup import write_dedup_tables

    content = _content(sc.n)
    size = math.ceil(sc.n / sc.parts)
    for part in range(sc.parts):
        rows = []
        for row, i in enumerate(range(part * size, min(sc.n, (part + 1) * size))):
            c = int(content[i])
            record = {name: None for name in INGEST_SCHEMA.names}
            record.update(part=part, row=row, key=_key(i), source_path=f"/src/{_key(i)}.jpg", source_offset=-1,
                          spill_offset=-1, status="kept", reason="", sha256=_sha(c), bytes=1000 + c % 1000,
                          width=64 + c % 7, height=48 + i % 5, format="JPEG", ext="jpg", caption=f"caption {i}",
                          source="bench", caption_type="alt")
            rows.append(record)
        outputs = write_dedup_tables(store, part, rows, sc.buckets)
        outputs[ingest_path(part)] = store.write_parquet(ingest_path(part),
                                                         pa.Table.from_pylist(rows, schema=INGEST_SCHEMA))
        finish_unit(store, ingest_path(part), f"bench-{part}", outputs, {"part": part, "records": len(rows)})


def shard_name(i: int) -> str:
    return f"{i:06d}"


def write_staging(store, sc: Scale) -> None:
    """Staging tars, indexes and records of the kept records, with the staging markers."""
    import pyarrow as pa

    from corpusforge.contract import finish_unit
    from corpusforge.hashing import sha256_bytes
    from corpusforge.layout import STAGING_RECORDS_SCHEMA, staging_index, staging_records, staging_tar
    from corpusforge.storage import parquet_bytes
    from corpusforge.tarshard import write_tar
    from tasks.staging.stage import to_sample

    size = math.ceil(sc.kept / sc.shards)
    part_size = math.ceil(sc.n / sc.parts)
    for s in range(sc.shards):
        records = []
        for i in range(s * size, min(sc.kept, (s + 1) * size)):
            image = b"\xff\xd8" + i.to_bytes(8, "little") + b"\xff\xd9"
            records.append({"key": _key(i), "part": i // part_size, "row": i % part_size,
                            "sha256": sha256_bytes(image), "width": 64, "height": 48, "source": f"src{i % 3}",
                            "caption_type": "alt", "ext": "jpg", "bytes": len(image), "caption": f"caption {i}",
                            "_image": image})
        name = shard_name(s)
        tar, index, listing = staging_tar(name), staging_index(name), staging_records(name)
        with store.atomic_write(tar) as f:
            result = write_tar(f, (to_sample(r, r["_image"]) for r in records))
        table = pa.Table.from_pylist([{c: r[c] for c in STAGING_RECORDS_SCHEMA.names} for r in records],
                                     schema=STAGING_RECORDS_SCHEMA)
        outputs = {tar: result.sha256, index: store.write_bytes(index, parquet_bytes(result.index)),
                   listing: store.write_bytes(listing, parquet_bytes(table))}
        finish_unit(store, tar, f"bench-{name}", outputs, {"shard": name, "count": result.count})


def _wfd_model() -> tuple[int, dict[str, Any]]:
    from tasks.shared.features.wfd import WeightFreeDescriptor

    model = WeightFreeDescriptor()
    return model.dim, model.fingerprint()


def _model(model_id: str) -> tuple[int, dict[str, Any]]:
    """Feature dimension and model fingerprint of the benchmark's 512-d model or wfd."""
    return (512, {"model_id": MODEL_512, "arch": "bench"}) if model_id == MODEL_512 else _wfd_model()


def refused_above(model_id: str) -> int | None:
    """The most vectors of ``model_id``'s features whose index the graph stage plans with the
    default index settings; it refuses more before building anything (choose_index in
    tasks/graph/index.py, documented in docs/near-duplicates.md). None: it plans every size to 10⁸."""
    from tasks.graph.index import choose_index
    from bench.scale_steps.graph import _near_config
    from tasks.shared.pair_score import PairScore

    dim, model = _model(model_id)
    cfg, form = _near_config(model_id).index, PairScore.from_model(model).form_dim(dim)

    def planned(n: int) -> bool:
        try:
            choose_index(cfg, n, form)
        except ValueError:
            return False
        return True

    lo, hi = 1, PROJECT[-1]
    if planned(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if planned(mid) else (lo, mid)
    return lo


def write_folder(path: str, n: int) -> None:
    """A source folder of ``n`` small image files, every tenth with a caption sidecar."""
    for i in range(n):
        sub = os.path.join(path, f"{i // 10_000:04d}")
        if i % 10_000 == 0:
            os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"{_key(i)}.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff\xd9")
        if i % 10 == 0:
            with open(os.path.join(sub, f"{_key(i)}.txt"), "w") as f:
                f.write(f"caption {i}")


def write_decisions(store, sc: Scale) -> None:
    """Near-duplicate decisions of every staged record, as the graph stage's decisions task
    writes them (tasks/graph/decisions.py: a file per staging shard in its schema, one row per
    record in shard order, component ids the root's node id and every record in a component,
    alone in one of size 1, then the stage's marker). NEAR_DUP_RATE of the records lie in
    components of 2 to 5 drawn over the whole corpus, so a component's members are in
    different staging shards; its first member is kept, the others are removed as tier-1
    pairs of it. Written once per size (the marker is written last)."""
    import pyarrow as pa

    from corpusforge.contract import finish_unit, read_marker
    from corpusforge.records import Status
    from tasks.graph.config import NearDedupConfig
    from tasks.graph.files import GRAPH_DECISIONS, NEAR_DECISION_SCHEMA, decisions_path
    from tasks.graph.two_tier import TIER1, reason_texts

    if read_marker(store, GRAPH_DECISIONS) is not None:
        return
    rng = np.random.default_rng(5)
    sizes = np.resize(np.array(NEAR_DUP_SIZES, np.int32), near_dup_components(sc.kept)[0])
    members = rng.permutation(sc.kept)[:int(sizes.sum())]
    comp = np.repeat(np.arange(len(sizes)), sizes)
    root, size = np.arange(sc.kept), np.ones(sc.kept, np.int32)
    root[members] = members[np.cumsum(sizes) - sizes][comp]
    size[members] = sizes[comp]
    sim = np.zeros(sc.kept, np.float32)
    sim[members] = rng.uniform(0.97, 0.99, len(members))
    cfg = NearDedupConfig()
    removed_reason = reason_texts(cfg.pair_removal_above, cfg.min_component_size)[TIER1]
    per_shard = math.ceil(sc.kept / sc.shards)  # as write_staging deals the records
    outputs = {}
    for s in range(sc.shards):
        ids = np.arange(s * per_shard, min(sc.kept, (s + 1) * per_shard))
        removed = (root[ids] != ids).tolist()
        table = pa.table({
            "key": [_key(i) for i in ids.tolist()],
            "status": [Status.NEAR_DUPLICATE.value if r else Status.KEPT.value for r in removed],
            "reason": [removed_reason if r else None for r in removed],
            "duplicate_of": [_key(k) if r else None for k, r in zip(root[ids].tolist(), removed, strict=True)],
            "component_id": root[ids], "component_size": size[ids], "max_similarity": sim[ids],
        }, schema=NEAR_DECISION_SCHEMA)
        outputs[decisions_path(shard_name(s))] = store.write_parquet(decisions_path(shard_name(s)), table)
    finish_unit(store, GRAPH_DECISIONS, "bench-decisions", outputs,
                {"images": sc.kept, "removed": sc.kept - sc.released})


def write_release_assignment(store, sc: Scale, data: str) -> None:
    """The release assignment files and summary, for the release writer (as the release_plan step writes them,
    with the near-duplicate decisions: when that step ran at this size first, its plan is this
    input, and planning is not repeated)."""
    from tasks.release.shards import assign_release_files, write_staged_list
    from tasks.release.splits import SplitConfig

    if os.path.exists(_release_assignment_path(data)):  # written after the plan's files: they are complete
        return

    write_decisions(store, sc)
    staged = write_staged_list(store, [shard_name(s) for s in range(sc.shards)])
    assignment = assign_release_files(store, staged, SplitConfig(), near_dedup=True)
    with open(_release_assignment_path(data), "w") as f:
        json.dump(assignment, f)


INPUTS: dict[str, Callable[[Any, Scale, str], None]] = {
    "ingest": lambda store, sc, src: write_ingest(store, sc),
    "staging": lambda store, sc, src: write_staging(store, sc),
    "folder": lambda store, sc, src: write_folder(src, sc.n),
    "decisions": lambda store, sc, src: write_decisions(store, sc),
    "release_plan": lambda store, sc, src: write_release_assignment(store, sc, os.path.dirname(src)),
    # the resolved partitions, for steps that read them (the exact_dedup step writes the same)
    "resolved": lambda store, sc, src: dedup_and_resolve(store, sc),
}


def prepare(data: str, n: int, needs: list[str]) -> None:
    """Write the inputs ``needs`` names under ``data`` (each once: a ``.ready-*`` file marks it)."""
    from corpusforge.storage import Store

    store = Store(os.path.join(data, "out"), fsync=False)
    sc = Scale.of(n)
    for need in needs:
        flag = os.path.join(data, f".ready-{need}")
        if not os.path.exists(flag):
            started = time.perf_counter()
            INPUTS[need](store, sc, os.path.join(data, "src"))
            open(flag, "w").close()
            print(f"  inputs {need} at N={n}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


# ---- steps ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One global step: ``run(store, scale, data)`` calls its real code as the flow does and
    returns ``{"tasks": n, "params": [kwargs of each task, or a sample]}``."""

    name: str
    run: Callable[[Any, Scale, str], dict[str, Any]]
    needs: tuple[str, ...]
    role: str  # "flow": runs in the flow process (2 GB bound); "task": one task (16 GB)
    modules: tuple[str, ...]  # imported before the measurement starts
    linear: bool = True
    max_n: int | None = None  # larger sizes are not run (too slow here): reported as unmeasured there
    # the feature model whose index the graph stage refuses above a size (refused_above), or the size
    refused: str | int | None = None
    # the build runs the step only up to this many vectors (documented); sizes above it are not
    # run, the largest size run is this one, and there is no projection past it
    off_above: int | None = None
    # N -> what each of the step's task kinds grows with (default: N); its peak is projected by that
    task_sizes: Callable[[int], dict[str, int]] | None = None
    # N -> the facts that set the step's growth law (a count that stops at a cap, ...), computed by
    # the step's own code: a projection to N uses only measured sizes whose facts equal N's
    regime: Callable[[int], dict[str, Any]] | None = None


STEPS: dict[str, Step] = {}


def step(name: str, needs: tuple[str, ...], role: str, modules: tuple[str, ...], max_n: int | None = None,
         regime: Callable[[int], dict[str, Any]] | None = None):
    def register(fn: Callable[[Any, Scale, str], dict[str, Any]]) -> Callable[[Any, Scale, str], dict[str, Any]]:
        STEPS[name] = Step(name, fn, needs, role, modules, max_n=max_n, regime=regime)
        return fn
    return register


def _ingest_markers(store, sc: Scale) -> list[dict[str, Any]]:
    from corpusforge.contract import require_marker
    from tasks.ingest.files import ingest_path

    return [require_marker(store, ingest_path(p), "ingest") for p in range(sc.parts)]


def _dedup_regime(n: int) -> dict[str, Any]:
    """Exact dedup's bucket count (StagingConfig.buckets_for): it grows with the partitions
    until its cap, and a bucket task's rows grow with N from there."""
    return {"buckets": Scale.of(n).buckets}


def dedup_and_resolve(store, sc: Scale) -> dict[str, Any]:
    """Key uniqueness, exact duplicates and resolve, every unit in turn in the flow's order:
    its task count, largest parameters per fan-out and records removed."""
    from corpusforge.contract import remove_tree
    from tasks.ingest.files import DEDUP_HASHES_DIR, DEDUP_KEYS_DIR, EXACT_DIR, KEYDUP_DIR, RESOLVED_DIR
    from tasks.ingest.exact_dedup import deduplicate

    for folder in (DEDUP_KEYS_DIR, DEDUP_HASHES_DIR, KEYDUP_DIR, EXACT_DIR, RESOLVED_DIR):
        remove_tree(store, folder)
    ingested = _ingest_markers(store, sc)
    params: list[dict[str, Any]] = []
    tasks = 0

    class Counting:  # each unit in turn, as in_process, counting tasks and keeping the largest parameters
        def stream(self, unit: Any, calls: list[dict[str, Any]], sink: Any) -> None:
            nonlocal tasks
            tasks += len(calls)
            params.append(max(calls, key=lambda c: len(pickle.dumps(c))))
            for i, c in enumerate(calls):
                sink(i, unit.fn(**c))

    survivors = 0

    def count(part: int, result: Any) -> None:
        nonlocal survivors
        survivors += result.info["survivors"]

    deduplicate(store, [m.digest for m in ingested], len(ingested), sc.buckets, 1000, count, Counting())
    removed = sum(m.info["records"] for m in ingested) - survivors
    return {"tasks": tasks, "params": params, "removed": removed}


@step("exact_dedup", ("ingest",), "task", ("tasks.ingest.exact_dedup",), regime=_dedup_regime)
def run_exact_dedup(store, sc: Scale, data: str) -> dict[str, Any]:
    """Exact dedup (peak: the largest unit)."""
    return dedup_and_resolve(store, sc)


def _release_assignment_path(data: str) -> str:
    return os.path.join(data, "release-plan.json")


@step("release_plan", ("staging", "decisions"), "task", ("tasks.release.shards", "tasks.release.splits"))
def run_release_plan(store, sc: Scale, data: str) -> dict[str, Any]:
    """Release assignment (one task) over every staging shard with their near-duplicate decisions,
    as tasks/release/publish.py calls it in a default build: the staging-shard list goes to a
    file and the task gets its SHA-256."""
    from tasks.release.shards import assign_release_files, write_staged_list
    from tasks.release.splits import SplitConfig

    kwargs = dict(store=store, staged=write_staged_list(store, [shard_name(s) for s in range(sc.shards)]),
                  cfg=SplitConfig(), near_dedup=True)
    assignment = assign_release_files(**kwargs)
    with open(_release_assignment_path(data), "w") as f:
        json.dump(assignment, f)
    return {"tasks": 1, "params": [kwargs]}


def _writer_regime(n: int) -> dict[str, Any]:
    """Whether the train split fills a shard, so that it is dealt over more than one from
    there: the first train shard, the one the release_writer step writes, holds all of the
    split below it, and between half of ``shard_size`` and ``shard_size`` records from there
    (7,951 at 10k, 7,952 at 20k, 11,358 at 100k, 12,423 at 1M, with the near-duplicate decisions)."""
    from tasks.release.splits import SplitConfig

    cfg = SplitConfig()
    return {"train shard full": Scale.of(n).released * (1 - cfg.val - cfg.test) >= cfg.shard_size}


@step("release_writer", ("staging", "release_plan"), "task", ("tasks.release.shards", "tasks.release.splits"),
      regime=_writer_regime)
def run_release_writer(store, sc: Scale, data: str) -> dict[str, Any]:
    """One release writer (the first train shard), from the assignment file release_plan wrote:
    it reads its plan and the staging spans it ships. The peak is the writer's own: the
    plan's summary, which the flow holds, is read before it is reset."""
    from corpusforge.contract import marker_path
    from tasks.release.files import release_tar
    from tasks.release.shards import write_release_shard
    from tasks.release.splits import SplitConfig

    with open(_release_assignment_path(data)) as f:
        assignment = json.load(f)
    cfg = SplitConfig()
    name = sorted(n for n in assignment["shards"] if assignment["shards"][n]["split"] == "train")[0]
    shard, tasks = assignment["shards"][name], len(assignment["shards"])
    store.remove(marker_path(release_tar("train", shard["index"], cfg.layout)))
    kwargs = dict(store=store, split="train", shard=shard["index"], cfg=cfg,
                  assignment_sha256=assignment["plans"][name]["sha256"])
    del assignment
    start = _reset_peak()
    write_release_shard(**kwargs)
    return {"tasks": tasks, "params": [kwargs], "records": shard["count"],
            "peak_rss": _status_bytes("VmHWM:") - start}


def _reset_peak() -> int:
    """Reset this process's peak RSS (VmHWM) to its current size; return that size."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS:")


@step("receipt", ("ingest", "staging", "features512"), "flow", ("tasks.report.receipt",))
def run_receipt(store, sc: Scale, data: str) -> dict[str, Any]:
    """The receipt's output list from the markers, written beside it (runs in the flow process)."""
    from tasks.report.receipt import write_output_list

    return {"tasks": 0, "params": [], "outputs": write_output_list(store)["files"]}


@step("folder_listing", ("folder",), "task", ("tasks.ingest.sources",))
def run_folder_listing(store, sc: Scale, data: str) -> dict[str, Any]:
    """Planning a source folder (one task, "plan-inputs"): its listing spilled and sorted
    out of core, the input chunks written."""
    import pyarrow.parquet as pq

    from corpusforge.contract import marker_path
    from tasks.ingest.files import input_path
    from tasks.ingest.sources import TABLE_CUTS, SourceConfig, cut_partitions

    cfg = SourceConfig()
    kwargs = dict(src=os.path.join(data, "src"), store=store, cfg=cfg)
    # a listed folder is probed on the next run (its cut read back): each run lists it again
    store.remove(marker_path(TABLE_CUTS))
    _, parts = cut_partitions(**kwargs)
    # the others are full; read natively: a parquet read through a Python file object can
    # leave an arrow I/O thread that aborts the child at exit
    last = pq.read_metadata(store.path(input_path(parts[-1].index))).num_rows
    return {"tasks": 1, "params": [kwargs], "rows": (len(parts) - 1) * cfg.partition_size + last}


# ---- steps of the other areas ---------------------------------------------------------
# Each area's adapters live in bench/scale_steps/<area>.py: they register with @step, add
# their inputs to INPUTS and their names to FIXED and GUARDED, so an area is added without
# editing this file.

def _load_area_steps() -> None:
    import importlib
    import pkgutil

    sys.modules.setdefault("bench.scale", sys.modules[__name__])  # run as a script: one registry
    from bench import scale_steps

    for info in sorted(pkgutil.iter_modules(scale_steps.__path__), key=lambda m: m.name):
        importlib.import_module(f"bench.scale_steps.{info.name}")


_load_area_steps()


# ---- one step in a child process ------------------------------------------------------

def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def child(name: str, data: str, n: int) -> dict[str, Any]:
    """Run one step and measure it (called in a fresh process, under :func:`bench.opens.traced`:
    the files it opens are counted by the parent from the trace, between the marks set here)."""
    import importlib

    from bench import opens

    counting = install_counting_fs()
    for module in STEPS[name].modules:  # imported first: the measurement is the step's own work
        importlib.import_module(module)
    from corpusforge.storage import Store

    store = Store(os.path.join(data, "out"), fsync=False)
    sc = Scale.of(n)
    base = _reset_peak()
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    opens.mark("start")
    started = time.perf_counter()
    result = STEPS[name].run(store, sc, data)
    wall = time.perf_counter() - started
    opens.mark("end")
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    params = [len(pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL)) for p in result.pop("params")]
    peak = result.pop("peak_rss", None)  # a step of several tasks measures its largest itself
    result.pop("files_elsewhere", None)  # the trace sees the opens of FAISS and of the step's processes
    regime = STEPS[name].regime
    return {"step": name, "n": n, "wall_s": wall,
            "cpu_s": sum(a.ru_utime + a.ru_stime - u.ru_utime - u.ru_stime for a, u in zip(after, usage, strict=True)),
            "base_rss": base, "peak_rss": max(_status_bytes("VmHWM:") - base if peak is None else peak, 0),
            "maxrss": after[0].ru_maxrss * 1024, "fsspec_opened": counting.opened,
            "bytes_read": counting.bytes_read + result.pop("bytes_elsewhere", 0), "params_max": max(params, default=0),
            "regime": regime(n) if regime else None, **result}


# ---- fits, projections, table --------------------------------------------------------

def fit(ns: list[float], ys: list[float]) -> tuple[float, float] | None:
    """(a, b) of y = a·N^b by least squares in log-log; None with fewer than 2 positive points.
    Points all at one N (a task size at its cap) give b = 0 and their largest y."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys, strict=True) if y > 0 and n > 0]
    if len(pts) < 2:
        return None
    if len({x for x, _ in pts}) == 1:
        return math.exp(max(y for _, y in pts)), 0.0
    b, log_a = np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)
    return float(math.exp(log_a)), float(b)


def line(ns: list[float], ys: list[float], n: float) -> float | None:
    """The straight line through the last two points, at ``n``: never below the last point
    (a fall between two sizes is not projected as a further fall)."""
    if len(ns) < 2:
        return None
    (n1, y1), (n2, y2) = sorted(zip(ns, ys, strict=True))[-2:]
    if n2 == n1:
        return max(y1, y2)
    return max(y2, y2 + (y2 - y1) / (n2 - n1) * (n - n2))


def last_b(ns: list[float], ys: list[float]) -> float | None:
    """The growth exponent between the last two points."""
    (n1, y1), (n2, y2) = sorted(zip(ns, ys, strict=True))[-2:] if len(ns) >= 2 else ((0, 0), (0, 0))
    if min(n1, y1, y2) <= 0 or n1 == n2:
        return None
    return math.log(y2 / y1) / math.log(n2 / n1)


def project(f: tuple[float, float] | None, n: float) -> float | None:
    return None if f is None else f[0] * n ** f[1]


def _size(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if x >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} B"


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 86400:
        return f"{x / 86400:.1f} d"
    return f"{x / 3600:.1f} h" if x >= 3600 else f"{x:.1f} s" if x < 600 else f"{x / 60:.0f} min"


def _n(n: float) -> str:
    for unit, scale in (("M", 10**6), ("k", 10**3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def _b(b: float | None) -> str:
    return "-" if b is None else f"{b:.2f}"


def _regime_of(st: Step, r: dict[str, Any]) -> Any:
    return r.get("regime") if r.get("regime") is not None else st.regime(r["n"])


def in_regime(st: Step, runs: list[dict[str, Any]], n: float) -> list[dict[str, Any]]:
    """The measured runs a projection to ``n`` may use: those whose regime is ``n``'s (all of
    them for a step without one)."""
    if st.regime is None:
        return runs
    target = st.regime(int(n))
    return [r for r in runs if _regime_of(st, r) == target]


@dataclass
class Projection:
    """One measure of one step at one N: the fit's value, the last two points' line, and
    the larger, which the bound is checked against (None: not measured in N's regime)."""

    fit: float | None
    line: float | None

    @property
    def checked(self) -> float | None:
        values = [x for x in (self.fit, self.line) if x is not None]
        return max(values) if values else None

    def show(self, fmt: Callable[[float | None], str]) -> str:
        return "unmeasured" if self.checked is None else f"{fmt(self.fit)} / {fmt(self.line)}"


def _measure(runs: list[dict[str, Any]], key: str, n: float, offset: float = 0.0) -> Projection:
    ns, ys = [r["n"] for r in runs], [r[key] for r in runs]
    if len(ns) < 2:
        return Projection(None, None)
    f, straight = project(fit(ns, ys), n), line(ns, ys, n)
    return Projection(None if f is None else offset + f, None if straight is None else offset + straight)


def _task_rss(st: Step, runs: list[dict[str, Any]], n: float, base: float) -> Projection:
    """The largest task's RSS at ``n``: each task kind's peak fitted and lined on what it grows with."""
    best = Projection(None, None)
    for kind in runs[-1]["task_peaks"]:
        xs = [st.task_sizes(r["n"])[kind] for r in runs]
        ys = [r["task_peaks"].get(kind, 0) for r in runs]
        at = st.task_sizes(int(n))[kind]
        p = Projection(None if (f := project(fit(xs, ys), at)) is None else base + f,
                       None if (s := line(xs, ys, at)) is None else base + s)
        if best.checked is None or (p.checked or 0) > best.checked:
            best = p
    return best


def analyse(name: str, runs: list[dict[str, Any]], expected: list[int], acceptance: bool = True) -> dict[str, Any]:
    """Projections of one step to each N of PROJECT from its runs in that N's regime, the
    bounds it breaks at PROJECT[0] (on the larger of fit and line), and what is unmeasured
    (with ``acceptance``, also fewer than 3 sizes or none at 1M)."""
    st = STEPS[name]
    ns = [r["n"] for r in runs]
    off = st.off_above
    unmeasured = [f"not run at N={_n(n)}" + (f" (max_n {_n(st.max_n)})" if st.max_n and n > st.max_n else "")
                  for n in expected if n not in ns and not (off and n > off)]
    top = min(1_000_000, off or 1_000_000)
    if acceptance and (len(ns) < 3 or max(ns) < top):
        unmeasured.append(f"measured at {len(ns)} size(s) up to N={_n(max(ns))}: needs 3 or more, up to {_n(top)}")
    base = max(r["base_rss"] for r in runs)
    out: dict[str, Any] = {"sizes": ns, "projections": {}, "broken": [], "unmeasured": unmeasured}
    refused = st.refused if isinstance(st.refused, int) else refused_above(st.refused) if st.refused else None
    out["refused_above"], out["refused_at"], out["notes"] = refused, set(), []
    if off:
        out["notes"].append(f"off above {off:,d} vectors (documented)")
    for n in PROJECT:
        if (refused is not None and n > refused) or (off and n > off):  # not run there: no projection is its cost
            out["refused_at"].add(n)
            continue
        try:
            pts = in_regime(st, runs, n)
            proj = {"cpu": _measure(pts, "cpu_s", n), "params": _measure(pts, "params_max", n),
                    "rss": (_task_rss(st, pts, n, base) if st.task_sizes is not None and pts
                            and all("task_peaks" in r for r in pts) else _measure(pts, "peak_rss", n, base))}
        except ValueError as e:  # the step's own planning refuses N (the graph index at 10⁹)
            out["refused_at"].add(n)
            out["notes"].append(f"refused at N={n:.0e}: {str(e).split(':')[0]}")
            continue
        if st.regime is not None and len(pts) < 2:
            facts = ", ".join(f"{k}={v}" for k, v in st.regime(int(n)).items())
            if not any(u.startswith(facts) for u in out["unmeasured"]):  # 10⁹ in 10⁸'s regime: said once
                out["unmeasured"].append(f"{facts} (N={n:.0e}): {len(pts)} measured size(s) with it, needs 2")
        out["projections"][n] = proj
    pts = in_regime(st, runs, PROJECT[0])
    for key, label in (("cpu_s", "cpu time"), ("files_opened", "files opened")):
        if key == "cpu_s" and not st.linear:
            continue
        if any(r[key] is None for r in pts):
            out["unmeasured"].append(f"{label} not counted by the OS (a row from before bench/opens.py: rerun it)")
            continue
        xs, ys = [r["n"] for r in pts], [r[key] for r in pts]
        f = fit(xs, ys) if len(xs) >= 2 else None
        bs = [b for b in (f[1] if f else None, last_b(xs, ys)) if b is not None]
        out[f"b_{key}"] = (f[1] if f else None, last_b(xs, ys))
        if bs and max(bs) > GROWTH_BOUND:
            out["broken"].append(f"{label} b={max(bs):.2f} > {GROWTH_BOUND}")
    at = out["projections"].get(PROJECT[0], {})
    bound = FLOW_BOUND if st.role == "flow" else TASK_BOUND
    if "rss" in at and (rss := at["rss"].checked) is not None and rss > bound:
        out["broken"].append(f"{st.role} memory {_size(rss)} at 1e8 > {_size(bound)}")
    if "params" in at and (params := at["params"].checked) is not None and params > PARAMS_BOUND:
        out["broken"].append(f"params {_size(params)} per task at 1e8 > {_size(PARAMS_BOUND)}")
    return out


def verdict(a: dict[str, Any]) -> str:
    """FAIL (a bound broken), UNMEASURED (a size or a regime not measured) or ok."""
    notes = [f"refused above {a['refused_above']:,d} vectors (documented)"] if a["refused_above"] else []
    notes += a["notes"]
    if a["broken"]:
        return "FAIL: " + "; ".join(a["broken"] + a["unmeasured"] + notes)
    if a["unmeasured"]:
        return "UNMEASURED: " + "; ".join(a["unmeasured"] + notes)
    return "; ".join(["ok", *notes])


def task_runs(sizes: list[int]) -> tuple[list[str], list[str]]:
    """Prefect task runs per build at each N (computed from the unit counts), and the bounds broken."""
    lines, broken = [], []
    for n in [*sizes, *PROJECT]:
        try:
            per_unit, batched = Scale.of(n).prefect_runs()
        except ValueError as e:  # the graph index planned for it is refused (a 512-d IVF-PQ above 16 GiB)
            lines.append(f"  N={n:>13,d}: not planned: {str(e).split(':')[0]}")
            if n <= PROJECT[0]:
                broken.append(f"task runs per build at N={n:,d}: {e}")
            continue
        over = batched > RUNS_BOUND
        lines.append(f"  N={n:>13,d}: {per_unit:>13,d} -> {batched:>7,d}"
                     + (f"  FAIL > {RUNS_BOUND:,d}" if over else ""))
        if over:
            broken.append(f"task runs per build: {batched:,d} at N={n:,d} > {RUNS_BOUND:,d}")
    return lines, broken


def report(results: dict[str, list[dict[str, Any]]], expected: list[int], markdown: bool = False,
           strict: bool = True) -> list[str]:
    """Print the measurements and the table (as markdown with ``markdown``); return the broken
    bounds of the FIXED steps and the task runs, and with ``strict`` their unmeasured sizes and regimes."""
    sizes = sorted({r["n"] for runs in results.values() for r in runs})
    print("\nper size: wall s / cpu s / peak MB above start / files opened (OS) / MB read (fsspec) / max params KB"
          " / tasks")
    for name, runs in results.items():
        for r in runs:
            print(f"  {name:18s} N={r['n']:>9,d}  {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['peak_rss'] / 2**20:9.1f}"
                  f" {'-' if r['files_opened'] is None else format(r['files_opened'], ','):>9s}"
                  f" {r['bytes_read'] / 2**20:9.1f} {r['params_max'] / 1024:9.1f}"
                  f" {r['tasks']:>7,d}" + (f"  {r['regime']}" if r.get("regime") else ""))
            if "task_peaks" in r:
                print("    peak MB per task: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in r["task_peaks"].items()))
    print("\nprojections, extrapolated, not measured: 'fit / line' = the log-log fit a·N^b over the sizes in the"
          " target's regime / the straight line through the last two of them; bounds are checked at 1e8 against"
          f" the larger (time: CPU time of all the step's tasks; RSS: the largest task, or the flow process; b: fit"
          f" / last two sizes, each ≤ {GROWTH_BOUND})")
    p8, p9 = PROJECT
    header = ("step", "runs in", "sizes", "b CPU", "b files", "CPU 1e8", "CPU 1e9", "RSS 1e8", "RSS 1e9",
              "params 1e8", "bound", "verdict")
    rows, failures, reasons = [], [], []
    for name, runs in results.items():
        a = analyse(name, runs, expected, acceptance=strict)
        v = verdict(a)
        if name in FIXED and (a["broken"] or (strict and a["unmeasured"])):
            failures += [f"{name}: {b}" for b in a["broken"] + (a["unmeasured"] if strict else [])]
        pr = a["projections"]
        flow = STEPS[name].role == "flow"
        bound = ("" if markdown else f"{'flow' if flow else 'task'} ≤ ") + _size(FLOW_BOUND if flow else TASK_BOUND)
        rows.append((name, STEPS[name].role, ", ".join(_n(n) for n in a["sizes"]),
                     " / ".join(_b(b) for b in a.get("b_cpu_s", (None, None))),
                     " / ".join(_b(b) for b in a.get("b_files_opened", (None, None))),
                     *((("off" if STEPS[name].off_above else "refused") if n in a["refused_at"]
                        else pr[n][key].show(fmt))
                       for n, key, fmt in ((p8, "cpu", _secs), (p9, "cpu", _secs), (p8, "rss", _size),
                                           (p9, "rss", _size), (p8, "params", _size))),
                     bound,
                     v + (" [fixed]" if name in FIXED else "")))
        reasons.append(f"- {name}{' (fixed)' if name in FIXED else ''}: {v}")
    if markdown:  # the verdict's word in the table, its reasons below it (lines of docs stay narrow)
        for r in [header, tuple("---" for _ in header), *rows]:
            print("| " + " | ".join(str(c) for c in r[:-1]) + f" | {r[-1].split(':')[0].split(';')[0]} |")
        print("\n" + "\n".join(textwrap.fill(r, 110, subsequent_indent="  ", break_on_hyphens=False) for r in reasons))
    else:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
        for r in [header, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    lines, broken = task_runs(sizes)
    print(f"\nPrefect task runs per build, computed from unit counts (one per unit before issue 22; batched by "
          f"batch_count on {PREFECT_SLOTS} worker threads now; bound {RUNS_BOUND:,d}):")
    print("\n".join(lines))
    return failures + broken


# ---- running ---------------------------------------------------------------------------

def _round_up(n: int, digits: int) -> int:
    scale = 10 ** max(0, len(str(n)) - digits)
    return -(-n // scale) * scale


def sizes_for(name: str, sizes: list[int]) -> list[int]:
    """The sizes a step runs at: those asked for up to its ``max_n``; for a step with a regime,
    also the size where the regime of 10⁸ starts (rounded up) when fewer than two of the sizes
    asked for are in it and it starts below the largest, so its projections have two points."""
    st = STEPS[name]
    chosen = [n for n in sizes if (st.max_n is None or n <= st.max_n) and (st.off_above is None or n <= st.off_above)]
    if st.off_above and any(n > st.off_above for n in sizes):
        chosen = sorted({*chosen, st.off_above})
    if st.regime is None or not chosen:
        return chosen
    target, top = st.regime(PROJECT[0]), max(chosen)
    if st.regime(top) != target or sum(st.regime(n) == target for n in chosen) >= 2:
        return chosen
    lo, hi = 1, top  # the smallest N in the target regime (it is monotone: counts reach their caps)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if st.regime(mid) == target else (mid, hi)
    extra = next((m for m in (_round_up(hi, 1), _round_up(hi, 2), hi) if m < top), None)
    return sorted({*chosen, extra} - {None})


def measure(name: str, data: str, n: int) -> dict[str, Any]:
    """Run one step in a child process under strace; its files opened are counted from the trace."""
    from bench import opens

    log = f"{data}.opens-{name}.log"
    # Arrow on the C allocator: its default pool (mimalloc) keeps freed pages for a while, an
    # amount that varied by ±15 MB from run to run of one step at one size (graph_verify at 10k:
    # 94-106 MB over five runs, 68.2-68.8 MB on the C allocator, 2026-12-04), and the line through
    # two quick sizes multiplies what differs between them by ~1,000 on its way to 10⁸.
    env = dict(os.environ, **{opens.LOG_ENV: log, "ARROW_DEFAULT_MEMORY_POOL": "system"})
    cmd = opens.traced([sys.executable, __file__, "--child", name, "--data", data, "--n", str(n)], log)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"{name} at N={n:,d} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    r = json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")))
    r["files_opened"] = opens.count(log, data)
    for path in (log, f"{log}.start", f"{log}.end"):
        os.remove(path)
    return r


def measure_least(name: str, data: str, n: int) -> dict[str, Any]:
    """:func:`measure`, up to :data:`REPEATS` times for a step under :data:`REPEAT_BELOW_S` of CPU time: the least
    CPU time and the least peak count (their noise only adds: a neighbour's cache misses, pages
    a pool kept), so that the growth between two quick sizes is not a few ms of noise over a few
    ms of work; files and bytes are the first run's. A rerun must open about as many files (a
    step that clears its last outputs first opens a few more): one that found its work done
    and skipped it would be counted as the work."""
    runs = [measure(name, data, n)]
    while runs[0]["cpu_s"] < REPEAT_BELOW_S and len(runs) < REPEATS:
        runs.append(measure(name, data, n))
    opened = [r["files_opened"] for r in runs]
    if min(opened) < 0.9 * opened[0]:
        raise RuntimeError(f"{name} at N={n:,d} opened {opened} files in {len(runs)} runs: a rerun must do the "
                           "same work")
    memory = min(runs, key=lambda r: r["peak_rss"])
    least = dict(runs[0], runs=len(runs), peak_rss=memory["peak_rss"])
    if "task_peaks" in memory:
        least["task_peaks"] = memory["task_peaks"]
    least["cpu_s"], least["wall_s"] = min(r["cpu_s"] for r in runs), min(r["wall_s"] for r in runs)
    return least


def run_all(sizes: list[int], names: list[str], work: str, saved: str | None) -> dict[str, list[dict[str, Any]]]:
    """Run every step at its sizes (:func:`sizes_for`); with ``saved`` (a JSON-lines file), each
    measurement is appended as it comes and those already there are not run again (a long run resumes)."""
    done = []
    if saved and os.path.exists(saved):
        with open(saved) as f:
            done = [json.loads(line) for line in f if line.strip()]
    plan = {name: sizes_for(name, sizes) for name in names}
    results: dict[str, list[dict[str, Any]]] = {name: [r for r in done if r["step"] == name and r["n"] in plan[name]]
                                                for name in names}
    for n in sorted({n for ns in plan.values() for n in ns}):
        data = os.path.join(work, str(n))
        for name in [s for s in names if n in plan[s] and not any(r["n"] == n for r in results[s])]:
            # each step's inputs just before it (each written once): a long run's results come early
            subprocess.run([sys.executable, __file__, "--prepare", "--data", data, "--n", str(n), "--needs",
                            *STEPS[name].needs], check=True)
            r = measure_least(name, data, n)
            results[name].append(r)
            if saved:
                with open(saved, "a") as f:
                    f.write(json.dumps(r) + "\n")
            print(f"  {name} N={n:,d}: {r['wall_s']:.2f} s, peak +{r['peak_rss'] / 2**20:.0f} MB, "
                  f"{r['files_opened']:,d} files", file=sys.stderr, flush=True)
    return {k: sorted(v, key=lambda r: r["n"]) for k, v in results.items() if v}


def load(path: str, names: list[str], sizes: list[int] | None) -> dict[str, list[dict[str, Any]]]:
    """The measurements of ``names`` in a results file (at ``sizes`` and each step's extra
    regime sizes, or all). A row measured before files opened were counted by the OS has its
    fsspec count dropped (it misses DuckDB, scandir and FAISS): its files opened are unmeasured."""
    with open(path) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    runs = [r for r in runs if r["step"] in STEPS]
    for r in runs:
        if "fsspec_opened" not in r:
            r["fsspec_opened"], r["files_opened"] = r["files_opened"], None
    results = {}
    for name in names:
        keep = sizes_for(name, sizes) if sizes else None
        mine = sorted((r for r in runs if r["step"] == name and (keep is None or r["n"] in keep)),
                      key=lambda r: r["n"])
        if mine:
            results[name] = list({r["n"]: r for r in mine}.values())  # the last measurement of each size
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k and 100k only (the scale guard): unmeasured "
                                                         "regimes are shown but do not fail")
    ap.add_argument("--sizes", type=int, nargs="+")
    ap.add_argument("--steps", nargs="+", choices=list(STEPS), help="default: every step")
    ap.add_argument("--work", help="where inputs are written (default: a temporary folder, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the inputs (with --work: reused by the next run)")
    ap.add_argument("--results", help="JSON lines of measurements: appended as they come; a rerun skips those "
                                      "already there and reports them all")
    ap.add_argument("--markdown", action="store_true", help="print the summary table as markdown")
    ap.add_argument("--report", action="store_true", help="only report the measurements in --results (run "
                                                          "nothing): every step there, or --steps")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--needs", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prepare:
        prepare(args.data, args.n, args.needs)
        return 0
    if args.child:
        print(json.dumps(child(args.child, args.data, args.n)), flush=True)
        sys.stderr.flush()
        # measured and reported: leave without the interpreter's teardown, where a native thread
        # pool (FAISS, Arrow) sometimes aborted the child ("terminate called without an active
        # exception", graph_knn_cap, 1 run in 2) and failed a measurement that had succeeded
        os._exit(0)
    sizes = sorted(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    names = args.steps or list(STEPS)
    if args.report:
        results = load(args.results, names, args.sizes)
    else:
        work = args.work or tempfile.mkdtemp(prefix="corpusforge-scale-")
        try:
            results = run_all(sizes, names, work, args.results)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    failures = report(results, sizes, args.markdown, strict=not args.quick)
    for failure in failures:
        print(f"BOUND BROKEN OR UNMEASURED: {failure}")
    if not args.report:  # when and on how loaded a machine it was measured
        load1, load5, load15 = os.getloadavg()
        print(f"# measured until {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load1:.1f} "
              f"{load5:.1f} {load15:.1f}; exit status {int(bool(failures))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
