"""Benchmark: building the near-duplicate graph at 10k, 100k and 1M 512-d vectors.

One run, side by side: exact FAISS search (IndexFlatIP), the IVF index the stage picks
for that size (``choose_index`` with the stage's defaults), and a numpy brute-force
baseline (blocked matrix product). "Build the graph" = index build (train + add) +
k-NN search of every vector (k = 32) + pairs >= 0.90, canonical and deduplicated.

Each case runs in its own subprocess for a clean peak: the peak RSS is reset after the
data is generated (``/proc/self/clear_refs``), so "peak MB" is what the graph build
adds on top of the vectors. Data: topic clusters (intra-topic cosine ~0.5, the
structure that makes IVF work on real features) plus 5 % planted near-duplicates at
cosine 0.91–0.99 of random originals.

Cases too slow for a 2-core machine search a query sample and extrapolate the search
time linearly in the number of queries (labelled "sampled"; "pairs" then counts the
sample's pairs): brute force above 10k, exact search at 1M (10^12 pair scores, hours),
IVF search at 1M (100k of the 1M queries; its build is always complete). Recall is
over the queries both runs searched. Usage: ``python bench/graph.py [--sizes 10000 100000 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tasks.graph import index as fx  # noqa: E402
from tasks.graph.config import IndexConfig  # noqa: E402

DIM, K, THRESHOLD, SEED = 512, 32, 0.90, 0
# Above FULL_LIMIT a method searches SAMPLED queries (a prefix of one seeded permutation,
# so every sample contains the smaller ones) and its search time is extrapolated.
FULL_LIMIT = {"numpy": 10_000, "flat": 100_000, "ivf": 100_000}
SAMPLED = {"numpy": 2_000, "flat": 2_000, "ivf": 100_000}


def make_vectors(n: int, dim: int = DIM, seed: int = SEED) -> np.ndarray:
    """Clustered unit vectors with planted near-duplicates, generated in chunks."""
    rng = np.random.default_rng(seed)
    n_topics = max(10, n // 100)
    centers = rng.standard_normal((n_topics, dim)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    x = np.empty((n, dim), dtype=np.float32)
    for lo in range(0, n, 100_000):
        hi = min(n, lo + 100_000)
        noise = rng.standard_normal((hi - lo, dim), dtype=np.float32) / np.float32(math.sqrt(dim))
        x[lo:hi] = centers[rng.integers(0, n_topics, hi - lo)] + noise
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    dup = rng.choice(n, size=n // 20, replace=False)
    parent = rng.integers(0, n, size=len(dup))
    sim = rng.uniform(0.91, 0.99, size=len(dup)).astype(np.float32)[:, None]
    base = x[parent]
    r = rng.standard_normal(base.shape, dtype=np.float32)
    r -= np.sum(r * base, axis=1, keepdims=True) * base
    r /= np.linalg.norm(r, axis=1, keepdims=True)
    x[dup] = sim * base + np.sqrt(1 - sim**2) * r
    x[dup] /= np.linalg.norm(x[dup], axis=1, keepdims=True)
    return x


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def numpy_pairs(x: np.ndarray, queries: np.ndarray, q_ids: np.ndarray):
    """Brute force: blocked products, top-k per query like the FAISS searches, then threshold."""
    srcs, dsts, sims = [], [], []
    block = max(1, min(1024, 2**27 // len(x)))  # <= 512 MB of scores per block
    for lo in range(0, len(queries), block):
        s = queries[lo:lo + block] @ x.T
        top = np.argpartition(-s, K - 1, axis=1)[:, :K]
        ts = np.take_along_axis(s, top, axis=1)
        src = np.repeat(q_ids[lo:lo + block], K)
        keep = (ts.ravel() >= THRESHOLD) & (top.ravel() != src)
        srcs.append(src[keep])
        dsts.append(top.ravel()[keep])
        sims.append(ts.ravel()[keep])
    return np.concatenate(srcs), np.concatenate(dsts), np.concatenate(sims)


def run_case(method: str, n: int) -> dict:
    """One case in this (fresh) process: returns timings, peak memory and the pairs."""
    faiss_threads = os.environ.get("BENCH_THREADS")
    fx.set_threads(int(faiss_threads) if faiss_threads else None)
    x = make_vectors(n)
    ids = np.arange(n, dtype=np.int64)
    sampled = n > FULL_LIMIT[method]
    q_ids = np.sort(np.random.default_rng(SEED + 1).permutation(n)[:SAMPLED[method]]) if sampled else ids
    rss0 = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t0 = time.perf_counter()
    choice = None
    if method == "numpy":
        t_build = 0.0
        src, dst, sim = numpy_pairs(x, x[q_ids], q_ids)
    else:
        cfg = IndexConfig(kind="flat" if method == "flat" else "ivf")
        choice = fx.choose_index(cfg, n, DIM)
        index = fx.new_index(choice, SEED)
        if choice.kind == "ivf":
            train = x[np.sort(np.random.default_rng(SEED + 2).choice(n, choice.n_train, replace=False))]
            fx.train_index(index, train)
            del train
        index.add_with_ids(x, ids)
        t_build = time.perf_counter() - t0
        src, dst, sim = fx.search_pairs(index, q_ids, x[q_ids], THRESHOLD, "knn", K)
    a, b, s = fx.canonical_pairs(src, dst, sim)
    total = time.perf_counter() - t0
    scale = n / len(q_ids)
    return {"method": method, "n": n, "sampled": sampled, "queries": int(len(q_ids)),
            "plan": choice.factory if choice else "numpy", "build_s": t_build,
            "search_s": total - t_build, "total_s": t_build + (total - t_build) * scale,
            "peak_mb": (_status("VmHWM") - rss0) / 2**20, "pairs": int(len(a)),
            "directed": {"q": q_ids.tolist() if sampled else None,
                         "src": src.tolist(), "dst": dst.tolist()}}


def recall(exact: dict, other: dict) -> float | None:
    """Share of the exact k-NN pairs (>= threshold) that ``other`` found, over the queries both ran."""
    qs = [set(r["directed"]["q"]) for r in (exact, other) if r["directed"]["q"] is not None]
    common = set.intersection(*qs) if qs else None

    def pairs(r: dict) -> set:
        d = r["directed"]
        return {p for p in zip(d["src"], d["dst"], strict=True) if common is None or p[0] in common}

    want = pairs(exact)
    return len(want & pairs(other)) / len(want) if want else None


def _subprocess(method: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", method, str(n)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--case", nargs=2)
    args = p.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case[0], int(args.case[1]))))
        return
    rows = []
    for n in args.sizes:
        found = {m: _subprocess(m, n) for m in ("numpy", "flat", "ivf")}
        found["ivf"]["recall_vs_exact"] = recall(found["flat"], found["ivf"])
        found["numpy"]["recall_vs_exact"] = recall(found["flat"], found["numpy"])
        for m, r in found.items():
            r.pop("directed")
            rows.append(r)
            print(f"N={n:>9,} {m:6s} {r['plan']:16s} build {r['build_s']:8.1f}s  search {r['search_s']:8.1f}s  "
                  f"total {r['total_s']:9.1f}s{' (sampled ' + str(r['queries']) + ' queries, extrapolated)' if r['sampled'] else ''}"
                  f"  peak +{r['peak_mb']:7.0f} MB  pairs {r['pairs']:>8,}  recall {r.get('recall_vs_exact', '(reference)')}",
                  flush=True)
    print("\ngrowth exponent of total time between sizes (t ~ N^e):")
    for m in ("numpy", "flat", "ivf"):
        pts = [r for r in rows if r["method"] == m]
        for r1, r2 in zip(pts, pts[1:], strict=False):
            e = math.log(r2["total_s"] / r1["total_s"]) / math.log(r2["n"] / r1["n"])
            print(f"  {m:6s} {r1['n']:>9,} -> {r2['n']:>9,}: e = {e:.2f}")
    print("\nratios measured in this run (total time):")
    for n in args.sizes:
        by = {r["method"]: r for r in rows if r["n"] == n}
        print(f"  N={n:>9,}: numpy/flat = {by['numpy']['total_s'] / by['flat']['total_s']:.2f}, "
              f"flat/ivf = {by['flat']['total_s'] / by['ivf']['total_s']:.1f}")


if __name__ == "__main__":
    main()
