"""Where the demo's statistics time goes, and what share of a build they can cost.

On a corpus built by ``make demo`` (or any build with a ``reference_stats`` section),
measured side by side in one process on one torch thread (what each demo worker has):

* ``model build``: importing the statistics model's family and building it (random init);
* ``read``: ranged reads of the summarised records' bytes through the staging index;
* ``decode + preprocess``: full-resolution decode (the protocol's) and ``gpic_eval``;
* ``forward``: the statistics model's ``embed`` on the preprocessed batch;
* ``stage``: :func:`tasks.features.extract.extract_shard` with the statistics selection
  over every shard (into a scratch copy), i.e. all of the above plus per-unit work;
* ``dedup forward``: the build's near-duplicate model (``features.models[0]``) on the same
  images, for the per-image cost ratio between the two models.

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
    from tasks.features.config import FeaturesConfig
    from tasks.features.decode import decode_rgb
    from tasks.features.extract import _ranged_images, decode_size, extract_shard, load_models, shard_images
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
        selection = GroupSelection(STATS_SUBSET, plan.plan)
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

        forward(model, inputs[:4])
        fwd, stg, dd = [], [], []
        for _ in range(args.repeats):
            fwd.append(forward(model, inputs))
            stg.append(stage())
            dd.append(forward(dedup, dedup_inputs))
    f, s, d = min(fwd) / n, min(stg) / n, min(dd) / n
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


if __name__ == "__main__":
    main()
