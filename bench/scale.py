"""Scale benchmark of the build's global steps, without images: growth laws and bounds at 10⁸.

For each size N it writes synthetic inputs in the real formats with the real writers and
markers (ingest rows and their dedup tables with ~3 % exact duplicates, staging tars,
indexes and records, float16 features with ~5 % planted near-duplicates in a 512-d
learned-model shape and the wfd shape, a source folder), with P = N / partition_size
ingest partitions and S = N / shard_size staging shards as the defaults set them. Then
each step runs in its own process (``--child``) and reports wall time, CPU time, peak
RSS above the process's resident size when the step started (``/proc/self/clear_refs``
resets the peak; a step of several tasks, the index build, resets it before each task and
reports the largest task's), files opened and bytes read through fsspec (a counting local
filesystem registered for ``file://`` in the child, so every ``Store`` uses it; files FAISS
maps itself, the index's lists, are added), the number of tasks and the largest pickled
parameters of one task. Peak RSS counts the pages of mapped files a task touched too.

The table fits time, peak memory, files opened and parameter size as ``a·N^b`` (log-log
least squares over the sizes run) and projects them to 10⁷ and 10⁸; a step the stage refuses
above a size (the graph index of wfd and of 512-d SQfp16, :func:`refused_above`) says so and
projects nothing past it. Bounds (issue 22):
a linear step fits b ≤ 1.2 for CPU time (wall time is shown too, but on a shared 2-core
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
import json
import math
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
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
PROJECT = (10**7, 10**8)
EXACT_DUP_RATE = 0.03
NEAR_DUP_RATE = 0.05
MODEL_512 = "bench512"
MODEL_WFD = "wfd"
FEATURE_BLOCK = 100_000  # vectors generated at a time (near-duplicates are planted within a block)
FLOW_BOUND = 2 << 30
TASK_BOUND = 16 << 30
PARAMS_BOUND = 64 << 10
RUNS_BOUND = 20_000
GROWTH_BOUND = 1.2
PREFECT_SLOTS = 64  # worker threads assumed for the task-run projection (batch_count caps it at 500 per fan-out)
# Steps rewritten to meet the bounds: the benchmark exits 1 when one of these breaks one.
FIXED: tuple[str, ...] = ("exact_dedup", "release_plan", "release_writer", "graph_single_tasks", "graph_driver",
                           "receipt", "faiss_build_512pq", "faiss_query_512pq", "folder_listing")
# The scale guard (tests/test_scale_guard.py, --quick) runs these: FIXED but the FAISS steps,
# which need an IVF-PQ index trained first (~2 min at 100k here; bench/graph.py covers FAISS).
GUARDED: tuple[str, ...] = tuple(s for s in FIXED if not s.startswith("faiss_"))


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
        from tasks.staging import StagingConfig

        parts = math.ceil(n / SourceConfig().partition_size)
        return cls(n, parts, max(1, round(n / StagingConfig().shard_size)), StagingConfig().buckets_for(parts))

    @property
    def kept(self) -> int:
        return self.n - int(self.n * EXACT_DUP_RATE)

    @property
    def release_shards(self) -> int:
        from tasks.release.splits import SplitConfig

        return math.ceil(self.kept / SplitConfig().shard_size)

    def fan_outs(self) -> dict[str, int]:
        """Units of each fan-out of a build (flows/build_corpus.py, tasks/ingest/exact_dedup.py,
        tasks/graph/stage.py, tasks/release/publish.py): one entry per ``run_tasks`` call; graph merge
        at its most, one group per shard (merge_groups sizes groups by found pairs); the index
        as a 512-d model's 10⁸ build plans it (IVF-PQ above flat_max_vectors: add blocks, merge)."""
        from tasks.ingest.exact_dedup import partition_groups
        from tasks.graph import build
        from tasks.graph.config import IndexConfig
        from tasks.graph.index import plan_index

        groups = len(partition_groups(self.parts, self.buckets))
        plan = plan_index(IndexConfig(**IVF_PQ) if self.kept > IndexConfig().flat_max_vectors else IndexConfig(),
                          self.kept, 512)
        blocks = math.ceil(self.kept * plan.bytes_per_vector / build.ADD_BLOCK_BYTES) if plan.kind == "ivf" else 0
        return {"plan inputs": 1, "ingest": self.parts, "exchange keys": groups, "duplicate keys": self.buckets,
                "exchange hashes": groups, "exact duplicates": self.buckets, "resolve": groups,
                "staging": self.shards, "features": self.shards, "graph index": 1, "graph index add": blocks,
                "graph index merge": int(blocks > 0), "graph query": self.shards,
                "graph recall refs": self.shards, "graph merge": self.shards, "graph recall": 1,
                "graph review": 1, "graph verify": self.shards, "graph calibration": 1,
                "release plan": 1, "release": self.release_shards, "manifest": self.parts}

    def prefect_runs(self, slots: int = PREFECT_SLOTS) -> tuple[int, int]:
        """Task runs of a build: (one per unit, as before issue 22; batched as
        :func:`corpusforge.cluster.run_tasks` batches them on ``slots`` worker threads),
        plus the graph decisions and collision tasks the graph stage submits itself."""
        from corpusforge.cluster import batch_count

        units = self.fan_outs()
        return sum(units.values()) + 2, sum(batch_count(n, slots) for n in units.values()) + 2


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
    from corpusforge.layout import INGEST_SCHEMA, ingest_path
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
    from tasks.staging import to_sample

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
    default index settings; it refuses more before building anything (plan_index in
    tasks/graph/index.py, documented in docs/near-duplicates.md). None: it plans every size to 10⁸."""
    from tasks.graph.index import plan_index
    from tasks.shared.pair_score import PairScore

    dim, model = _model(model_id)
    cfg, form = _near_config(model_id).index, PairScore.from_model(model).form_dim(dim)

    def planned(n: int) -> bool:
        try:
            plan_index(cfg, n, form)
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


def write_features(store, sc: Scale, model_id: str) -> None:
    """Float16 features of every staged record (5 % planted near-duplicates) and their markers."""
    from bench.graph import make_vectors
    from corpusforge.feature_files import write_shard_features
    from corpusforge.layout import staging_records

    dim, model = _model(model_id)
    x, start, blocks = np.zeros((0, dim), np.float16), 0, 0
    for s in range(sc.shards):
        keys = store.read_parquet(staging_records(shard_name(s)), columns=["key", "sha256"])
        n = keys.num_rows
        if start + n > len(x):  # vectors in blocks (duplicates planted within a block): bounded memory at 1M
            fresh = make_vectors(min(FEATURE_BLOCK, sc.kept), dim, seed=blocks).astype(np.float16)
            x, start, blocks = np.concatenate([x[start:], fresh]), 0, blocks + 1
        write_shard_features(store, model_id, shard_name(s), keys["key"].to_pylist(), keys["sha256"].to_pylist(),
                             [True] * n, [None] * n, x[start:start + n], f"bench-{s}", {"model": model})
        start += n


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


def write_release_plan(store, sc: Scale, data: str) -> None:
    """The release plan files and summary, for the release writer (as the release_plan step writes them)."""
    from tasks.release.shards import plan_release_files, write_staged_list
    from tasks.release.splits import SplitConfig

    staged = write_staged_list(store, [shard_name(s) for s in range(sc.shards)])
    plan = plan_release_files(store, staged, SplitConfig(), near_dedup=False)
    with open(_release_plan_path(data), "w") as f:
        json.dump(plan, f)


INPUTS: dict[str, Callable[[Any, Scale, str], None]] = {
    "ingest": lambda store, sc, src: write_ingest(store, sc),
    "staging": lambda store, sc, src: write_staging(store, sc),
    "features512": lambda store, sc, src: write_features(store, sc, MODEL_512),
    "featureswfd": lambda store, sc, src: write_features(store, sc, MODEL_WFD),
    "folder": lambda store, sc, src: write_folder(src, sc.n),
    "release_plan": lambda store, sc, src: write_release_plan(store, sc, os.path.dirname(src)),
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
    max_n: int | None = None  # larger sizes are skipped (too slow here); the fit uses the rest
    refused: str | None = None  # the feature model whose index the graph stage refuses above a size
    # N -> what each of the step's task kinds grows with (default: N); its peak is projected by that
    task_sizes: Callable[[int], dict[str, int]] | None = None


STEPS: dict[str, Step] = {}


def step(name: str, needs: tuple[str, ...], role: str, modules: tuple[str, ...], max_n: int | None = None):
    def register(fn: Callable[[Any, Scale, str], dict[str, Any]]) -> Callable[[Any, Scale, str], dict[str, Any]]:
        STEPS[name] = Step(name, fn, needs, role, modules, max_n=max_n)
        return fn
    return register


def _ingest_markers(store, sc: Scale) -> list[dict[str, Any]]:
    from corpusforge.contract import require_marker
    from corpusforge.layout import ingest_path

    return [require_marker(store, ingest_path(p), "ingest") for p in range(sc.parts)]


@step("exact_dedup", ("ingest",), "task", ("tasks.ingest.exact_dedup",))
def run_exact_dedup(store, sc: Scale, data: str) -> dict[str, Any]:
    """Key uniqueness, exact duplicates and resolve, every unit in turn in the flow's order
    (peak: the largest unit)."""
    from corpusforge.contract import remove_tree
    from corpusforge.layout import DEDUP_HASHES_DIR, DEDUP_KEYS_DIR, EXACT_DIR, KEYDUP_DIR, RESOLVED_DIR
    from tasks.ingest.exact_dedup import deduplicate

    for folder in (DEDUP_KEYS_DIR, DEDUP_HASHES_DIR, KEYDUP_DIR, EXACT_DIR, RESOLVED_DIR):
        remove_tree(store, folder)
    ingested = _ingest_markers(store, sc)
    params: list[dict[str, Any]] = []
    tasks = 0

    def fan_out(unit: Any, calls: list[dict[str, Any]]) -> list[Any]:
        nonlocal tasks
        tasks += len(calls)
        params.append(max(calls, key=lambda c: len(pickle.dumps(c))))
        return [unit.fn(**c) for c in calls]

    _, resolved = deduplicate(store, ingested, sc.buckets, 1000, fan_out)
    removed = sum(m.info["records"] for m in ingested) - sum(m.info["survivors"] for m in resolved)
    return {"tasks": tasks, "params": params, "removed": removed}


def _release_plan_path(data: str) -> str:
    return os.path.join(data, "release-plan.json")


@step("release_plan", ("staging",), "task", ("tasks.release.shards", "tasks.release.splits"))
def run_release_plan(store, sc: Scale, data: str) -> dict[str, Any]:
    """Release planning (one task) over every staging shard, as tasks/release/publish.py calls it:
    the staging-shard list goes to a file and the task gets its SHA-256."""
    from tasks.release.shards import plan_release_files, write_staged_list
    from tasks.release.splits import SplitConfig

    kwargs = dict(store=store, staged=write_staged_list(store, [shard_name(s) for s in range(sc.shards)]),
                  cfg=SplitConfig(), near_dedup=False)
    plan = plan_release_files(**kwargs)
    with open(_release_plan_path(data), "w") as f:
        json.dump(plan, f)
    return {"tasks": 1, "params": [kwargs]}


@step("release_writer", ("staging", "release_plan"), "task", ("tasks.release.shards", "tasks.release.splits"))
def run_release_writer(store, sc: Scale, data: str) -> dict[str, Any]:
    """One release writer (the first train shard), from the plan file release_plan wrote:
    it reads its plan and the staging spans it ships."""
    from corpusforge.contract import marker_path
    from corpusforge.layout import release_tar
    from tasks.release.shards import write_release_shard
    from tasks.release.splits import SplitConfig

    with open(_release_plan_path(data)) as f:
        plan = json.load(f)
    cfg = SplitConfig()
    name = sorted(n for n in plan["shards"] if plan["shards"][n]["split"] == "train")[0]
    shard = plan["shards"][name]
    store.remove(marker_path(release_tar("train", shard["index"], cfg.layout)))
    kwargs = dict(store=store, split="train", shard=shard["index"], cfg=cfg, plan_sha256=plan["plans"][name]["sha256"])
    write_release_shard(**kwargs)
    return {"tasks": len(plan["shards"]), "params": [kwargs], "records": shard["count"]}


@step("graph_single_tasks", ("staging", "features512"), "flow", ("tasks.graph.stage",))
def run_graph_single_tasks(store, sc: Scale, data: str) -> dict[str, Any]:
    """The parameters of the graph stage's one-off tasks (recall, review pairs, decisions,
    collision models, calibration sheet) as near_duplicate_stage builds them
    (tasks.graph.stage.single_calls), with the shard table and the per-shard digest lists
    written as the stage writes them. The edge and verification digests are stand-ins of
    the same size (the feature digests)."""
    from corpusforge.contract import require_marker
    from corpusforge.layout import staging_records, staging_tar
    from tasks.graph.edges import feature_digests
    from tasks.graph.nodes import plan_nodes, write_shard_digests, write_shard_table
    from tasks.graph.stage import single_calls

    cfg = _near_config(MODEL_512)
    nodes = plan_nodes(store, [shard_name(s) for s in range(sc.shards)])
    digests = feature_digests(store, cfg, nodes)
    table = write_shard_table(store, nodes, digests)
    records = [require_marker(store, staging_tar(s), "staging shard").outputs[staging_records(s)]
               for s in nodes.shards]
    edges = [digests[s] for s in nodes.shards]
    lists = {"edges": write_shard_digests(store, "edges", nodes, edges),
             "records": write_shard_digests(store, "records", nodes, records)}
    calls = single_calls(store, store, cfg, table, lists, nodes.n_nodes, {"collision": "0" * 64,
                                                                          "calibration": "0" * 64})
    calls["decisions"]["verified"] = write_shard_digests(store, "verified", nodes, edges)
    return {"tasks": len(calls), "params": list(calls.values())}


# The index the 10⁸ deployment of a 512-d model uses (near_dedup.index.storage: pq; the
# default sqfp16 is refused above 16 GiB per query worker): IVF at every size here, where
# ``auto`` would pick a flat index below 200k vectors.
IVF_PQ = {"kind": "ivf", "storage": "pq"}


def _near_config(model_id: str, index: dict[str, Any] | None = None):
    from tasks.graph.config import NearDedupConfig

    return NearDedupConfig(model_id=model_id, **({"index": index} if index else {}))


@step("graph_driver", ("staging", "features512"), "flow", ("tasks.graph.stage",))
def run_graph_driver(store, sc: Scale, data: str) -> dict[str, Any]:
    """The graph driver's planning, shard table and fan-out parameters (query/recall, merge,
    verify) as near_duplicate_stage builds them, without running the tasks."""
    from corpusforge.contract import require_marker
    from corpusforge.layout import staging_records, staging_tar
    from tasks.graph.edges import feature_digests, found_fingerprint, merge_groups
    from tasks.graph.nodes import plan_nodes, write_shard_table
    from tasks.graph.stage import shard_calls
    from tasks.graph.verify import records_fingerprint

    cfg = _near_config(MODEL_512)
    nodes = plan_nodes(store, [shard_name(s) for s in range(sc.shards)])
    digests = feature_digests(store, cfg, nodes)
    table = write_shard_table(store, nodes, digests)
    info = {"plan": {"kind": "ivf"}, "n_vectors": nodes.n_nodes, "dim": 512, "fingerprint": "0" * 64}
    query = shard_calls(store, store, cfg, table, digests, info)
    groups = merge_groups(nodes, [1] * len(nodes.shards), cfg.advanced.merge_max_edges)
    merge = [dict(out=store, shard_table=table, group=g, found=found_fingerprint(list(digests.values())))
             for g in groups]
    records = {s: require_marker(store, staging_tar(s), "staging shard").outputs[staging_records(s)]
               for s in nodes.shards}
    records_fp = records_fingerprint(records)
    verify = [dict(source=store, out=store, cfg=cfg, shard_table=table, shard=s, review_digest="0" * 64,
                   records=records_fp) for s in nodes.shards]
    return {"tasks": 2 * len(query) + len(merge) + len(verify), "params": [query[-1], merge[-1], verify[-1]]}


def _graph_out(data: str, tag: str):
    """The FAISS steps' output root, beside the corpus root (not inside it: its index files
    would be outputs of the corpus that no root marker records, and the receipt step would hash them)."""
    from corpusforge.storage import Store

    return Store(os.path.join(data, f"graph-{tag}"), fsync=False)


def _reset_peak() -> int:
    """Reset this process's peak RSS (VmHWM) to its current size; return that size."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS:")


def _unit_in_child(fn: Callable[..., Any], call: bytes) -> tuple[Any, int, int, int]:
    """Run one unit in this fresh (spawned) process, as a task runs on a worker: its result,
    peak RSS above the start, and the files and bytes it read through fsspec. ``call`` is
    pickled, so its stores are made after the counting filesystem is installed."""
    counting = install_counting_fs()
    kwargs = pickle.loads(call)
    base = _reset_peak()
    result = fn(**kwargs)
    return result, _status_bytes("VmHWM:") - base, counting.opened, counting.bytes_read


def _measured(runs: dict[str, Any]):
    """A fan-out (tasks/graph/build.py) that runs each unit in a process of its own, one at a
    time, and keeps per task kind the largest peak RSS and parameters, and the files and bytes
    all of them read (their CPU time reaches the step as its children's)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    def fan_out(unit: Any, calls: list[dict[str, Any]]) -> list[Any]:
        results = []
        for call in calls:
            with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
                result, peak, opened, read = pool.submit(_unit_in_child, unit.fn, pickle.dumps(call)).result()
            results.append(result)
            runs["task_peaks"][unit.fn.__name__] = max(runs["task_peaks"].get(unit.fn.__name__, 0), peak)
            runs["files_elsewhere"] += opened
            runs["bytes_elsewhere"] += read
        runs["params"].append(max(calls, key=lambda c: len(pickle.dumps(c))))
        return results
    return fan_out


def _index_task_sizes(index: dict[str, Any]) -> Callable[[int], dict[str, int]]:
    """What each index build task's memory follows at N records (a 512-d model): the training
    sample (capped by index.advanced.max_train), the vectors of one block (capped by its bytes of
    lists) and, for the merge, whose mapped file pages count in its RSS, the vectors of one
    range of lists (capped by the range's bytes)."""
    def sizes(n: int) -> dict[str, int]:
        from tasks.graph import build, ondisk
        from tasks.graph.config import IndexConfig
        from tasks.graph.index import plan_index

        kept = Scale.of(n).kept
        plan = plan_index(IndexConfig(**index), kept, 512)
        return {"prepare_index": plan.n_train,
                "add_block": min(kept, max(1, build.ADD_BLOCK_BYTES // plan.bytes_per_vector)),
                "merge_blocks": min(kept, max(1, ondisk.MERGE_RANGE_BYTES // plan.bytes_per_vector))}
    return sizes


def _faiss_build(model_id: str, index: dict[str, Any] | None = None, tag: str = ""):
    tag = tag or model_id

    def run(store, sc: Scale, data: str) -> dict[str, Any]:
        """Every unit of the index build in turn, each in a process of its own (prepare; for
        IVF the block adds and the merge): the step's peak is its largest task's."""
        from corpusforge.contract import remove_tree
        from corpusforge.layout import GRAPH_INDEX_DIR, GRAPH_INDEX_WORK
        from tasks.graph.build import build_index
        from tasks.graph.edges import feature_digests
        from tasks.graph.nodes import plan_nodes, write_shard_table

        out = _graph_out(data, tag)
        for folder in (GRAPH_INDEX_DIR, GRAPH_INDEX_WORK):
            remove_tree(out, folder)
        cfg = _near_config(model_id, index)
        nodes = plan_nodes(store, [shard_name(s) for s in range(sc.shards)])
        table = write_shard_table(out, nodes, feature_digests(store, cfg, nodes))
        runs: dict[str, Any] = {"task_peaks": {}, "params": [], "files_elsewhere": 0, "bytes_elsewhere": 0}
        info = build_index(store, out, cfg, table, _measured(runs))
        with open(os.path.join(data, f"index-{tag}.json"), "w") as f:
            json.dump(info, f)
        blocks = sum(info.get("blocks", {}).values())
        runs["files_elsewhere"] += blocks + 1 if blocks else 0  # FAISS maps the blocks' lists and writes the merged
        return {"tasks": 1 + blocks + (1 if blocks else 0), "plan": info["plan"]["factory"], "blocks": blocks,
                "peak_rss": max(runs["task_peaks"].values()), **runs}
    return run


def _faiss_query(model_id: str, index: dict[str, Any] | None = None, tag: str = ""):
    tag = tag or model_id

    def run(store, sc: Scale, data: str) -> dict[str, Any]:
        """One shard's queries: an IVF index's lists are mapped (their pages touched count in
        the peak RSS as file pages), a flat index read whole."""
        from tasks.graph.edges import feature_digests, query_shard
        from tasks.graph.nodes import plan_nodes, write_shard_table
        from tasks.graph.stage import shard_calls

        with open(os.path.join(data, f"index-{tag}.json")) as f:
            info = json.load(f)
        cfg = _near_config(model_id, index)
        out = _graph_out(data, tag)
        nodes = plan_nodes(store, [shard_name(s) for s in range(sc.shards)])
        digests = feature_digests(store, cfg, nodes)
        table = write_shard_table(out, nodes, digests)
        kwargs = dict(shard_calls(store, out, cfg, table, digests, info)[0], force=True)
        found = query_shard(**kwargs)
        return {"tasks": sc.shards, "params": [kwargs], "pairs": found.get("pairs"),
                "files_elsewhere": int(info["plan"]["kind"] == "ivf"),  # the lists FAISS maps
                "rss_file": _status_bytes("RssFile:")}
    return run


_GRAPH_MODULES = ("tasks.graph.edges", "tasks.graph.nodes", "faiss")
FAISS_MAX_N = 100_000  # index build and query at 1M take longer than this machine's share allows
STEPS["faiss_build_512"] = Step("faiss_build_512", _faiss_build(MODEL_512), ("staging", "features512"), "task",
                                _GRAPH_MODULES, max_n=FAISS_MAX_N, refused=MODEL_512)
STEPS["faiss_query_512"] = Step("faiss_query_512", _faiss_query(MODEL_512), ("staging", "features512"), "task",
                                _GRAPH_MODULES, max_n=FAISS_MAX_N, refused=MODEL_512)
# IVF-PQ (the index a 10⁸ build uses) runs at 1M too: ~4.5 min to train and add here.
STEPS["faiss_build_512pq"] = Step("faiss_build_512pq", _faiss_build(MODEL_512, IVF_PQ, "512pq"),
                                  ("staging", "features512"), "task", _GRAPH_MODULES,
                                  task_sizes=_index_task_sizes(IVF_PQ))
STEPS["faiss_query_512pq"] = Step("faiss_query_512pq", _faiss_query(MODEL_512, IVF_PQ, "512pq"),
                                  ("staging", "features512"), "task", _GRAPH_MODULES)
STEPS["faiss_build_wfd"] = Step("faiss_build_wfd", _faiss_build(MODEL_WFD), ("staging", "featureswfd"), "task",
                                _GRAPH_MODULES, max_n=FAISS_MAX_N, refused=MODEL_WFD)
STEPS["faiss_query_wfd"] = Step("faiss_query_wfd", _faiss_query(MODEL_WFD), ("staging", "featureswfd"), "task",
                                _GRAPH_MODULES, max_n=FAISS_MAX_N, refused=MODEL_WFD)


@step("receipt", ("ingest", "staging", "features512"), "flow", ("tasks.report.receipt",))
def run_receipt(store, sc: Scale, data: str) -> dict[str, Any]:
    """The receipt's output list from the markers, written beside it (runs in the flow process)."""
    from tasks.report.receipt import write_output_list

    return {"tasks": 0, "params": [], "outputs": write_output_list(store)["files"]}


@step("folder_listing", ("folder",), "task", ("tasks.ingest.sources", "duckdb"))
def run_folder_listing(store, sc: Scale, data: str) -> dict[str, Any]:
    """Planning a source folder (one task, "plan-inputs"): its listing spilled and sorted
    out of core, the input chunks written."""
    import pyarrow.parquet as pq

    from corpusforge.layout import input_path
    from tasks.ingest.sources import SourceConfig, plan_partitions

    cfg = SourceConfig()
    kwargs = dict(src=os.path.join(data, "src"), store=store, cfg=cfg)
    _, parts = plan_partitions(**kwargs)
    # the others are full; read natively: a parquet read through a Python file object can
    # leave an arrow I/O thread that aborts the child at exit
    last = pq.read_metadata(store.path(input_path(parts[-1].index))).num_rows
    return {"tasks": 1, "params": [kwargs], "rows": (len(parts) - 1) * cfg.partition_size + last}


# ---- one step in a child process ------------------------------------------------------

def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def child(name: str, data: str, n: int) -> dict[str, Any]:
    """Run one step and measure it (called in a fresh process)."""
    import importlib

    counting = install_counting_fs()
    for module in STEPS[name].modules:  # imported first: the measurement is the step's own work
        importlib.import_module(module)
    from corpusforge.storage import Store

    store = Store(os.path.join(data, "out"), fsync=False)
    sc = Scale.of(n)
    base = _reset_peak()
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    started = time.perf_counter()
    result = STEPS[name].run(store, sc, data)
    wall = time.perf_counter() - started
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    params = [len(pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL)) for p in result.pop("params")]
    peak = result.pop("peak_rss", None)  # a step of several tasks measures its largest itself
    return {"step": name, "n": n, "wall_s": wall,
            "cpu_s": sum(a.ru_utime + a.ru_stime - u.ru_utime - u.ru_stime for a, u in zip(after, usage, strict=True)),
            "base_rss": base, "peak_rss": max(_status_bytes("VmHWM:") - base if peak is None else peak, 0),
            "maxrss": after[0].ru_maxrss * 1024, "files_opened": counting.opened + result.get("files_elsewhere", 0),
            "bytes_read": counting.bytes_read + result.get("bytes_elsewhere", 0), "params_max": max(params, default=0),
            **result}


# ---- fits, projections, table --------------------------------------------------------

def fit(ns: list[int], ys: list[float]) -> tuple[float, float] | None:
    """(a, b) of y = a·N^b by least squares in log-log; None with fewer than 2 positive points."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys, strict=True) if y > 0]
    if len(pts) < 2:
        return None
    b, log_a = np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)
    return float(math.exp(log_a)), float(b)


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
    return f"{x / 3600:.1f} h" if x >= 3600 else f"{x:.1f} s" if x < 600 else f"{x / 60:.0f} min"


def _b(f: tuple[float, float] | None) -> str:
    return "-" if f is None else f"{f[1]:.2f}"


def analyse(name: str, runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Fits and projections of one step, and the bounds it breaks."""
    ns = [r["n"] for r in runs]
    time_fit = fit(ns, [r["wall_s"] for r in runs])
    cpu_fit = fit(ns, [r["cpu_s"] for r in runs])
    rss_fit = fit(ns, [r["peak_rss"] for r in runs])
    files_fit = fit(ns, [r["files_opened"] for r in runs])
    params_fit = fit(ns, [r["params_max"] for r in runs])
    base = max(r["base_rss"] for r in runs)
    out = {"time_fit": time_fit, "cpu_fit": cpu_fit, "rss_fit": rss_fit, "files_fit": files_fit,
           "params_fit": params_fit, "base": base, "cpu": [project(cpu_fit, n) for n in PROJECT],
           "rss": [None if rss_fit is None else base + project(rss_fit, n) for n in PROJECT],
           "params": [project(params_fit, n) for n in PROJECT]}
    st = STEPS[name]
    if st.task_sizes is not None and all("task_peaks" in r for r in runs):
        out["rss_by_task"] = by_task = {}
        for kind in runs[-1]["task_peaks"]:  # each task's peak fitted on what it grows with
            sizes = [st.task_sizes(r["n"])[kind] for r in runs]
            f = fit(sizes, [r["task_peaks"].get(kind, 0) for r in runs])
            by_task[kind] = {"fit": f, "sizes": sizes, "at": [st.task_sizes(n)[kind] for n in PROJECT],
                             "rss": [project(f, st.task_sizes(n)[kind]) for n in PROJECT]}
        out["rss"] = [base + max((t["rss"][i] or 0) for t in by_task.values()) for i in range(len(PROJECT))]
    broken = []
    if st.linear and cpu_fit and cpu_fit[1] > GROWTH_BOUND:
        broken.append(f"cpu time b={cpu_fit[1]:.2f} > {GROWTH_BOUND}")
    if files_fit and files_fit[1] > GROWTH_BOUND:
        broken.append(f"files opened b={files_fit[1]:.2f} > {GROWTH_BOUND}")
    bound = FLOW_BOUND if st.role == "flow" else TASK_BOUND
    out["refused_above"] = refused = refused_above(st.refused) if st.refused else None
    if refused is not None:  # nothing is built above it: no projection there is a step's cost
        for key in ("cpu", "rss", "params"):
            out[key] = [None if n > refused else x for n, x in zip(PROJECT, out[key], strict=True)]
    if out["rss"][-1] is not None and out["rss"][-1] > bound:
        broken.append(f"{st.role} memory {_size(out['rss'][-1])} at 1e8 > {_size(bound)}")
    if out["params"][-1] is not None and out["params"][-1] > PARAMS_BOUND:
        broken.append(f"params {_size(out['params'][-1])} per task at 1e8 > {_size(PARAMS_BOUND)}")
    return out, broken


def report(results: dict[str, list[dict[str, Any]]], markdown: bool = False) -> list[str]:
    """Print the table (the summary as markdown with ``markdown``); return the broken bounds
    of the FIXED steps."""
    sizes = sorted({r["n"] for runs in results.values() for r in runs})
    print("\nper size: wall s / cpu s / peak MB above start / files opened / MB read / max params KB / tasks")
    for name, runs in results.items():
        for r in runs:
            print(f"  {name:16s} N={r['n']:>9,d}  {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['peak_rss'] / 2**20:9.1f}"
                  f" {r['files_opened']:>9,d} {r['bytes_read'] / 2**20:9.1f} {r['params_max'] / 1024:9.1f}"
                  f" {r['tasks']:>7,d}")
            if "task_peaks" in r:
                print("    peak MB per task: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in r["task_peaks"].items()))
    print(f"\nfits over N = {', '.join(f'{n:,d}' for n in sizes)}; projections are extrapolated, not measured "
          "(time: CPU time, all of the step's tasks together; RSS: the largest task, or the flow process)")
    header = ("step", "b wall", "b cpu", "b RSS", "b files", "B/rec", "files/rec", "CPU 1e7", "CPU 1e8", "RSS 1e7",
              "RSS 1e8", "params 1e8", "verdict")
    rows = []
    failures = []
    by_task = []
    for name, runs in results.items():
        a, broken = analyse(name, runs)
        for kind, t in a.get("rss_by_task", {}).items():
            at = zip(PROJECT, t["at"], t["rss"], strict=True)
            by_task.append(f"  {name} {kind}: b={_b(t['fit'])} over {', '.join(f'{x:,d}' for x in t['sizes'])}; "
                           + ", ".join(f"{_size(r)} at {x:,d} (N={n:.0e})" for n, x, r in at))
        last = max(runs, key=lambda r: r["n"])
        refused = a["refused_above"]
        notes = [f"refused above {refused:,d} vectors (documented)"] if refused is not None else []
        verdict = "; ".join(notes + broken) or "ok"
        if broken and name in FIXED:
            failures += [f"{name}: {b}" for b in broken]
        shown = {key: [fmt(x) if refused is None or n <= refused else "refused"
                       for n, x in zip(PROJECT, a[key], strict=True)]
                 for key, fmt in (("cpu", _secs), ("rss", _size), ("params", _size))}
        cpu, rss, params = shown["cpu"], shown["rss"], shown["params"]
        rows.append((name, _b(a["time_fit"]), _b(a["cpu_fit"]), _b(a["rss_fit"]), _b(a["files_fit"]),
                     f"{last['peak_rss'] / last['n']:.0f}", f"{last['files_opened'] / last['n']:.3f}",
                     cpu[0], cpu[1], rss[0], rss[1], params[1],
                     verdict + (" [fixed]" if name in FIXED else "")))
    if markdown:
        for r in [header, tuple("---" for _ in header), *rows]:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
        for r in [header, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    if by_task:
        print("\nlargest task at 1e7 and 1e8 above: each task's peak fitted on what it grows with (the "
              "training sample, one block's vectors, one merge range's vectors), projected:")
        print("\n".join(by_task))
    print(f"\nPrefect task runs per build, computed from unit counts (one per unit before issue 22; "
          f"batched by batch_count on {PREFECT_SLOTS} worker threads now):")
    for n in [*sizes, *PROJECT]:
        per_unit, batched = Scale.of(n).prefect_runs()
        over = "" if batched <= RUNS_BOUND else f"  > {RUNS_BOUND:,d}"
        print(f"  N={n:>11,d}: {per_unit:>12,d} -> {batched:>7,d}{over}")
    return failures


def run_all(sizes: list[int], names: list[str], work: str, saved: str | None) -> dict[str, list[dict[str, Any]]]:
    """Run every step at every size; with ``saved`` (a JSON-lines file), each measurement is
    appended as it comes and those already there are not run again (a long run resumes)."""
    done = []
    if saved and os.path.exists(saved):
        with open(saved) as f:
            done = [json.loads(line) for line in f if line.strip()]
    results: dict[str, list[dict[str, Any]]] = {name: [r for r in done if r["step"] == name and r["n"] in sizes]
                                                for name in names}
    for n in sizes:
        data = os.path.join(work, str(n))
        chosen = [s for s in names if (STEPS[s].max_n is None or n <= STEPS[s].max_n)
                  and not any(r["n"] == n for r in results[s])]
        needs = sorted({need for s in chosen for need in STEPS[s].needs}, key=list(INPUTS).index)
        if chosen:
            subprocess.run([sys.executable, __file__, "--prepare", "--data", data, "--n", str(n), "--needs", *needs],
                           check=True)
        for name in chosen:
            proc = subprocess.run([sys.executable, __file__, "--child", name, "--data", data, "--n", str(n)],
                                  check=True, capture_output=True, text=True)
            r = json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")))
            results[name].append(r)
            if saved:
                with open(saved, "a") as f:
                    f.write(json.dumps(r) + "\n")
            print(f"  {name} N={n:,d}: {r['wall_s']:.2f} s, peak +{r['peak_rss'] / 2**20:.0f} MB, "
                  f"{r['files_opened']:,d} files", file=sys.stderr, flush=True)
    return {k: sorted(v, key=lambda r: r["n"]) for k, v in results.items() if v}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k and 100k only (the scale guard)")
    ap.add_argument("--sizes", type=int, nargs="+")
    ap.add_argument("--steps", nargs="+", choices=list(STEPS), help="default: every step")
    ap.add_argument("--work", help="where inputs are written (default: a temporary folder, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the inputs (with --work: reused by the next run)")
    ap.add_argument("--results", help="JSON lines of measurements: appended as they come; a rerun skips those "
                                      "already there and reports them all")
    ap.add_argument("--markdown", action="store_true", help="print the summary table as markdown")
    ap.add_argument("--report", action="store_true", help="only report the measurements in --results (run nothing)")
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
        print(json.dumps(child(args.child, args.data, args.n)))
        return 0
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    if args.report:
        with open(args.results) as f:
            runs = [json.loads(line) for line in f if line.strip()]
        names = args.steps or list(STEPS)
        failures = report({name: sorted((r for r in runs if r["step"] == name and r["n"] in sizes),
                                        key=lambda r: r["n"]) for name in names
                           if any(r["step"] == name and r["n"] in sizes for r in runs)}, args.markdown)
        return 1 if failures else 0
    work = args.work or tempfile.mkdtemp(prefix="corpusforge-scale-")
    try:
        results = run_all(sorted(sizes), args.steps or list(STEPS), work, args.results)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    failures = report(results, args.markdown)
    for failure in failures:
        print(f"BOUND BROKEN: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
