"""Where the demo's statistics time goes, and what share of a build they can cost.

On a corpus built by ``make demo`` (or any build with a ``reference_stats`` section),
measured side by side in one process on one torch thread (what each demo worker has):

* ``model build``: importing the statistics model's family and building it (random init);
* ``read``: ranged reads of the summarised records' bytes through the staging index;
* ``decode + preprocess``: full-resolution decode (the protocol's) and ``gpic_eval``;
* ``forward``: the statistics model's ``embed`` on the preprocessed batch;
* ``stage``: :func:`tasks.shared.features.extract.extract_shard` with the statistics selection
  over every shard (into a scratch copy), i.e. all of the above plus per-unit work;
* ``dedup forward``: the build's near-duplicate model (``features.models[0]``) on the same
  images, for the per-image cost ratio between the two models.

What a build's workers add on top of that, measured too:

* ``timm import``: a fresh process with torch loaded importing timm (each worker pays it
  once, when it builds the statistics model; timm imports torchvision.ops, which imports
  torch._dynamo);
* ``forward, two processes at once``: the same forward in two processes started together
  (what two 1-thread workers do) beside one alone, alternated: the per-image cost when
  both cores embed, which is what a 2-worker build gets;
* ``balance``: images on the busiest worker when the shards' tasks are handed out greedily
  in name order vs largest first (the stage's order).

It then prints the arithmetic of the statistics' share of a build: with ``s`` the share
of staged images summarised and ``r`` the per-image cost ratio (statistics model /
near-duplicate model), the extraction costs ``s × r`` of the feature stage; the fixed
costs (model build per worker, partial tasks) come on top. Forward and stage alternate
``--repeats`` times; the best of each is printed (load from other processes only slows).

    HF_HUB_OFFLINE=1 python bench/stats_cost.py OUT --config configs/demo.yaml
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _pair_worker(n: int, start, queue) -> None:
    """One process: build the statistics' ViT (random init) and time one forward of ``n`` images."""
    import timm
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, img_size=224).eval()
    x = torch.randn(n, 3, 224, 224)
    with torch.inference_mode():
        net(x[:2])
        start.wait()
        t, cpu = time.perf_counter(), time.thread_time()
        net(x)
        wall = time.perf_counter() - t
        queue.put((wall / n, (time.thread_time() - cpu) / wall))


def forward_in_processes(k: int, n: int = 16) -> tuple[float, float]:
    """Mean per-image forward seconds of ``k`` processes started together (1 thread each),
    and the smallest share of its wall time a process spent on a core: below 1, other
    processes of the machine took cores from it, and the time is not the forward's own."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    start, queue = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=_pair_worker, args=(n, start, queue)) for _ in range(k)]
    for p in procs:
        p.start()
    times, shares = zip(*(queue.get() for _ in procs), strict=True)
    for p in procs:
        p.join()
    return sum(times) / k, min(shares)


def timm_import_seconds() -> float:
    """Seconds a fresh process with torch already imported takes to import timm."""
    import subprocess

    code = "import time, torch; t = time.perf_counter(); import timm; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def busiest_worker(sizes: list[int], workers: int) -> int:
    """Images on the busiest worker when tasks of ``sizes`` go, in order, to whichever
    worker is free first (a worker's time taken as its images)."""
    import heapq

    load = [0] * workers
    for size in sizes:
        heapq.heapreplace(load, load[0] + size)
    return max(load)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", help="a built corpus (local folder)")
    ap.add_argument("--config", default="configs/demo.yaml", help="the build config it was built with")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    import torch
    import yaml

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    from corpusforge.layout import FEATURES_DIR, MARKERS
    from corpusforge.storage import Store
    from flows.build_corpus import BuildConfig
    from tasks.shared.features.config import FeaturesConfig
    from tasks.shared.features.decode import decode_rgb
    from tasks.shared.features.extract import _ranged_images, decode_size, extract_shard, load_models, shard_images
    from tasks.stats.reference import GroupSelection, scan_manifest
    from tasks.stats.stage import STATS_SUBSET
    imports = time.perf_counter() - t0

    build = BuildConfig.model_validate({**yaml.safe_load(Path(args.config).read_text()),
                                        "source": "unused", "out": "unused"})
    settings = build.reference_stats
    fcfg = settings.features()
    t = time.perf_counter()
    (model,) = load_models(fcfg)
    model_build = time.perf_counter() - t
    one_thread = build.features.runtime.model_copy(update={"torch_threads": 1})  # onnxruntime too
    (dedup,) = load_models(FeaturesConfig(models=build.features.models[:1], runtime=one_thread))

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "corpus"
        shutil.copytree(args.corpus, scratch, ignore=shutil.ignore_patterns("shards", "graph", "stats"))
        store = Store(str(scratch))

        def clear() -> None:
            for root in (FEATURES_DIR, f"{MARKERS}/{FEATURES_DIR}"):
                shutil.rmtree(scratch / root / model.model_id, ignore_errors=True)

        plan = scan_manifest(store, settings.groups(), settings.sample, settings.tiers, settings.test_subset,
                             settings.test_subset_seed)
        selection = GroupSelection(STATS_SUBSET, plan.rule)
        staged = sum(len(shard_images(store, s)) for s in plan.shards)

        t = time.perf_counter()
        blobs = []
        for shard in plan.shards:
            wanted = selection.keys(store, shard)
            chosen = [c for c in shard_images(store, shard) if c[0] in wanted]
            blobs += [data for _, data, error in _ranged_images(store, shard, chosen) if error is None]
        read = time.perf_counter() - t
        n = len(blobs)
        t = time.perf_counter()
        pictures = [decode_rgb(b) for b in blobs]
        decode = time.perf_counter() - t
        t = time.perf_counter()
        inputs = np.stack([model.preprocess(p) for p in pictures])
        preprocess = time.perf_counter() - t
        draft = decode_size([dedup])
        dedup_inputs = np.stack([dedup.preprocess(decode_rgb(b, draft_size=draft)) for b in blobs])

        def forward(m, x) -> float:
            t = time.perf_counter()
            for i in range(0, len(x), fcfg.runtime.batch_size):
                m.embed(x[i:i + fcfg.runtime.batch_size])
            return time.perf_counter() - t

        def stage() -> float:
            clear()
            t = time.perf_counter()
            for shard in plan.shards:
                extract_shard(store, shard, fcfg, selection)
            return time.perf_counter() - t

        sizes = {shard: len(selection.keys(store, shard)) for shard in plan.shards}
        forward(model, inputs[:4])
        fwd, stg, dd, alone, pair, imp = [], [], [], [], [], []
        for _ in range(args.repeats):
            fwd.append(forward(model, inputs))
            stg.append(stage())
            dd.append(forward(dedup, dedup_inputs))
            alone.append(forward_in_processes(1))
            pair.append(forward_in_processes(2))
            imp.append(timm_import_seconds())
    f, s, d = min(fwd) / n, min(stg) / n, min(dd) / n
    workers = build.dask.n_workers
    by_name = busiest_worker([sizes[x] for x in sorted(sizes)], workers)
    largest = busiest_worker([sizes[x] for x in plan.largest_first()], workers)
    ratios = sorted(b[0] / a[0] for a, b in zip(alone, pair, strict=True))
    best_pair = min(pair)  # the trial least slowed by other processes
    print(f"corpus {args.corpus}: {n} of {staged} staged images summarised ({n / staged:.1%}), "
          f"{len(plan.shards)} staging shards; 1 torch thread; best of {args.repeats}")
    print(f"  imports (torch, project)       {imports:6.2f} s once")
    print(f"  model build ({model.model_id})  {model_build:6.2f} s once per worker")
    print(f"  ranged reads                   {read / n * 1e3:6.1f} ms/img")
    print(f"  decode (full resolution)       {decode / n * 1e3:6.1f} ms/img")
    print(f"  preprocess (gpic_eval)         {preprocess / n * 1e3:6.1f} ms/img")
    print(f"  forward                        {f * 1e3:6.1f} ms/img")
    print(f"  stage (extract_shard, all)     {s * 1e3:6.1f} ms/img   forward / stage = {f / s:.2f}")
    print(f"  dedup forward ({dedup.model_id}) {d * 1e3:6.1f} ms/img   statistics / dedup model = {f / d:.1f}x")
    print(f"arithmetic: extraction ≈ {n / staged:.3f} of the images × {s / d:.1f}x their per-image cost "
          f"= {n / staged * s / d:.2f} of a feature stage that did only the dedup forward")
    print(f"in a {workers}-worker build (each a 1-thread process); load average at the end "
          f"{os.getloadavg()[0]:.1f}:")
    print(f"  timm import (torch loaded)     {min(imp):6.2f} s once per worker, inside model build above "
          f"(range {min(imp):.2f}-{max(imp):.2f})")
    for label, runs in (("one process alone    ", alone), ("two processes at once", pair)):
        print(f"  forward, {label} " + ", ".join(f"{t * 1e3:.0f} ms/img ({share:.0%} on a core)"
                                                for t, share in runs))
    print(f"  together / alone = {ratios[len(ratios) // 2]:.2f} (median of {len(ratios)}, range {ratios[0]:.2f}-"
          f"{ratios[-1]:.2f}); a trial with both processes ~100 % on a core shows the forward's own cost")
    print(f"  balance: busiest worker embeds {by_name} of {n} images in name order, {largest} largest first "
          f"(ideal {-(-n // workers)}); shard sizes {sorted(sizes.values(), reverse=True)}")
    # Here the prefetch threads decode on the idle second core (stage ≈ forward); in a build
    # both cores embed, so a worker's reads, decodes and preprocessing add to its forward.
    other = (read + decode + preprocess) / n
    floor = model_build + largest * (best_pair[0] + other)
    print(f"floor: model build (timm import included) + {largest} images × ({best_pair[0] * 1e3:.0f} ms forward at "
          f"two at once, {best_pair[1]:.0%} on a core, + {other * 1e3:.0f} ms read, decode and preprocess) = "
          f"{floor:.1f} s of statistics on {workers} workers, before scheduling and the partials")


if __name__ == "__main__":
    main()
