"""Caption statistics for the reports: word counts per caption type (GPIC Fig. 2) and the
realised caption-type mix per split and per release shard, from what the receipt holds."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any


def mix_by_split(shards: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{split: {caption type: samples}} from the release section's shards."""
    mix: dict[str, Counter[str]] = defaultdict(Counter)
    for shard in shards.values():
        mix[shard["split"]].update(shard["caption_type"])
    return {split: dict(sorted(c.items())) for split, c in sorted(mix.items())}


def _quantile(values: list[tuple[int, int]], total: int, q: float) -> int:
    """The q-quantile (lower) of a distribution given as sorted (value, count) pairs."""
    target, seen = q * (total - 1), 0
    for value, count in values:
        seen += count
        if seen > target:
            return value
    return values[-1][0]


def word_stats(words: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Per caption type: captions, mean, p10, median, p90 and max words."""
    out = {}
    for t, dist in words.items():
        pairs = sorted((int(n), c) for n, c in dist.items())
        total = sum(c for _, c in pairs)
        if not total:
            continue
        out[t] = {"captions": total, "mean": round(sum(n * c for n, c in pairs) / total, 2),
                  "p10": _quantile(pairs, total, 0.1), "median": _quantile(pairs, total, 0.5),
                  "p90": _quantile(pairs, total, 0.9), "max": pairs[-1][0]}
    return out


def share_table(mix: dict[str, dict[str, int]], types: list[str]) -> list[list[Any]]:
    """Rows [name, samples, share of each type in %] of a {name: {type: count}} mapping."""
    rows = []
    for name, counts in mix.items():
        n = sum(counts.values())
        rows.append([name, n, *[f"{100 * counts.get(t, 0) / max(1, n):.1f}%" for t in types]])
    return rows


def word_chart_png(words: dict[str, dict[str, int]]) -> Any:
    """A matplotlib figure: word-count distribution per caption type (share of its captions)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for t in ("tag", "short", "medium", "long"):
        if t not in words:
            continue
        pairs = sorted((int(n), c) for n, c in words[t].items())
        total = sum(c for _, c in pairs)
        ax.plot([n for n, _ in pairs], [c / total for _, c in pairs], marker="o", markersize=3, label=t)
    ax.set_xlabel("words per caption")
    ax.set_ylabel("share of captions")
    ax.legend(fontsize=8, title="caption type", title_fontsize=8)
    return fig
