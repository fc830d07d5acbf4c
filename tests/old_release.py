"""The release assignment and writers as they were before the columnar planner: the
reference the new ones must equal byte for byte (release tars, late facts, plan order,
the summary the receipt is built from).

The old module is read from git at :data:`OLD_COMMIT` and run under its old name, so it
uses today's ground floor (layout, storage, splits) exactly as it did then.
"""

from __future__ import annotations

import shutil
import types
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tasks.release.files import LATE_DIR, RELEASE_DIR, RELEASE_ASSIGNMENT_DIR
from corpusforge.storage import Store
from tasks.release.shards import assign_release_files, write_staged_list
from tasks.release.splits import SplitConfig
from tests.old_code import module_at

OLD_COMMIT = "63a2feaee6ac74785452b86d43b34db5acd1f3b2"


def old_release_module() -> types.ModuleType:
    """``tasks/release.py`` at :data:`OLD_COMMIT`, not registered in ``sys.modules``."""
    return module_at(OLD_COMMIT, "tasks/release.py", "tasks.release")


def _files(root: Path, folder: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / folder).rglob("*")) if p.is_file()}


def _assignments_without_spans(root: Path) -> dict[str, list[dict[str, Any]]]:
    return {str(p.relative_to(root)): pq.read_table(p).drop_columns(["members"]).to_pylist()
            for p in sorted((root / RELEASE_ASSIGNMENT_DIR).glob("*.parquet"))}


def assert_release_equals_old(out: Path, staged: list[str], cfg: SplitConfig, near_dedup: bool, tmp: Path,
                              captions: bool = False) -> dict[str, Any]:
    """Plan and write the release of ``out`` (release already written by today's code) with
    the old code in a copy, and with today's planner in another; assert equal release tars,
    late files, plan rows (less the new span column) and summaries (less the plan digests).
    Returns today's summary."""
    copies = {}
    for name in ("old", "new"):
        copies[name] = tmp / name
        shutil.copytree(out, copies[name])
    old = old_release_module()
    store = Store(str(copies["old"]))
    old_summary = old.plan_release_files(store, staged, cfg, near_dedup, captions=captions)
    for name, shard in old_summary["shards"].items():
        old.write_release_shard(store, shard["split"], shard["index"], cfg, old_summary["plans"][name])
    new = Store(str(copies["new"]))
    new_summary = assign_release_files(new, write_staged_list(new, staged), cfg, near_dedup, captions=captions)
    drop = [{k: v for k, v in s.items() if k != "plans"} for s in (old_summary, new_summary)]
    assert drop[0] == drop[1]
    assert _files(copies["old"], LATE_DIR) == _files(copies["new"], LATE_DIR) == _files(out, LATE_DIR)
    assert _files(copies["old"], RELEASE_DIR) == _files(out, RELEASE_DIR)
    assert _assignments_without_spans(copies["old"]) == _assignments_without_spans(copies["new"])
    return new_summary
