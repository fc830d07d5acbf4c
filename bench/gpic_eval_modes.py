"""How far apart the two evaluation modes' model inputs are, on the same images.

``paper`` (App. B.1: square centre crop, bicubic to 256, then 224) against
``gpic_eval_port`` (the toolkit port: whole image squashed to 224x224 bicubic), per
aspect ratio: mean absolute difference of the normalised 3x224x224 inputs, and the share
of the image the paper mode's crop drops. Images: smooth synthetic photos (random colour
fields upsampled bilinearly, seeded) — the figures depend on content, so they are an
illustration of scale, not a property of any dataset. No model weights are involved:
feature-level differences need the real DINOv2 weights (not available offline).

    PYTHONPATH=. python bench/gpic_eval_modes.py [--images 20]
"""

from __future__ import annotations

import argparse

import numpy as np
from PIL import Image

from tasks.shared.features.preprocess import gpic_eval, gpic_eval_port

SIZES = [(256, 256), (512, 512), (500, 300), (640, 480), (480, 640), (1024, 576), (800, 200)]


def photo(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = (rng.random((max(2, h // 16), max(2, w // 16), 3)) * 255).astype("uint8")
    return Image.fromarray(small).resize((w, h), Image.BILINEAR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=20, help="images per size")
    args = parser.parse_args()
    print(f"{'size':>10} {'cropped':>8} {'mean |paper - port|':>20} {'max':>8}  (normalised units, "
          f"{args.images} images each)")
    for w, h in SIZES:
        diffs, maxes = [], []
        for seed in range(args.images):
            image = photo(w, h, seed)
            d = np.abs(gpic_eval(image) - gpic_eval_port(image))
            diffs.append(float(d.mean()))
            maxes.append(float(d.max()))
        cropped = 1 - min(w, h) / max(w, h)
        print(f"{w:>5}x{h:<4} {cropped:>8.0%} {np.mean(diffs):>20.4f} {np.max(maxes):>8.3f}")


if __name__ == "__main__":
    main()
