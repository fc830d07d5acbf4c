"""What `corpusforge plan` costs beside the no-op rerun it predicts.

1. A real corpus (the sample generator): a fresh build, then a no-op rerun through
   Prefect and the Dask cluster as the CLI runs it, and a plan of the same build: both
   measured, and the no-op rerun's seconds per unit.
2. Synthetic markers, 10k and 100k units (resolve partitions: the per-unit path every
   planned stage takes — read the marker, compute the key with the stage's function,
   explain): plan's time and its growth exponent, and the same units' skip check through
   the contract in-process (the floor of any rerun, without scheduling).
3. The ratio at 10k and 100k: plan's measured time over the no-op rerun's per-unit cost
   from (1) times N — **extrapolated**, since a 100k-unit real rerun does not fit here.

Goals: plan <= 0.1x a no-op rerun, growth <= N^1.1.

    .venv/bin/python bench/plan.py [--n 1000] [--units 10000 100000]
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
from pathlib import Path

from corpusforge.cluster import prefect_api
from corpusforge.contract import finish_unit, run_unit
from tasks.ingest.files import resolved_path
from corpusforge.plans import StagePlan, judge_unit
from corpusforge.storage import Store
from flows.build_corpus import BUILD_MODULES, BuildConfig, run_build
from flows.plan import plan_build
from sample_corpus import write_sample_corpus
from tasks.ingest.exact_dedup import combine_digests, resolve_key

SHARD_SIZE = 100
BUCKETS = 64


def config(source: Path, out: Path) -> BuildConfig:
    return BuildConfig.model_validate({
        "source": str(source), "out": str(out), "input": {"partition_size": 50},
        "staging": {"shard_size": 50}, "splits": {"shard_size": 100},
        "dask": {"n_workers": 2, "processes": True}})


def real_corpus(n: int, root: Path) -> dict[str, float]:
    """Fresh build, then a timed no-op rerun and a timed plan of the same corpus."""
    write_sample_corpus(str(root / "source"), n=n, seed=0)
    cfg = config(root / "source", root / "out")
    with prefect_api():
        run_build(cfg)
        started = time.perf_counter()
        work = run_build(cfg)["work"]
        rerun = time.perf_counter() - started
    started = time.perf_counter()
    plans = plan_build(cfg, BUILD_MODULES)
    plan = time.perf_counter() - started
    units = sum(len(s.units) for s in plans)
    recomputed = sum(w["computed"] for w in (work["ingest"], work["staging"], work["publish"]["release_shards"]))
    return {"rerun_s": rerun, "plan_s": plan, "units": units, "recomputed": recomputed}


def synthetic(n: int, root: Path) -> dict[str, float]:
    """``n`` resolve units with markers; plan's per-unit path and the contract's skip, timed."""
    store = Store(str(root / f"synthetic-{n}"), fsync=False)
    decisions = combine_digests([f"{b:064x}" for b in range(2 * BUCKETS)])  # as the run passes them
    digests = [f"{i:064x}" for i in range(n)]
    for i in range(n):
        finish_unit(store, resolved_path(i), resolve_key(SHARD_SIZE, digests[i], decisions),
                    {resolved_path(i): digests[i]}, {"part": i, "survivors": 10, "candidates": []})
    stage = StagePlan("resolve")
    started = time.perf_counter()
    for i in range(n):
        judge_unit(stage, store, resolved_path(i), str(i), resolve_key, SHARD_SIZE, digests[i], decisions)
    plan = time.perf_counter() - started
    assert all(u.action == "skipped" for u in stage.units)
    started = time.perf_counter()
    for i in range(n):
        run_unit(store, resolved_path(i), resolve_key(SHARD_SIZE, digests[i], decisions), lambda: ({}, {}))
    check = time.perf_counter() - started
    return {"plan_s": plan, "contract_skip_s": check}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="records of the real corpus")
    parser.add_argument("--units", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    logging.getLogger("prefect").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        real = real_corpus(args.n, Path(tmp) / "real")
        per_unit = real["rerun_s"] / real["units"]
        print(f"real corpus, {args.n} records, {real['units']} planned units: no-op rerun {real['rerun_s']:.1f} s "
              f"({real['recomputed']} units recomputed), plan {real['plan_s']:.2f} s: "
              f"ratio {real['plan_s'] / real['rerun_s']:.3f} (measured); no-op rerun {1000 * per_unit:.1f} ms per unit")
        results = {}
        for n in args.units:
            results[n] = synthetic(n, Path(tmp))
            r = results[n]
            print(f"{n} synthetic units: plan {r['plan_s']:.2f} s ({1e6 * r['plan_s'] / n:.0f} µs/unit, measured), "
                  f"contract skip check in-process {r['contract_skip_s']:.2f} s (measured); "
                  f"ratio to a no-op rerun {r['plan_s'] / (per_unit * n):.2g} (extrapolated from the real rerun's "
                  "per-unit cost)")
        if len(args.units) >= 2:
            a, b = args.units[0], args.units[-1]
            exponent = math.log(results[b]["plan_s"] / results[a]["plan_s"]) / math.log(b / a)
            print(f"plan time growth {a} → {b} units: N^{exponent:.2f} (goal <= N^1.1)")


if __name__ == "__main__":
    main()
