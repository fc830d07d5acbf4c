"""Feature-model throughput on one GPU: images/s and model FLOP utilisation (MFU).

For each model (random-init weights, synthetic input, bf16 autocast by default) and each
batch size of the sweep, two numbers side by side in one run:

* ``model``: the network alone on a batch already on the GPU (the accelerator's ceiling);
* ``embed``: :meth:`FeatureModel.embed` as the extraction stage calls it, numpy in and out
  (pinned host copy, non-blocking transfer, normalisation, copy back).

FLOPs per image are counted with ``torch.utils.flop_counter`` (matmuls and convolutions,
2 FLOPs per multiply-add) and printed beside the nominal figures (SSCD ResNet-50 at
320 px ~ 16.7 GFLOP, ViT-L/14 at 224 px ~ 162 GFLOP). MFU = images/s x FLOPs per image /
peak (``--peak-tflops``, default 989: H100/H200 dense bf16).

Run on a GPU host (finishes in well under 5 minutes on an H100/H200)::

    HF_HUB_OFFLINE=1 python bench/gpu_extract.py
    python bench/gpu_extract.py --models sscd --batch-sizes 64,128,256,512

Without CUDA it prints a message and exits 0. ``--device cpu`` runs the same code on a
CPU with tiny inputs, only to check the script itself (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from tasks.shared.features.config import ModelSpec, RuntimeConfig  # noqa: E402
from tasks.shared.features.registry import build_model  # noqa: E402

NOMINAL_GFLOP = {"sscd": 16.7, "clip": 162.0, "dinov2": 162.0}
SPECS = {
    "sscd": dict(name="sscd_disc_mixup"),
    "clip": dict(name="clip", arch="ViT-L-14"),
    "dinov2": dict(name="dinov2", arch="vit_large_patch14_dinov2", preprocessing="dinov2_eval"),
}


def count_flops(model, size: int) -> float:
    """FLOPs of one image through the network (autocast as configured)."""
    x = torch.randn(1, 3, size, size, device=model.device)
    with FlopCounterMode(display=False) as counter, torch.inference_mode(), \
            torch.autocast(model.device.type, dtype=model.autocast_dtype, enabled=model.autocast_dtype is not None):
        model.net(x)
    return float(counter.get_total_flops())


def timed(fn, device: torch.device, min_seconds: float, warmup: int) -> tuple[float, int]:
    """Seconds per call of ``fn`` after warm-up, measured over at least ``min_seconds``."""
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and calls >= 3:
            return elapsed / calls, calls


def bench_model(key: str, args, runtime: RuntimeConfig, deadline: float) -> list[dict]:
    size = args.image_size or (320 if key == "sscd" else 224)
    spec = ModelSpec(**SPECS[key], random_init=True, image_size=size if args.image_size else None)
    t0 = time.perf_counter()
    model = build_model(spec, runtime)
    load_s = time.perf_counter() - t0
    flops = count_flops(model, size)
    print(f"\n{model.model_id}: dim {model.dim}, input {size}px, built+moved in {load_s:.1f}s, "
          f"{flops / 1e9:.1f} GFLOP/img counted (nominal {NOMINAL_GFLOP[key]:.1f} at full size)")
    print(f"{'batch':>6} {'model img/s':>12} {'embed img/s':>12} {'embed/model':>12} {'ms/batch':>9} "
          f"{'TFLOP/s':>8} {'MFU':>6}")
    rows = []
    for bs in args.batch_sizes:
        if time.perf_counter() > deadline:
            print(f"{bs:>6}  skipped: time budget spent")
            break
        try:
            x_dev = torch.randn(bs, 3, size, size, device=model.device)
            if model.channels_last:
                x_dev = x_dev.contiguous(memory_format=torch.channels_last)
            x_host = np.random.default_rng(0).standard_normal((bs, 3, size, size), dtype=np.float32)

            def net_only():
                with torch.inference_mode(), torch.autocast(model.device.type, dtype=model.autocast_dtype,
                                                            enabled=model.autocast_dtype is not None):
                    model.net(x_dev)

            t_model, _ = timed(net_only, model.device, args.min_seconds, args.warmup)
            t_embed, _ = timed(lambda: model.embed(x_host), model.device, args.min_seconds, args.warmup)
        except torch.cuda.OutOfMemoryError:
            print(f"{bs:>6}  out of memory; stopping this sweep")
            torch.cuda.empty_cache()
            break
        ips_model, ips_embed = bs / t_model, bs / t_embed
        tflops = ips_model * flops / 1e12
        mfu = tflops / args.peak_tflops
        rows.append(dict(model=model.model_id, batch=bs, model_ips=ips_model, embed_ips=ips_embed, mfu=mfu))
        print(f"{bs:>6} {ips_model:>12.1f} {ips_embed:>12.1f} {ips_embed / ips_model:>12.2f} "
              f"{t_model * 1e3:>9.1f} {tflops:>8.1f} {mfu:>6.1%}")
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="sscd,clip,dinov2", help="comma list of sscd, clip, dinov2")
    ap.add_argument("--batch-sizes", default="32,64,128,256",
                    type=lambda s: [int(b) for b in s.split(",")])
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--no-channels-last", action="store_true", help="NCHW for the CNN (SSCD)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense peak at --precision")
    ap.add_argument("--min-seconds", type=float, default=2.0, help="timed duration per measurement")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-seconds", type=float, default=240.0, help="stop sweeping after this long")
    ap.add_argument("--image-size", type=int, default=None, help="override the input size (tests use tiny ones)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu only checks the script (tiny sizes), its numbers mean nothing")
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_extract: no CUDA device here; this benchmark needs a GPU (H100/H200). Nothing measured.")
        return 0
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        props = torch.cuda.get_device_properties(0)
        print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}; "
              f"precision {args.precision}; peak {args.peak_tflops:.0f} TFLOP/s")
    runtime = RuntimeConfig(device=args.device, precision=args.precision, channels_last=not args.no_channels_last)
    deadline = time.perf_counter() + args.budget_seconds
    rows = []
    for key in [m.strip() for m in args.models.split(",") if m.strip()]:
        if key not in SPECS:
            ap.error(f"unknown model {key!r}; choose from {sorted(SPECS)}")
        rows += bench_model(key, args, runtime, deadline)
    if rows:
        print("\nbest per model (model-only img/s, batch, MFU):")
        for name in dict.fromkeys(r["model"] for r in rows):
            best = max((r for r in rows if r["model"] == name), key=lambda r: r["model_ips"])
            print(f"  {name:<28} {best['model_ips']:>9.1f} img/s  batch {best['batch']:<4} MFU {best['mfu']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
