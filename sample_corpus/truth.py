"""Reading the sample corpus's ground truth: which keys are copies of one another."""

from __future__ import annotations

from typing import Any


def related_groups(keys: list[str], truth: dict[str, Any]) -> dict[str, str]:
    """Group id per key: exact copies, planted near-duplicates and burst shots join their
    original's group; every other key is its own group."""
    parent = {k: k for k in keys}

    def find(k: str) -> str:
        while parent[k] != k:
            k = parent[k]
        return k

    links = [(e["key"], e["copy_of"]) for e in truth["exact_duplicates"] + truth["near_duplicates"]]
    links += [(c["keys"][0], k) for c in truth["clusters"] for k in c["keys"][1:]]
    for a, b in links:
        if a in parent and b in parent:
            parent[find(a)] = find(b)
    return {k: find(k) for k in keys}
