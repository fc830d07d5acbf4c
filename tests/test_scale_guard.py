"""Scale guard (issue 22): ``bench/scale.py --quick`` (10k and 100k records) over the steps
rewritten to meet the 10⁸ bounds (``bench.scale.GUARDED``: exact dedup, release planning,
a release writer, the graph stage's one-off tasks and its driver, the receipt, the folder
listing). It fails when one of them fits a growth exponent above 1.2 (CPU time, files
opened) or projects past a bound at 10⁸ (memory, task parameters). The FAISS steps in
``FIXED`` are enforced by the full benchmark only:
training IVF-PQ at 100k vectors takes minutes here, more than the suite's budget."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.scale import GUARDED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # minutes of benchmark: the full tier


def test_the_fixed_steps_meet_the_bounds_at_quick_sizes(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale.py"), "--quick", "--steps", *GUARDED,
                           "--work", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = proc.stdout.split("projections are extrapolated", 1)[1]
    for step in GUARDED:
        line = next(row for row in table.splitlines() if row.startswith(step))
        assert line.rstrip().endswith("ok [fixed]"), line
