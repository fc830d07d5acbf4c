"""Release assignment: stratified splits, components kept together, balanced shards, tiers."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.release.splits import SplitConfig, tier_counts
from tests.release_reference import assign_splits, assign_release
from tasks.staging.stage import cut_staging

TYPES = ["tag", "short", "medium", "long"]


def make_records(n: int, seed: int = 0, component_every: int = 0) -> list[dict]:
    records = []
    for i in range(n):
        h = (i * 2654435761 + seed) % 1000
        records.append({"key": f"k{i:05d}", "caption_type": TYPES[0 if h < 10 else 1 if h < 460 else 2 if h < 910 else 3],
                        "source": "flickr" if h % 8 else "wikimedia",
                        "group": (i // 3) if component_every and i % component_every < 3 else f"solo{i}"})
    return records


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 400), shard_size=st.integers(1, 60), seed=st.integers(0, 5))
def test_shards_are_balanced_in_size_and_caption_mix(n, shard_size, seed):
    records = make_records(n, seed)
    cfg = SplitConfig(val=0.1, test=0.1, shard_size=shard_size, seed=seed)
    placements = assign_release(records, cfg)
    assert set(placements) == {r["key"] for r in records}
    by_key = {r["key"]: r for r in records}
    for split in ("train", "val", "test"):
        shards: dict[int, list[str]] = defaultdict(list)
        for key, p in placements.items():
            if p.split == split:
                shards[p.shard].append(key)
        if not shards:
            continue
        total = sum(len(v) for v in shards.values())
        assert len(shards) == max(1, math.ceil(total / shard_size))
        sizes = [len(v) for v in shards.values()]
        assert max(sizes) - min(sizes) <= 1
        for stratum in {(r["source"], r["caption_type"]) for r in records}:
            counts = [sum((by_key[k]["source"], by_key[k]["caption_type"]) == stratum for k in keys)
                      for keys in shards.values()]
            assert max(counts) - min(counts) <= 1


def test_split_sizes_follow_fractions_and_strata():
    records = make_records(2000)
    split_of = assign_splits(records, SplitConfig(val=0.05, test=0.1))
    sizes = Counter(split_of.values())
    assert abs(sizes["test"] - 200) <= 8 and abs(sizes["val"] - 100) <= 8
    for split in ("train", "test"):
        mix = Counter(r["caption_type"] for r in records if split_of[r["key"]] == split)
        total = sum(mix.values())
        assert abs(mix["short"] / total - 0.45) < 0.05 and abs(mix["long"] / total - 0.09) < 0.04


def test_counts_are_exact_when_given_as_counts():
    split_of = assign_splits(make_records(500), SplitConfig(val=20, test=30))
    sizes = Counter(split_of.values())
    assert (sizes["val"], sizes["test"]) == (20, 30)


def test_components_never_straddle_splits():
    records = make_records(900, component_every=5)
    split_of = assign_splits(records, SplitConfig(val=0.2, test=0.2))
    by_group = defaultdict(set)
    for r in records:
        by_group[r["group"]].add(split_of[r["key"]])
    assert all(len(s) == 1 for s in by_group.values())


def test_plan_does_not_depend_on_record_order():
    records = make_records(300)
    cfg = SplitConfig(shard_size=25)
    assert assign_release(records, cfg) == assign_release(list(reversed(records)), cfg)


def test_tiers_are_nested_prefixes_scaled_for_small_corpora():
    tiers = {"nano": 80, "lite": 800, "full": 8000}
    assert tier_counts(8000, tiers) == [("nano", 80), ("lite", 800), ("full", 8000)]
    assert tier_counts(100, tiers) == [("nano", 1), ("lite", 10), ("full", 100)]
    assert tier_counts(3, tiers) == [("nano", 1), ("lite", 1), ("full", 3)]
    placements = assign_release(make_records(400), SplitConfig(val=0, test=0, shard_size=10))
    for p in placements.values():
        expected = "nano" if p.shard < 1 else "lite" if p.shard < 4 else "full"
        assert p.tier == expected


def test_staging_cuts_number_survivors_in_input_order():
    # survivors per partition 3, 0, 5, 2; cut candidates (position in partition, name) from resolve
    resolved = [{"part": 0, "survivors": 3, "candidates": [[0, "early"]]},  # too soon after the start: no cut
                {"part": 1, "survivors": 0, "candidates": []},
                {"part": 2, "survivors": 5, "candidates": [[0, "aaaa"], [4, "bbbb"]]},
                {"part": 3, "survivors": 2, "candidates": []}]
    shards = cut_staging(resolved, shard_size=4)
    names = [s.name for s in shards]
    assert len(set(names)) == len(names) == 3 and "early" not in names  # named by the cuts taken
    assert [s.slices for s in shards] == [((0, 0, 3), (2, 0, 1)), ((2, 1, 4),), ((3, 0, 2),)]
