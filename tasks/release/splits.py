"""Release assignment (GPIC §2.5): stratified splits, balanced shards, nested tiers.

The rule is a pure function of the kept records' keys, strata and near-duplicate components
plus a seed, so the assignment does not depend on shard order or worker count. tasks/release/shards.py
applies it out of core; tests/release_reference.py, record by record, is its reference.

* **Splits.** Groups (a near-duplicate component, or a single record) are the unit: a
  component never straddles two splits. Per stratum (source × caption_type by default)
  groups are ordered by a seeded hash of their smallest key and dealt to test, then val,
  until each split's quota — its share of the stratum by largest remainder — is met.
* **Balanced shards.** A split with n samples gets S = ceil(n / shard_size) shards. Its
  samples, sorted by stratum and a seeded hash, are dealt round-robin, so every shard holds
  n/S ± 1 samples and each stratum's count per shard differs by at most one: every shard
  follows the split's caption mix as closely as integer counts allow.
* **Tiers.** Nested prefixes of the train shards (GPIC: nano/lite/full = first
  80/800/8000), scaled proportionally when the corpus has fewer train shards; the largest
  tier is always every train shard. ``preset: gpic`` keeps GPIC's fixed numbers instead
  (:func:`held_out_sizes`, fixed tier shard counts).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from corpusforge.config import StrictModel

SPLITS = ("train", "val", "test")

# GPIC's fixed numbers (paper §2.5, GPIC_FORMAT.md): 200K val, 1M test, 8,000 train shards of
# 12,500 = 100M; the corpus size at which the gpic preset's counts apply unscaled.
GPIC_VAL, GPIC_TEST = 200_000, 1_000_000
GPIC_TOTAL = 8000 * 12_500 + GPIC_VAL + GPIC_TEST


class SplitConfig(StrictModel):
    """Split sizes, release shard size and tiers."""

    val: float = Field(0.05, ge=0, description="Validation size: a fraction (< 1) or a count (≥ 1).")
    test: float = Field(0.10, ge=0, description="Test size: a fraction (< 1) or a count (≥ 1).")
    seed: int = Field(0, description="Seed of the split assignment and shuffles.")
    shard_size: int = Field(12_500, ge=1, description="Target samples per release shard (GPIC: 12,500).")
    stratify_by: list[str] = Field(["source", "caption_type"], description="Record fields that define strata.")
    tiers: dict[str, int] = Field(
        {"nano": 80, "lite": 800, "full": 8000},
        description="Nested tiers as train-shard counts at full scale; scaled down for small corpora.")
    layout: Literal["default", "gpic"] = Field(
        "default", description="Release shard layout: 'default' (shards/{split}/{split}-NNNNNN.tar: image, "
                               ".txt, .json) or 'gpic' (GPIC's names, JSON first with GPIC's fields, jpg/png only).")
    image_format: Literal["source", "auto", "png", "jpg"] = Field(
        "source", description="Image members: 'source' keeps each image's bytes and extension (gpic: WebP → "
                              "PNG); 'auto' is 'source' when that gives one extension, else 'png'; 'png' "
                              "converts losslessly; 'jpg' re-encodes non-JPEG at jpeg_quality (lossy). "
                              "One extension per release is what Hugging Face's webdataset loader needs.")
    jpeg_quality: int = Field(95, ge=1, le=100, description="JPEG quality when image_format 'jpg' re-encodes.")
    max_shrink: float = Field(
        0.5, ge=0, le=1, description="A build whose release would have fewer samples than the published version "
                                     "by more than this fraction fails and publishes nothing (1: never refuse a "
                                     "shrink). An empty release always fails.")
    preset: Literal["default", "gpic"] = Field(
        "default", description="'gpic': GPIC's fixed numbers — val/test 200K/1M (scaled by n/101.2M below "
                               "GPIC's size), tiers as fixed train-shard counts (nano/lite = first 80/800, "
                               "full = all) instead of proportions. Do not set val/test with it.")

    @model_validator(mode="after")
    def _preset_owns_sizes(self) -> SplitConfig:
        if self.preset == "gpic" and {"val", "test"} & self.model_fields_set:
            raise ValueError("splits.preset 'gpic' fixes val and test (200K / 1M, scaled for small corpora); "
                             "remove splits.val / splits.test or use preset 'default'")
        return self


def _quota(size: float, total: int) -> int:
    return min(total, int(round(size * total)) if size < 1 else int(size))


def held_out_sizes(n: int, cfg: SplitConfig) -> tuple[int, int, str]:
    """(val, test, the rule in words) for ``n`` kept records.

    ``gpic``: 200,000 / 1,000,000 when the corpus has at least GPIC's 101.2M records;
    below, both scale by n / 101.2M (GPIC's held-out proportions, 0.198 % / 0.988 %),
    each at least 1 when n ≥ 3 so a small corpus still has val and test."""
    if cfg.preset != "gpic":
        return _quota(cfg.val, n), _quota(cfg.test, n), (
            f"default: val {cfg.val:g}, test {cfg.test:g} ({'fractions' if max(cfg.val, cfg.test) < 1 else 'counts'} "
            f"of {n}); tiers {cfg.tiers} scaled by train shards / {max(cfg.tiers.values(), default=0)}")
    if n >= GPIC_TOTAL:
        val, test, how = GPIC_VAL, GPIC_TEST, "GPIC's counts (corpus at least GPIC's 101.2M)"
    else:
        floor = 1 if n >= 3 else 0
        val, test = (max(floor, round(c * n / GPIC_TOTAL)) for c in (GPIC_VAL, GPIC_TEST))
        how = f"scaled by n / {GPIC_TOTAL:,} = {n / GPIC_TOTAL:.3g} (corpus smaller than GPIC's)"
    return val, test, (f"gpic: val {val}, test {test} of {n} — 200,000 / 1,000,000 {how}; "
                       f"tiers as fixed train-shard counts {dict(tier_counts(10**9, cfg.tiers, fixed=True)[:-1])}, "
                       "the largest = all")


def apportion(quota: int, sizes: dict[Any, int]) -> dict[Any, int]:
    """Split ``quota`` across strata in proportion to ``sizes`` (largest remainder)."""
    total = sum(sizes.values())
    if total == 0:
        return {s: 0 for s in sizes}
    exact = {s: quota * n / total for s, n in sizes.items()}
    shares = {s: math.floor(v) for s, v in exact.items()}
    for s in sorted(sizes, key=lambda s: (-(exact[s] - shares[s]), str(s)))[: quota - sum(shares.values())]:
        shares[s] += 1
    return shares


def tier_counts(n_train_shards: int, tiers: dict[str, int], fixed: bool = False) -> list[tuple[str, int]]:
    """(tier, shard count) from the smallest to the largest tier; the largest is always every
    train shard. ``fixed`` (gpic preset): the others are their stated shard counts, capped
    at the train shards; else scaled by n_train_shards / the largest's stated count."""
    if not tiers or n_train_shards == 0:
        return []
    ordered = sorted(tiers.items(), key=lambda t: (t[1], t[0]))
    largest = ordered[-1][1]
    counts = [(name, max(1, min(n_train_shards, count if fixed else round(count * n_train_shards / largest))))
              for name, count in ordered[:-1]]
    return counts + [(ordered[-1][0], n_train_shards)]


def tiers_of(tier: str | None, cfg: SplitConfig) -> list[str]:
    """Every tier a sample belongs to, given the smallest one (tiers are nested)."""
    if tier is None:
        return []
    ordered = [name for name, _ in sorted(cfg.tiers.items(), key=lambda t: (t[1], t[0]))]
    return ordered[ordered.index(tier):]
