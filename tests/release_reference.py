"""The release placement rule record by record (GPIC §2.5, tasks/release/splits.py): the
reference that the columnar planner (tasks/release/shards.py) and the planner it replaced
(tests/old_release.py, which imports it as ``tasks.splits.assign_release``) place records as.
It holds every record as a dict, so the product never runs it; the tests do."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from corpusforge.hashing import stable_uniform
from tasks.release.splits import SPLITS, SplitConfig, apportion, held_out_sizes, tier_counts, tiers_of

__all__ = ["SPLITS", "SplitConfig", "Placement", "assign_splits", "held_out_sizes", "assign_release", "tiers_of"]


@dataclass(frozen=True)
class Placement:
    split: str
    shard: int      # index within the split
    position: int   # order within the shard
    tier: str | None


def stratum_of(record: dict[str, Any], fields: list[str]) -> tuple[str, ...]:
    return tuple(str(record.get(f) or "") for f in fields)


def assign_splits(records: list[dict[str, Any]], cfg: SplitConfig) -> dict[str, str]:
    """key -> split. ``records`` need key, the stratify fields and ``group`` (component)."""
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[r["group"]].append(r)
    by_stratum: dict[tuple[str, ...], list[list[dict[str, Any]]]] = defaultdict(list)
    for members in groups.values():
        members.sort(key=lambda r: r["key"])
        by_stratum[stratum_of(members[0], cfg.stratify_by)].append(members)
    sizes = {s: sum(len(g) for g in gs) for s, gs in by_stratum.items()}
    val_n, test_n, _ = held_out_sizes(len(records), cfg)
    test_q = apportion(test_n, sizes)
    val_q = apportion(val_n, sizes)
    split_of: dict[str, str] = {}
    for stratum, stratum_groups in by_stratum.items():
        stratum_groups.sort(key=lambda g: (stable_uniform(cfg.seed, g[0]["key"]), g[0]["key"]))
        filled = {"test": 0, "val": 0}
        for members in stratum_groups:
            if filled["test"] < test_q[stratum]:
                split = "test"
            elif filled["val"] < val_q[stratum]:
                split = "val"
            else:
                split = "train"
            if split != "train":
                filled[split] += len(members)
            for r in members:
                split_of[r["key"]] = split
    return split_of


def assign_release(records: list[dict[str, Any]], cfg: SplitConfig) -> dict[str, Placement]:
    """key -> Placement for every kept record."""
    split_of = assign_splits(records, cfg)
    placements: dict[str, Placement] = {}
    for split in SPLITS:
        members = [r for r in records if split_of[r["key"]] == split]
        if not members:
            continue
        n_shards = max(1, math.ceil(len(members) / cfg.shard_size))
        order = sorted(members, key=lambda r: (stratum_of(r, cfg.stratify_by),
                                               stable_uniform(cfg.seed + 1, r["key"]), r["key"]))
        shard_members: list[list[str]] = [[] for _ in range(n_shards)]
        for i, r in enumerate(order):
            shard_members[i % n_shards].append(r["key"])
        tiers = tier_counts(n_shards, cfg.tiers, cfg.preset == "gpic") if split == "train" else []
        for shard, keys in enumerate(shard_members):
            tier = next((name for name, count in tiers if shard < count), None)
            keys.sort(key=lambda k: (stable_uniform(cfg.seed + 2, k), k))
            for position, key in enumerate(keys):
                placements[key] = Placement(split, shard, position, tier)
    return placements
