"""Publishing a corpus version whole: a reader sees the previous version or the new one, never a mix.

The release stage's working copies (``shards/``, ``manifest/``) are rewritten unit by unit, so a
build killed midway leaves them part old, part new, and readers never read them. When the build has
finished, :func:`publish_version` links its released files into ``versions/{version}/`` (a digest of
their paths and SHA-256s: a rerun that changes nothing publishes nothing), then writes
``current.json``, the one small pointer, last. :func:`refusal` is the check before the switch
(``splits.max_shrink``). Readers and the switch: docs/release.md ("Reading a release while builds run").
"""

from __future__ import annotations

from typing import Any

from corpusforge.contract import digest_of
from corpusforge.faults import fault_point
from corpusforge.layout import MANIFEST_DIR
from tasks.release.files import CURRENT, RELEASE_DIR, VERSIONS_DIR, version_dir
from tasks.report.files import RECEIPT_OUTPUTS
from corpusforge.storage import Store

PUBLISHED = (RELEASE_DIR, MANIFEST_DIR)  # the folders a version holds


class ReleaseRefused(RuntimeError):
    """A finished build whose release is not published (its one-line reason); the receipt
    says the same, and the previous version stays current."""


def current_version(store: Store) -> dict[str, Any] | None:
    """The published version's pointer (``current.json``), or None before the first."""
    return store.read_json(CURRENT) if store.exists(CURRENT) else None


def refusal(samples: int, previous: dict[str, Any] | None, max_shrink: float) -> str | None:
    """Why a release of ``samples`` samples must not replace ``previous`` (the current
    pointer, or None), or None when it may."""
    if samples == 0:
        return "the release would be empty: no input record was kept (the receipt counts them by reason)"
    before = int(previous["samples"]) if previous else 0
    if samples < (1 - max_shrink) * before:
        return (f"the release would shrink from {before} to {samples} samples ({1 - samples / before:.0%} fewer; "
                f"splits.max_shrink allows {max_shrink:.0%})")
    return None


def released_files(store: Store) -> dict[str, str]:
    """SHA-256 per released file (release shards, dataset card, manifest parts), from the
    build's output list."""
    table = store.read_parquet(RECEIPT_OUTPUTS, columns=["path", "sha256"])
    return {p: h for p, h in zip(table["path"].to_pylist(), table["sha256"].to_pylist(), strict=True)
            if p.split("/", 1)[0] in PUBLISHED}


def publish_version(store: Store, samples: int) -> dict[str, Any]:
    """Publish the working copies as a version and switch ``current.json`` to it (last);
    return the pointer. A publish killed midway is resumed: links already made are of the
    same bytes (the version names its content)."""
    files = released_files(store)
    version = digest_of(files)[:16]
    previous = current_version(store)
    folder = version_dir(version)
    pointer = {"version": version, "samples": samples, "files": len(files),
               **{name: f"{folder}/{name}" for name in PUBLISHED}}
    if previous == pointer:
        return pointer
    root = store.fs._strip_protocol(store.path(folder)).rstrip("/") + "/"
    store.fs.invalidate_cache(root)
    done = {p[len(root):] for p in store.fs.find(root)} if store.exists(folder) else set()
    for rel in sorted(set(files) - done):
        store.link(rel, f"{folder}/{rel}")
    fault_point("release.publish", version)  # tests only: off unless CORPUSFORGE_FAULT
    store.write_json(CURRENT, pointer)
    keep = {version, previous["version"] if previous else version}
    for name in store.listdir(VERSIONS_DIR):
        if name not in keep:
            store.remove(version_dir(name))
    return pointer
