"""The similarity-graph build crashed at a chosen point and resumed (issue 14, scenario 11).

A subprocess runs the near-duplicate stage and kills itself with SIGKILL when the second
staging shard's queries begin (:mod:`corpusforge.faults`). The rerun must reuse the
finished query file (its checkpoint), query the rest, and write a ``graph/`` byte-equal
to an uninterrupted build. A checkpoint whose fingerprint does not match — the found
pairs of a build with another graph threshold, copied in with their marker — must be
refused and recomputed, never merged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from corpusforge.contract import read_marker
from corpusforge.faults import ENV
from tasks.graph.files import GRAPH_SUMMARY, found_path
from tasks.graph.stage import near_duplicate_stage
from tests.graph_corpus import write_corpus
from tests.test_graph_stage import exact_cfg, tree_bytes

pytestmark = [pytest.mark.scenario(11), pytest.mark.timeout(300)]

CRASH = """
import json, sys
from corpusforge.storage import Store
from tasks.graph.stage import near_duplicate_stage
from tests.test_graph_stage import exact_cfg
near_duplicate_stage(Store(sys.argv[1]), exact_cfg(), json.loads(sys.argv[2]))
"""


def test_graph_build_killed_mid_queries_resumes_to_the_uninterrupted_graph(tmp_path):
    crashed, shards, _ = write_corpus(str(tmp_path / "crashed"), n_shards=3, per_shard=40, seed=3)
    clean, _, _ = write_corpus(str(tmp_path / "clean"), n_shards=3, per_shard=40, seed=3)
    ordered = sorted(shards)
    env = {**os.environ, ENV: f"graph.query@{ordered[1]}", "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", CRASH, crashed.root, json.dumps(shards)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == -9, done.stderr[-2000:]
    assert read_marker(crashed, found_path(ordered[0])) is not None        # the checkpoint before the crash
    assert read_marker(crashed, found_path(ordered[1])) is None
    assert not crashed.exists(GRAPH_SUMMARY)

    _, work = near_duplicate_stage(crashed, exact_cfg(), shards)
    assert work["queries"] == {"computed": 2, "skipped": 1}
    near_duplicate_stage(clean, exact_cfg(), shards)
    assert tree_bytes(tmp_path / "crashed" / "graph") == tree_bytes(tmp_path / "clean" / "graph")


def test_a_checkpoint_with_a_mismatched_fingerprint_is_refused(tmp_path):
    store, shards, _ = write_corpus(str(tmp_path / "a"), n_shards=3, per_shard=40, seed=3)
    other, _, _ = write_corpus(str(tmp_path / "b"), n_shards=3, per_shard=40, seed=3)
    clean, _, _ = write_corpus(str(tmp_path / "clean"), n_shards=3, per_shard=40, seed=3)
    near_duplicate_stage(other, exact_cfg(edge_min_similarity=0.5), shards)  # far more pairs than at 0.9
    victim = sorted(shards)[0]
    for rel in (found_path(victim), f"_markers/{found_path(victim)}.json"):
        target = tmp_path / "a" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "b" / rel, target)
    assert read_marker(store, found_path(victim)).info["pairs"] > 0
    _, work = near_duplicate_stage(store, exact_cfg(), shards)
    assert work["queries"] == {"computed": 3, "skipped": 0}   # the foreign checkpoint was not reused
    near_duplicate_stage(clean, exact_cfg(), shards)
    assert tree_bytes(tmp_path / "a" / "graph") == tree_bytes(tmp_path / "clean" / "graph")
