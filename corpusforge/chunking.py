"""Content-defined staging shards: cut points chosen by the records, not by their positions.

Staging shards are the unit of the expensive work (features, graph queries), so their
content must survive a source that grows or changes: a shard whose records did not
change keeps its name and its content, and its features and graph queries are reused.
Cutting the survivors into fixed-size runs would shift every later shard when one
record is inserted or removed; instead, as in rsync and restic, a record is a
*cut candidate* when a hash of its key hits 1 in ``shard_size // 2``, and a shard ends
at the first candidate at least ``shard_size // 2`` records after its start (at the
latest after ``2 * shard_size`` records). An edit then changes the shard it falls in
(rarely also the next one) and the cuts re-align after it; appended records only touch
the last shard. Shards hold about ``shard_size`` records on average.

A shard is named by the key hash of the candidate it ends at (``{hash}``, or
``{hash}-{k}`` for the k-th piece before it when a run longer than the maximum was
split); records after the last accepted cut form ``tail`` pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

from corpusforge.hashing import stable_int

SEED = 0x5A6E


def cut_sizes(shard_size: int) -> tuple[int, int]:
    """(smallest shard ended by a candidate, largest shard) for a target ``shard_size``."""
    return max(1, shard_size // 2), 2 * shard_size


def cut_name(key: str, shard_size: int) -> str | None:
    """The shard name a record would end, when it is a cut candidate, else None."""
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


def plan_cuts(total: int, candidates: list[tuple[int, str]], shard_size: int) -> list[Cut]:
    """Cut ``total`` survivors (numbered in input order) at the candidates ``(position, name)``."""
    smallest, largest = cut_sizes(shard_size)
    cuts: list[Cut] = []

    def close(start: int, end: int, name: str) -> None:
        n_pieces = -(-(end - start) // largest)
        for k in range(n_pieces):
            lo = start + k * largest
            hi = min(end, lo + largest)
            suffix = n_pieces - 1 - k
            cuts.append(Cut(f"{name}-{suffix}" if suffix else name, lo, hi - lo))

    start = 0
    for position, name in sorted(candidates):
        if position + 1 - start >= smallest:
            close(start, position + 1, name)
            start = position + 1
    if start < total:
        close(start, total, "tail")
    return cuts
