"""Content-defined staging shards: cut points chosen by the records, not by their positions.

Staging shards are the unit of the expensive work (features, graph queries), so their
content must survive a source that grows or changes: a shard whose records did not
change keeps its name and its content, and its features and graph queries are reused.
Cutting the survivors into fixed-size runs would shift every later shard when one
record is inserted or removed; instead, as in rsync and restic, a record is a
*cut candidate* when a hash of its key hits 1 in ``shard_size // 2``, and a shard ends
at the first candidate at least ``shard_size // 2`` records after its start (at the
latest after ``2 * shard_size`` records: a longer run between two cuts is split into
pieces of that size from its start). An edit then changes the shard it falls in (rarely
also the next one) and the cuts re-align after it; appended records only touch the last
shard. Shards hold about ``shard_size`` records on average.

A shard is named after the cut it starts at (docs/staging.md), so names survive appends.
"""

from __future__ import annotations

from dataclasses import dataclass

from corpusforge.hashing import stable_int

SEED = 0x5A6E


def cut_sizes(shard_size: int) -> tuple[int, int]:
    """(smallest shard ended by a candidate, largest shard) for a target ``shard_size``."""
    return max(1, shard_size // 2), 2 * shard_size


def cut_name(key: str, shard_size: int) -> str | None:
    """The name of the shard that would start after this record, when it is a cut candidate."""
    period = cut_sizes(shard_size)[0]
    if period > 1 and stable_int(SEED, key, period) != 0:
        return None
    return f"{stable_int(SEED + 1, key, 2**64):016x}"


@dataclass(frozen=True)
class Cut:
    """A shard of ``count`` survivors starting at global survivor position ``start``."""

    name: str
    start: int
    count: int


def cut_survivors(total: int, candidates: list[tuple[int, str]], shard_size: int) -> list[Cut]:
    """Cut ``total`` survivors (numbered in input order) at the candidates ``(position, name)``."""
    smallest, largest = cut_sizes(shard_size)
    cuts: list[Cut] = []

    def close(start: int, end: int, name: str) -> None:
        for k, lo in enumerate(range(start, end, largest)):
            cuts.append(Cut(f"{name}-{k}" if k else name, lo, min(end, lo + largest) - lo))

    start, start_name = 0, "head"
    for position, name in sorted(candidates):
        if position + 1 - start >= smallest:
            close(start, position + 1, start_name)
            start, start_name = position + 1, name
    if start < total:
        close(start, total, start_name)
    return cuts
