"""The SHA-256 of each output file a receipt lists: one rule for the build's, the contamination
scan's and the prompt qualification's receipts, which differ only in what they list."""

from __future__ import annotations

import json
from collections.abc import Sequence

from corpusforge.layout import MARKERS
from corpusforge.storage import Store

MARKERS_PER_READ = 1024  # markers read by one batched ``cat``


def output_hashes(store: Store, folders: Sequence[str] = ("",), skip: Sequence[str] = (),
                  recorded: bool = False) -> dict[str, str]:
    """SHA-256 of every file under ``folders`` (the root by default) by path, in path order, but
    hidden files and those in ``skip`` (paths; a folder ends in ``/``). With ``recorded``, a
    hash the units' markers (``_markers/``, when listed) recorded as they wrote the file is taken
    from there; only a file no marker records (one written outside the unit protocol, such as
    the dataset card) is read and hashed."""
    prefix = store.fs._strip_protocol(store.root).rstrip("/") + "/"
    rels = sorted({p[len(prefix):] for folder in folders
                   for p in store.fs.find(store.fs._strip_protocol(store.path(folder)).rstrip("/"))})
    known: dict[str, str] = {}
    markers = [prefix + r for r in rels if recorded and r.startswith(f"{MARKERS}/") and r.endswith(".json")]
    for start in range(0, len(markers), MARKERS_PER_READ):  # never every marker's bytes at once
        for raw in store.fs.cat(markers[start:start + MARKERS_PER_READ]).values():
            known.update(json.loads(raw).get("outputs", {}))
    skipped = tuple(s for s in skip if s.endswith("/"))
    return {rel: known[rel] if rel in known else store.sha256(rel) for rel in rels
            if not (rel in skip or rel.startswith(skipped) or "/." in f"/{rel}")}
