"""What "equals a fresh build byte for byte" compares: every output file's SHA-256,
completion markers and work tables excluded (they record how the run went, not what it
made), the account of changes since the previous version and the version published before it (a
fresh build has neither), the receipt without the config fields that legitimately differ between the runs
compared (its output path; with ``drop``, others such as the Dask cluster)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from corpusforge.layout import MARKERS
from tasks.release.files import CURRENT, VERSIONS_DIR
from tasks.report.files import CHANGES_MD, CHANGES_TABLE


def compared_hashes(paths: Iterable[str], read: Callable[[str], bytes],
                    drop: tuple[str, ...] = ("out",)) -> dict[str, str]:
    """SHA-256 per relative path of the outputs compared; ``read`` gives a path's bytes."""
    hashes = {}
    paths = sorted(paths)
    current = json.loads(read(CURRENT))["version"] if CURRENT in paths else None
    for rel in paths:
        if rel.startswith(("work/", f"{MARKERS}/")) or rel in (CHANGES_MD, CHANGES_TABLE):
            continue
        if rel.startswith(f"{VERSIONS_DIR}/") and not rel.startswith(f"{VERSIONS_DIR}/{current}/"):
            continue  # the version published before (kept for its readers until the next switch)
        data = read(rel)
        if rel == "receipt.json":
            receipt = json.loads(data)
            for field in drop:
                receipt["config"].pop(field)
            data = json.dumps(receipt, sort_keys=True).encode()
        hashes[rel] = hashlib.sha256(data).hexdigest()
    return hashes


def tree(root: Path, drop: tuple[str, ...] = ("out",)) -> dict[str, str]:
    """The compared hashes of a local output folder."""
    files = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    return compared_hashes(files, lambda rel: (root / rel).read_bytes(), drop)
