"""The code version recorded in fingerprints and receipts.

It is the package version plus a hash of the pipeline's source files, so features or
shards made by different code are never mistaken for each other, even between releases.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from corpusforge import __version__

_PACKAGES = ("corpusforge", "tasks", "flows")


@functools.cache
def code_version() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return f"{__version__}+{h.hexdigest()[:12]}"
