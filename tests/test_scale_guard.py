"""Scale guard (issues 22, 31): ``bench/scale.py --quick`` (10k and 100k records, plus the
sizes a step's regime needs) over every bounded step (``bench.scale.GUARDED``, which must
hold every name in ``FIXED``, the other areas' included). One benchmark run for the module;
each step's row is its own test, and fails when the step breaks a bound on the larger of the
fit and the straight line through its last two sizes: growth b > 1.1 (CPU time, files opened
counted by strace), memory past 2 GB (flow) or 16 GB (task) at 10⁸, parameters past 64 KB.
Task runs per build are checked too. At quick sizes a regime not reached yet (exact dedup's
bucket cap) is shown as unmeasured without failing: the full benchmark fails on it. Selecting
tests (``-k eval_captions``) runs the benchmark for the selected steps only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from bench.scale import FIXED, GUARDED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Its own target (make test-scale-guard): 883 s wall on 2 cores beside a whole-suite run
# (2026-12-02, all areas' bounded steps; training the IVF-PQ index and the graph tasks are most of it).
pytestmark = [pytest.mark.slow, pytest.mark.scale_guard, pytest.mark.timeout(3600)]


def _selected_steps(session: pytest.Session) -> list[str]:
    """The guarded steps whose tests this run selected (``-k eval_captions`` runs that step's
    benchmark only); every one when none or the task-run test alone is selected."""
    here = os.path.abspath(__file__)
    chosen = {item.callspec.params["step"] for item in session.items
              if str(item.path) == here and "step" in getattr(getattr(item, "callspec", None), "params", {})}
    return [s for s in GUARDED if s in chosen] or list(GUARDED)


@pytest.fixture(scope="module")
def quick_table(request, tmp_path_factory) -> dict[str, str]:
    """The verdict line of each guarded step this run selected, and "task runs" the task-run lines."""
    work = tmp_path_factory.mktemp("scale")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale.py"), "--quick", "--steps",
                           *_selected_steps(request.session), "--work", str(work)],
                          capture_output=True, text=True, cwd=ROOT)
    print(proc.stdout[-8000:], f"\nscale guard: {time.perf_counter() - started:.0f} s", sep="")
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    table = proc.stdout.split("projections, extrapolated", 1)[1]
    rows = {row.split()[0]: row for row in table.split("\n\n", 1)[0].splitlines()[2:] if row.strip()}
    rows["task runs"] = table.split("Prefect task runs per build", 1)[1]
    return rows


# Bounded steps the guard runs in another form, or not at quick sizes, and why.
NOT_GUARDED = {
    "faiss_build_512pq": "guarded as faiss_build_512pq_guard: the same train, add and merge code with 64 lists",
    "faiss_query_512pq": "guarded as faiss_query_512pq_guard: the same rescored query code with 64 lists",
    "contamination_index_ivf": "its CPU time is FAISS's OpenMP threads', which a loaded machine inflates: b 0.85-0.86 "
                               "at 10k-1M in the full run of 2026-12-05, 1.16 between the quick sizes in a guard run "
                               "beside other work the same day; the full benchmark enforces it",
    "graph_collision": "its 1e8 regime, the sample capped at max_subset_vectors (2M), starts at 6.9M records: guarded "
                       "as graph_collision_guard, the same code with the cap at 2,000 vectors, so quick sizes lie past it",
}


def test_every_bounded_step_is_guarded():
    assert set(FIXED) - set(GUARDED) == set(NOT_GUARDED)


# Steps whose line through their quick sizes breaks a bound today: strict, so a fix that makes one
# pass fails here until it is taken off. (release_plan left on 2026-12-05: one range of keys at a
# time, issue-31r; 116 -> 124 MB from 10k to 100k, 138 MB at 1M, bench/results/scale-31r.txt. Planning
# with near-duplicate decisions since issue-31d: 116 -> 124-127 MB, 9.2-11.5 GB at 1e8 by the quick
# line in three runs, bench/results/scale-guard-31d.txt.)
BROKEN_AT_QUICK_SIZES: dict[str, str] = {}
# Within a factor of two of the bound at quick sizes, on either side, from one run to the next:
# not strict, so the guard's verdict on it is read from the table, not from this test's outcome.
# (graph_verify and folder_listing left this list on 2026-12-04: their run-to-run spread was Arrow's
# pool, which the bench no longer uses; since, 10.1-10.8 GB at 1e8 by the line in seven runs of
# graph_verify and 1.7-2.4 GB in three of folder_listing, against 16 GB.)
NEAR_THE_BOUND = {
    "keep_previous_version": "one range of keys at a time (issue-31kd): 0.23 GB at 1e8 by the memory line, but its "
                             "CPU b over 70k -> 100k (a 1.43x span) measured -0.60 to 1.71 in runs of 2026-12-04 "
                             "beside other work, where CPU time itself varied 2x (docs/scaling.md)",
    "diff_versions": "one range of keys at a time (issue-31kd): the same thin CPU span as keep_previous_version "
                     "(b -0.02 to 2.05), and 1.4-21 GB at 1e8 by the memory line (DuckDB's own allocator)",
    "release_writer": "6.0 and 10.1 GB at 1e8 by the line through 20k and 100k in two runs of issue-31evrw "
                      "(write_tar's hashing queue holds up to 36 MB as the hashing thread falls behind), "
                      "against 16 GB; 0.85 GB by the line through 100k and 1M",
    "eval_captions": "12.1-12.2 GB at 1e8 by the probe set's line through 10k and 100k (issue-31evrw), against "
                     "16 GB: 11 MB measured between the sizes is what the line multiplies",
    "graph_merge": "1.4-7.5 GB at 1e8 in four runs of issue-31col and 93 GB in a fifth (62.7 -> 64.7 MB): a group's "
                   "pairs (~1,200 at 100k) are far from their 1e8 regime (5e7), so 2 MB of noise is what the line "
                   "multiplies",
}


def _guarded(step: str) -> Any:
    if step in BROKEN_AT_QUICK_SIZES:
        return pytest.param(step, marks=pytest.mark.xfail(reason=BROKEN_AT_QUICK_SIZES[step], strict=True))
    if step in NEAR_THE_BOUND:
        return pytest.param(step, marks=pytest.mark.xfail(reason=NEAR_THE_BOUND[step], strict=False))
    return step


@pytest.mark.parametrize("step", [_guarded(s) for s in GUARDED])
def test_a_guarded_step_meets_its_bounds_at_quick_sizes(quick_table, step):
    row = quick_table[step]
    assert "FAIL" not in row, row
    assert "[fixed]" in row, row


def test_task_runs_per_build_meet_their_bound(quick_table):
    assert "FAIL" not in quick_table["task runs"], quick_table["task runs"]
