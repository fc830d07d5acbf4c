"""The standard copy transforms planted to measure and calibrate near-duplicate detection.

One definition for the real-picture benchmark (``bench/near_duplicates.py --real``), the
tests and self-calibration: the eleven transforms of the first measurement on real
photographs (issue 34) plus ``scale``, ``aspect`` and ``screenshot`` framing. Each takes an
RGB picture and a seeded generator and returns the copy as it would be *stored* (a JPEG
re-encode is part of the transform where the name says so; the others are stored
losslessly by the caller). Parameters are drawn from the generator, so a seed fixes every
copy; the off-centre crop keeps 70 % of each side at a random corner-ward offset.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageOps

Transform = Callable[[Image.Image, np.random.Generator], Image.Image]


def _jpeg(image: Image.Image, quality: int) -> Image.Image:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def _crop(image: Image.Image, side: float, ax: float, ay: float) -> Image.Image:
    """A crop keeping ``side`` of each side, placed at (ax, ay) in [0, 1] of the room left."""
    w, h = image.size
    cw, ch = round(w * side), round(h * side)
    x0, y0 = round((w - cw) * ax), round((h - ch) * ay)
    return image.crop((x0, y0, x0 + cw, y0 + ch))


def _offcentre(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    # anchors in the outer thirds of the room: the crop is off the centre on both axes
    ax, ay = (float(rng.choice([rng.uniform(0, 0.2), rng.uniform(0.8, 1)])) for _ in range(2))
    return _crop(image, 0.7, ax, ay)


def _watermark(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    base = image.convert("RGBA")
    w, h = base.size
    layer = Image.new("RGBA", base.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    size = max(8, int(min(w, h) * 0.08))
    ink = (255, 255, 255, 150) if rng.random() < 0.5 else (0, 0, 0, 150)
    x, y = w * float(rng.uniform(0.05, 0.45)), h * float(rng.uniform(0.6, 0.85))
    draw.text((x, y), "(c) stock photo", fill=ink, font_size=size)
    return Image.alpha_composite(base, layer).convert("RGB")


def _border(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    w, h = image.size
    fill = tuple(int(v) for v in rng.choice([(0, 0, 0), (255, 255, 255), (128, 128, 128)]))
    return ImageOps.expand(image, border=round(0.1 * max(w, h)), fill=fill)


def _rotate(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    angle = 5.0 if rng.random() < 0.5 else -5.0
    fill = tuple(int(v) for v in rng.choice([(0, 0, 0), (255, 255, 255)]))
    return image.rotate(angle, Image.Resampling.BICUBIC, expand=True, fillcolor=fill)


def _aspect(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    w, h = image.size
    f = float(rng.uniform(1.2, 1.35))
    return image.resize((round(w * f), h) if rng.random() < 0.5 else (w, round(h * f)), Image.Resampling.BICUBIC)


def _screenshot(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """The picture shown at 60-80 % of a light or dark window with a title bar and margins."""
    w, h = image.size
    scale = float(rng.uniform(0.6, 0.8))
    shown = image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BILINEAR)
    dark = rng.random() < 0.5
    canvas = Image.new("RGB", (w, h + round(0.06 * h)), (32, 33, 36) if dark else (242, 242, 242))
    draw = ImageDraw.Draw(canvas)
    bar = round(0.06 * h)
    draw.rectangle((0, 0, w, bar), fill=(60, 64, 67) if dark else (222, 222, 222))
    draw.text((8, bar // 4), "photo.jpg - Viewer", fill=(200, 200, 200) if dark else (40, 40, 40))
    x = int(rng.integers(0, max(1, w - shown.width)))
    canvas.paste(shown, (x, bar + (canvas.height - bar - shown.height) // 2))
    return _jpeg(canvas, 90)


TRANSFORMS: dict[str, Transform] = {
    "jpeg_q40": lambda im, rng: _jpeg(im, 40),
    "resize_50": lambda im, rng: im.resize((max(1, im.width // 2), max(1, im.height // 2)), Image.Resampling.BILINEAR),
    "brightness": lambda im, rng: ImageEnhance.Brightness(im).enhance(float(rng.choice([0.75, 1.3]))),
    "greyscale": lambda im, rng: im.convert("L").convert("RGB"),
    "hflip": lambda im, rng: ImageOps.mirror(im),
    "centre_crop_85": lambda im, rng: _crop(im, 0.85, 0.5, 0.5),
    "offcentre_crop_70": _offcentre,
    "rotate_5": _rotate,
    "watermark": _watermark,
    "border_10": _border,
    "crop85_jpeg50_brightness": lambda im, rng: _jpeg(
        ImageEnhance.Brightness(_crop(im, 0.85, float(rng.uniform(0.2, 0.8)), float(rng.uniform(0.2, 0.8))))
        .enhance(float(rng.choice([0.8, 1.2]))), 50),
    "scale_150": lambda im, rng: im.resize((round(im.width * 1.5), round(im.height * 1.5)), Image.Resampling.BICUBIC),
    "aspect": _aspect,
    "screenshot": _screenshot,
}


def plant(image: Image.Image, transform: str, seed: int) -> Image.Image:
    """The copy of ``image`` under ``transform`` with parameters drawn from ``seed``."""
    return TRANSFORMS[transform](image.convert("RGB"), np.random.default_rng(seed))
