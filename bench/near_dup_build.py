"""The real-picture set (bench/real_photos.py) through a build's own stages: features, then the
graph stage with its defaults, once per ``near_dedup.crop_candidates`` value asked for, each in a
fresh output root; planted copies removed per transform, false removals and seconds.

Where ``bench/near_duplicates.py`` scores links in memory, this measures what a build removes
and what it costs: a copy counts as removed when it and its original end with the same kept
image; a false removal is an image removed for an image of another picture. Run the values in
both orders on a loaded machine (each root is built from scratch)::

    HF_HUB_OFFLINE=1 python bench/near_dup_build.py --seed 0 --crop-candidates 0,5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import real_photos  # noqa: E402

from corpusforge.storage import Store  # noqa: E402
from tasks.graph.config import NearDedupConfig  # noqa: E402
from tasks.graph.decisions import read_decisions  # noqa: E402
from tasks.graph.stage import near_duplicate_stage  # noqa: E402
from tasks.shared.features.config import FeaturesConfig  # noqa: E402
from tasks.shared.features.extract import extract_features  # noqa: E402
from tests.staging_files import stage_images  # noqa: E402

SHARD_SIZE = 100


def build(folder: Path, images: Path, keys: list[str], crop_candidates: int
          ) -> tuple[dict, tuple[float, float], tuple[float, float], dict]:
    """Stage, extract and run the graph stage: decisions by key, (wall, CPU) seconds of the
    features and of the graph stage (this process, every thread: less bent by load), summary."""
    store = Store(str(folder))
    shards = []
    for i in range(0, len(keys), SHARD_SIZE):
        shards.append(f"{i // SHARD_SIZE:06d}")
        stage_images(store, shards[-1], [(k, (images / f"{k}.png").read_bytes(), "png")
                                         for k in keys[i:i + SHARD_SIZE]])
    start = time.perf_counter(), time.process_time()
    extract_features(store, shards, FeaturesConfig())
    middle = time.perf_counter(), time.process_time()
    summary, _ = near_duplicate_stage(store, NearDedupConfig(crop_candidates=crop_candidates), shards)
    end = time.perf_counter(), time.process_time()
    features, graph = (middle[0] - start[0], middle[1] - start[1]), (end[0] - middle[0], end[1] - middle[1])
    return {r["key"]: r for r in read_decisions(store, shards).to_pylist()}, features, graph, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-transform", type=int, default=18)
    parser.add_argument("--crop-candidates", default="0,5", help="values of near_dedup.crop_candidates, in order")
    parser.add_argument("--debian-cache", default=str(Path(__file__).resolve().parents[1] / ".cache" / "debian"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        truth = real_photos.build(Path(tmp) / "set", Path(args.debian_cache), args.seed, args.per_transform)
        rows = truth["records"]
        original = {r["key"]: r["group"] for r in rows if r["transform"] is None}
        group = {r["key"]: original[r.get("copy_of", r["key"])] for r in rows}
        for k in (int(v) for v in args.crop_candidates.split(",")):
            decisions, features, graph, summary = build(Path(tmp) / f"k{k}", Path(tmp) / "set" / "images",
                                                        sorted(group), k)
            kept = {x: d["duplicate_of"] if d["status"] == "near_duplicate" else x for x, d in decisions.items()}
            removed: dict[str, int] = {}
            for r in rows:
                if r["transform"] is not None:
                    removed[r["transform"]] = removed.get(r["transform"], 0) + (kept[r["key"]] == kept[r["copy_of"]])
            false = sum(group[d] != group[x] for x, d in kept.items() if d != x)
            print(json.dumps({"crop_candidates": k, "seed": args.seed, "features_s": round(features[0], 1),
                              "graph_s": round(graph[0], 1), "features_cpu_s": round(features[1], 1),
                              "graph_cpu_s": round(graph[1], 1), "removed": sum(removed.values()),
                              "of": len(rows) - len(original),
                              "false_removals": false, "per_transform": removed,
                              "crops": summary["verification"]["crop_candidates"],
                              "by_rule": summary["decisions"]["removed_by_rule"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
