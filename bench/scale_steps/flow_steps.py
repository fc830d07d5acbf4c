"""Adapters of the build's steps that read data and run as units on the engine (issue 31):
the evaluation caption set, the reference statistics' manifest scan (with the manifest
hash), the input snapshot hash, the receipt's output list, the sweep of temporary files,
the reports, and the previous-version copy and diff. Each calls the step's real code as
the flow's unit does; each is one task ("task": the 16 GB bound).

Inputs added here: ``manifest`` (a manifest part per ingest partition in the real schema,
its rows the staged records with the splits, shards and tiers the release assignment gave them,
from the plan's late files), ``receipt`` (a receipt.json of the build's shape, with the
release section of the plan and a near-duplicate section), ``edges`` (graph edge files,
about 5 % of the records paired, similarity in [0.9, 1]) and ``previous`` (the copy of
the version the root holds, as a rebuild keeps it first).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from bench.scale import (FIXED, GUARDED, INPUTS, NEAR_DUP_RATE, STEPS, Scale, Step, _key, _release_assignment_path,
                         shard_name, step)


def write_manifest(store: Any, sc: Scale) -> None:
    """One manifest part per partition: every staged record with its placement (from the late
    files of the release assignment), in the manifest's schema (built column by column)."""
    import pyarrow as pa

    from corpusforge.layout import MANIFEST_SCHEMA, manifest_path
    from tasks.release.files import late_path

    part_size = math.ceil(sc.n / sc.parts)
    for part in range(sc.parts):
        if not store.exists(late_path(part)):
            continue
        late = store.read_parquet(late_path(part))
        ids = [part * part_size + r for r in late["row"].to_pylist()]
        made = {"key": [_key(i) for i in ids], "part": [part] * len(ids),
                "source_path": [f"/src/{_key(i)}.jpg" for i in ids], "sha256": [f"{i:064x}" for i in ids],
                "bytes": [10] * len(ids), "format": ["JPEG"] * len(ids), "width": [64] * len(ids),
                "height": [48] * len(ids), "source": [f"src{i % 3}" for i in ids]}
        columns = [pa.array(made[f.name], f.type) if f.name in made
                   else late[f.name].cast(f.type) if f.name in late.column_names
                   else pa.nulls(len(ids), f.type) for f in MANIFEST_SCHEMA]
        store.write_parquet(manifest_path(part), pa.Table.from_arrays(columns, schema=MANIFEST_SCHEMA))


def _release(data: str) -> dict[str, Any]:
    with open(_release_assignment_path(data)) as f:
        return json.load(f)


def write_receipt_file(store: Any, sc: Scale, data: str) -> None:
    """receipt.json with the sections the reports read: counts, the release of the plan, a
    near-duplicate section (so the HTML report draws the edge histogram)."""
    from tasks.report.files import RECEIPT
    from tasks.release.publish import release_section
    from tasks.release.splits import SplitConfig

    release = _release(data)
    near = {"model_id": "bench512", "index": {"plan": {"factory": "IVF,PQ"}, "vectors": sc.kept},
            "graph": {"edges": 0, "threshold": 0.9}, "recall": {"recall": 1.0},
            "decisions": {"removed": sc.kept - sc.released, "images": sc.kept, "removed_by_rule": {},
                          "flagged_components": 0, "largest_components": []}}
    by_status = {"kept": sc.released, "near_duplicate": sc.kept - sc.released}
    store.write_json(RECEIPT, {"corpusforge": "build-corpus", "code_version": "bench", "config": {},
                               "source": "/src", "source_kind": "table", "input_snapshot_sha256": "0" * 64,
                               "counts": {"records": sc.n, "by_status": by_status, "by_reason": {}},
                               "release": release_section(release, SplitConfig()), "near_duplicates": near,
                               "warnings": []})


def write_edges(store: Any, sc: Scale) -> None:
    """Graph edge files, one per staging shard: NEAR_DUP_RATE of its records paired."""
    import pyarrow as pa

    from tasks.graph.files import EDGE_SCHEMA, edges_path

    size = math.ceil(sc.kept / sc.shards)
    rng = np.random.default_rng(5)
    for s in range(sc.shards):
        n = max(1, int(min(size, sc.kept - s * size) * NEAR_DUP_RATE))
        src = s * size + rng.integers(0, size, n)
        table = pa.table({"src": src, "dst": src + 1, "similarity": rng.uniform(0.9, 1.0, n).astype(np.float32)},
                         schema=EDGE_SCHEMA)
        store.write_parquet(edges_path(shard_name(s)), table)


def keep_previous(store: Any) -> None:
    from tasks.report.changes import keep_previous_version

    keep_previous_version(store)


INPUTS["manifest"] = lambda store, sc, src: write_manifest(store, sc)
INPUTS["receipt"] = lambda store, sc, src: write_receipt_file(store, sc, os.path.dirname(src))
INPUTS["edges"] = lambda store, sc, src: write_edges(store, sc)
INPUTS["previous"] = lambda store, sc, src: keep_previous(store)


# The caption set's probe size: below the test split at every size run (935 test records at
# 10k), so the probe set is at its cap at every N measured and at 10⁸.
EVAL_PROBE_SIZE = 500


def _test_records(n: int) -> int:
    """The test split's records at N (the split's own rule, on the records kept at N)."""
    from tasks.release.splits import SplitConfig, held_out_sizes

    return held_out_sizes(Scale.of(n).released, SplitConfig())[1]


def _eval_regime(n: int) -> dict[str, Any]:
    """Whether the probe set is at its cap (the test split holds more records than it takes)."""
    return {f"set of {EVAL_PROBE_SIZE:,d} at its cap": _test_records(n) >= EVAL_PROBE_SIZE}


def _eval_sizes(n: int) -> dict[str, int]:
    """What each run's peak follows: the probe set's, N (its set is the same size at every N, so
    any growth is the step's own: the line through N projects it); the default set's, its
    captions (min(size, test split): 935 and 9,354 at 10k and 100k, 50,000 at 10⁸)."""
    from tasks.captions.eval_captions import EvalCaptionsConfig

    return {"probe set": n, "default set": min(EvalCaptionsConfig().size, _test_records(n))}


def run_eval_captions(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """The evaluation caption set from the test release assignments, as the build flow runs it: the
    plan names to a file (flow), the set written by one task; twice, with the probe size
    first, then the default size. The probe's peak is its own; the default's is the step's
    peak over both (a process's freed memory is reused, so never less than its own)."""
    from bench.scale import _reset_peak, _status_bytes  # defined after the area modules load
    from tasks.captions.eval_captions import EvalCaptionsConfig, write_eval_captions, write_test_assignment_list

    assignments = write_test_assignment_list(store, _release(data))
    start = _reset_peak()
    peaks, params, captions = {}, [], {}
    for kind, size in (("probe set", EVAL_PROBE_SIZE), ("default set", EvalCaptionsConfig().size)):
        kwargs = dict(store=store, assignments=assignments, cfg=EvalCaptionsConfig(size=size))
        result = write_eval_captions(**kwargs)
        peaks[kind] = _status_bytes("VmHWM:") - start
        params.append(kwargs)
        captions[kind] = result["captions"]
        expected = {"captions": min(size, _test_records(sc.n)), "test_records": _test_records(sc.n)}
        if {k: result[k] for k in expected} != expected:  # the projection's sizes are not what ran
            raise RuntimeError(f"eval_captions at N={sc.n:,d}, size {size:,d}: {result} is not {expected}")
    return {"tasks": 1, "params": params, "captions": captions, "test_records": _test_records(sc.n),
            "peak_rss": max(peaks.values()), "task_peaks": peaks}


STEPS["eval_captions"] = Step("eval_captions", run_eval_captions, ("staging", "release_plan"), "task",
                              ("tasks.captions.eval_captions",), regime=_eval_regime, task_sizes=_eval_sizes)


@step("stats_scan_manifest", ("staging", "release_plan", "manifest"), "task", ("tasks.stats.reference",))
def run_stats_scan_manifest(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """The reference statistics' manifest scan and manifest hash (one task), for the build's
    default groups plus the oracle's (val, train tiers, Test-50K)."""
    from tasks.stats.reference import scan_manifest
    from tasks.stats.stage import ReferenceStatsConfig

    cfg = ReferenceStatsConfig(oracle=True)
    kwargs = dict(store=store, groups=cfg.groups(), sample=cfg.sample, tiers=cfg.tiers,
                  subset_size=cfg.test_subset, subset_seed=cfg.test_subset_seed)
    plan = scan_manifest(**kwargs)
    return {"tasks": 1, "params": [kwargs], "counts": plan.counts}


@step("input_snapshot", ("ingest",), "task", ("tasks.report.receipt",))
def run_input_snapshot(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """The receipt's input snapshot hash over every ingest marker (one task)."""
    from tasks.report.receipt import input_snapshot_hash

    kwargs = dict(store=store, n_parts=sc.parts)
    input_snapshot_hash(**kwargs)
    return {"tasks": 1, "params": [kwargs]}


@step("output_list", ("ingest", "staging", "release_plan", "manifest"), "task", ("tasks.report.receipt",))
def run_output_list(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """The receipt's output list (one task): every file's SHA-256 from the markers."""
    from tasks.report.receipt import write_output_list

    kwargs = dict(store=store)
    return {"tasks": 1, "params": [kwargs], "outputs": write_output_list(**kwargs)["files"]}


@step("sweep_temp_files", ("ingest", "staging", "release_plan", "manifest"), "task", ("corpusforge.contract",))
def run_sweep(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """The walk of the whole output tree for killed writers' temporary files (one task)."""
    from corpusforge.contract import sweep_temp_files

    kwargs = dict(store=store)
    return {"tasks": 1, "params": [kwargs], "removed": sweep_temp_files(**kwargs)["removed"]}


@step("reports", ("staging", "release_plan", "receipt", "edges"), "task",
      ("tasks.report.write", "matplotlib.pyplot"))
def run_reports(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """report.md and report.html from receipt.json (one task): the HTML report reads every
    graph edge file for its histogram."""
    from tasks.report.files import RECEIPT
    from tasks.report.write import write_reports

    kwargs = dict(store=store, receipt_sha256=store.sha256(RECEIPT))
    write_reports(**kwargs)
    return {"tasks": 1, "params": [kwargs]}


def _records_regime(n: int) -> dict[str, Any]:
    """Whether a version's records fill a row group of the files both steps write or read
    (records.parquet, changes.parquet: row groups of a fixed row count): writing or reading
    one holds a row group, whose memory grows with N up to there and not past it. Past it,
    what is left is the steps' own: one range of keys at a time (corpusforge/key_ranges.py)."""
    from tasks.report.changes import BATCH_ROWS

    return {f"records fill a row group of {BATCH_ROWS:,d}": Scale.of(n).kept >= BATCH_ROWS}


# Both read the resolved partitions (the captions of records the stage did not caption): without
# "resolved" among their inputs they read them only at sizes where exact_dedup had run before them
# (10k and 100k in a whole guard run, not 70k: files opened b 2.89 and CPU b 2.77 by that alone).
@step("keep_previous_version", ("ingest", "resolved", "staging", "release_plan", "manifest", "receipt"), "task",
      ("tasks.report.changes", "duckdb"), regime=_records_regime)
def run_keep_previous_version(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """The copy of the version a rebuild replaces (one task): every manifest row joined with
    its caption, one range of keys at a time, sorted, written to work/previous."""
    from tasks.report.files import PREVIOUS_DIR
    from tasks.report.changes import keep_previous_version

    store.remove(PREVIOUS_DIR)
    kwargs = dict(store=store)
    assert keep_previous_version(**kwargs)
    return {"tasks": 1, "params": [kwargs]}


@step("diff_versions", ("ingest", "resolved", "staging", "release_plan", "manifest", "receipt", "previous"),
      "task",
      ("tasks.report.changes", "duckdb"), regime=_records_regime)
def run_diff_versions(store: Any, sc: Scale, data: str) -> dict[str, Any]:
    """CHANGES.md and changes.parquet against the kept previous version (one task): a full
    outer join of both versions' records, one range of keys at a time."""
    from tasks.report.changes import diff_versions

    kwargs = dict(old=store, new=store, out=store, previous_kept=True)
    summary = diff_versions(**kwargs)
    return {"tasks": 1, "params": [kwargs], "changed": sum(summary["records"].values())}


FLOW_STEPS = ["eval_captions", "stats_scan_manifest", "input_snapshot", "output_list", "sweep_temp_files", "reports",
              "keep_previous_version", "diff_versions"]
FIXED += FLOW_STEPS
GUARDED += FLOW_STEPS
