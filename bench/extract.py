"""Pipeline efficiency of the feature stage: whole stage vs the models alone.

For each configured model, and for all of them in one pass, two numbers side by side
in one run on the same staging shard:

* ``stage``: images/s of :func:`tasks.shared.features.extract.extract_shard` end to end (read
  the tar, decode once, preprocess on the prefetch threads, embed, write features);
* ``model``: images/s of the models' ``embed`` alone on batches decoded and preprocessed
  beforehand (for several models: the sum of their embed times).

Stage and model runs alternate ``--repeats`` times; throughputs are the best run and the
efficiency is the median of the paired ratios, so load from other processes on a shared
machine skews neither side. CPU milliseconds per image (this process, all threads) are
printed beside them: on a busy machine they are the steadier measure of the work the
stage adds around the models. ``stage / model`` is the pipeline efficiency: 1.0 means decoding, preprocessing and I/O
are completely hidden behind the forward passes (goal: >= 0.9 for learned models). The
weight-free descriptor has almost no "forward", so its stage is decode-bound by design;
its row shows what decoding costs.

CPU defaults (random-init learned models at reduced input sizes, 64 JPEGs of 640 px)::

    HF_HUB_OFFLINE=1 python bench/extract.py                 # ~4 min on 2 cores
    HF_HUB_OFFLINE=1 python bench/extract.py --images 512 --prefetch-threads 4 --device cuda
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from corpusforge.contract import finish_unit  # noqa: E402
from corpusforge.layout import STAGING_RECORDS_SCHEMA, staging_index, staging_records, staging_tar  # noqa: E402
from corpusforge.storage import Store  # noqa: E402
from corpusforge.tarshard import Sample, write_tar  # noqa: E402
from sample_corpus.scenes import draw_scene, render_scene  # noqa: E402
from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig  # noqa: E402
from tasks.shared.features.decode import decode_rgb  # noqa: E402
from tasks.shared.features.extract import decode_size, extract_shard, load_models  # noqa: E402
from tasks.staging.stage import images_digest  # noqa: E402

SHARD = "bench"

# Small random-init variants of every learned family, sized for a 2-core CPU.
CPU_MODELS = {
    "wfd": dict(name="wfd"),
    "sscd": dict(name="sscd_disc_mixup", random_init=True, image_size=160),
    "dinov2": dict(name="dinov2", arch="vit_small_patch14_dinov2", preprocessing="dinov2_eval",
                   random_init=True, image_size=112),
    "clip": dict(name="clip", arch="ViT-B-32", random_init=True),
}


def write_staging_shard(store: Store, n: int, side: int) -> None:
    """One staging shard of ``n`` rendered scenes, JPEG quality 90, longer side ``side``:
    tar, index, records file and the unit's marker, as the staging stage writes them."""
    rng = np.random.default_rng(0)
    samples, records = [], []
    for i in range(n):
        image = render_scene(draw_scene(rng, side, int(side * rng.uniform(0.6, 0.8))))
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90)
        data = buf.getvalue()
        samples.append(Sample(f"img{i:06d}", {"jpg": data, "txt": b"", "json": b"{}"}))
        records.append({"key": f"img{i:06d}", "part": 0, "row": i, "sha256": hashlib.sha256(data).hexdigest(),
                        "width": image.width, "height": image.height, "ext": "jpg", "bytes": len(data)})
    with store.atomic_write(staging_tar(SHARD)) as f:
        result = write_tar(f, samples)
    outputs = {staging_tar(SHARD): result.sha256,
               staging_index(SHARD): store.write_parquet(staging_index(SHARD), result.index),
               staging_records(SHARD): store.write_parquet(
                   staging_records(SHARD), pa.Table.from_pylist(records, schema=STAGING_RECORDS_SCHEMA))}
    finish_unit(store, staging_tar(SHARD), "bench", outputs,
                {"shard": SHARD, "count": result.count, "bytes": result.bytes, "images": images_digest(records)})


def model_only_seconds(cfg: FeaturesConfig, store: Store) -> tuple[float, float]:
    """Embed wall and CPU seconds of every model on the shard's images, decoded and
    preprocessed beforehand."""
    models = load_models(cfg)
    draft = decode_size(models)
    index = store.read_parquet(staging_index(SHARD)).to_pylist()
    images = [decode_rgb(store.read_range(staging_tar(SHARD), r["offset"], r["size"]), draft)
              for r in index if r["ext"] == "jpg"]
    bs = cfg.runtime.batch_size
    wall = cpu = 0.0
    for model in models:
        batches = [np.stack([model.preprocess(im) for im in images[i:i + bs]]) for i in range(0, len(images), bs)]
        model.embed(batches[0])  # warm-up, as the stage's first batch is after its own warm-up below
        start, start_cpu = time.perf_counter(), time.process_time()
        for batch in batches:
            model.embed(batch)
        wall += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
    return wall, cpu


def stage_seconds(cfg: FeaturesConfig, staging: Store, tmp: Path, run: int) -> tuple[float, float]:
    """Wall and CPU seconds of extract_shard on a fresh output folder (models already loaded)."""
    out = Store(str(tmp / f"run{run}"))
    shutil.copytree(staging.root, out.root)  # staging files and their markers
    start, start_cpu = time.perf_counter(), time.process_time()
    extract_shard(out, SHARD, cfg)
    return time.perf_counter() - start, time.process_time() - start_cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="wfd,sscd,dinov2,clip", help=f"comma list of {', '.join(CPU_MODELS)}")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--side", type=int, default=640, help="longer side of the JPEGs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--prefetch-threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per number; the best counts")
    args = parser.parse_args(argv)
    runtime = RuntimeConfig(device=args.device, batch_size=args.batch_size, prefetch_threads=args.prefetch_threads)
    names = args.models.split(",")
    configs = {name: FeaturesConfig(models=[ModelSpec(**CPU_MODELS[name])], runtime=runtime) for name in names}
    if len(names) > 1:
        configs["all together"] = FeaturesConfig(models=[ModelSpec(**CPU_MODELS[n]) for n in names], runtime=runtime)

    with tempfile.TemporaryDirectory() as tmp:
        staging = Store(str(Path(tmp) / "staging-src"))
        write_staging_shard(staging, args.images, args.side)
        print(f"{args.images} JPEGs of {args.side} px, batch {args.batch_size}, prefetch threads "
              f"{args.prefetch_threads}, device {args.device}\n")
        print(f"{'models':>14} {'stage img/s':>12} {'model img/s':>12} {'efficiency':>11} {'(per run)':>18} "
              f"{'stage cpu-ms/img':>17} {'model cpu-ms/img':>17} {'cpu ratio':>10}")
        for run, (label, cfg) in enumerate(configs.items()):
            load_models(cfg)  # load once, outside both timings
            stage_seconds(cfg, staging, Path(tmp), 1000 * run)  # warm-up: caches, lazy inits
            stages, models = [], []
            for repeat in range(args.repeats):
                stages.append(stage_seconds(cfg, staging, Path(tmp), 1000 * run + repeat + 1))
                models.append(model_only_seconds(cfg, staging))
            ratios = [m[0] / s[0] for m, s in zip(models, stages, strict=True)]
            stage_cpu = min(s[1] for s in stages) / args.images * 1e3
            model_cpu = min(m[1] for m in models) / args.images * 1e3
            print(f"{label:>14} {args.images / min(s[0] for s in stages):12.1f} "
                  f"{args.images / min(m[0] for m in models):12.1f} {float(np.median(ratios)):11.2f} "
                  f"{' '.join(f'{r:.2f}' for r in ratios):>18} {stage_cpu:17.1f} {model_cpu:17.1f} "
                  f"{model_cpu / stage_cpu:10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
