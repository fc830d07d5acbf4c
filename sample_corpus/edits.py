"""Near-duplicate edits: what reposts, crops, filters and bursts do to a picture.

Each edit is drawn with all its parameters (so the design, and therefore the captions and
the ground truth, are fixed before any pixel exists) and applied to the original's pixels.
``easy`` edits keep the picture almost unchanged; ``hard`` edits change its geometry,
colour or content enough that a copy detector has to work for it. Every edit keeps the
longer side of an original of at least ``MIN_SOURCE_SIDE`` px at 300 px or more, so the
copy passes the size filters and must be caught by near-duplicate search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageOps

from sample_corpus.captions import CaptionView
from sample_corpus.encoding import Encoding
from sample_corpus.lettering import draw_words, fitted_font

EASY_EDITS = ("downscale", "jpeg_quality", "light_crop", "brightness", "format_change")
HARD_EDITS = ("hflip", "heavy_crop", "greyscale", "overlay", "blur", "rotate")
MIN_SOURCE_SIDE = 500   # longer side an original needs to be the source of a near-duplicate
MIN_COPY_SIDE = 300


@dataclass(frozen=True)
class Edit:
    """One drawn edit: its name as it appears in the ground truth, parameters and output encoding."""

    name: str
    difficulty: str                   # "easy", "hard" or "burst"
    encoding: Encoding
    params: dict[str, Any] = field(default_factory=dict)

    def caption_view(self) -> CaptionView:
        """How the edit shows in a caption of the copy."""
        if self.name == "hflip":
            return CaptionView(mirrored=True)
        if self.name == "greyscale":
            return CaptionView(greyscale=True)
        if self.name in ("caption_bar", "watermark"):
            return CaptionView(overlay=self.name, overlay_words=self.params["words"],
                               overlay_where=self.params.get("edge", "bottom"))
        return CaptionView()


def _crop_box(rng: np.random.Generator, low: float, high: float) -> tuple[float, float, float, float]:
    """A box that removes between ``low`` and ``high`` of each dimension, split at random."""
    cut_w, cut_h = rng.uniform(low, high, size=2)
    left, top = float(rng.uniform(0, cut_w)), float(rng.uniform(0, cut_h))
    return (left, top, left + 1 - float(cut_w), top + 1 - float(cut_h))


def draw_edit(kind: str, rng: np.random.Generator, size: tuple[int, int], source: Encoding) -> Edit:
    """Draw the parameters of one near-duplicate edit of ``kind`` for an original of ``size``."""
    longest = max(size)
    if longest < MIN_SOURCE_SIDE:
        raise ValueError(f"original of {size} is too small to be a near-duplicate source")
    difficulty = "easy" if kind in EASY_EDITS else "hard"
    if kind == "downscale":
        scale = float(rng.uniform(max(0.5, MIN_COPY_SIDE / longest), 0.8))
        target = (max(1, round(size[0] * scale)), max(1, round(size[1] * scale)))
        return Edit(kind, difficulty, source, {"size": target})
    if kind == "jpeg_quality":
        quality = int(rng.integers(45, 76))  # originals are saved at 80–95
        return Edit(kind, difficulty, Encoding("JPEG", quality))
    if kind == "light_crop":
        return Edit(kind, difficulty, source, {"box": _crop_box(rng, 0.02, 0.08)})
    if kind == "brightness":
        factor = float(rng.uniform(1.1, 1.2) if rng.random() < 0.5 else rng.uniform(0.8, 0.9))
        return Edit(kind, difficulty, source, {"factor": factor})
    if kind == "format_change":
        if source.format == "JPEG":
            target = Encoding("PNG") if rng.random() < 0.5 else Encoding("WEBP", int(rng.integers(80, 96)))
        else:
            target = Encoding("JPEG", int(rng.integers(80, 96)))
        return Edit(kind, difficulty, target)
    if kind == "hflip":
        return Edit(kind, difficulty, source)
    if kind == "heavy_crop":
        return Edit(kind, difficulty, source, {"box": _crop_box(rng, 0.12, 0.25)})
    if kind == "greyscale":
        return Edit(kind, difficulty, source)
    if kind == "overlay":
        if rng.random() < 0.5:
            return Edit("caption_bar", difficulty, source, {
                "words": draw_words(rng, 2, 4), "edge": "bottom" if rng.random() < 0.7 else "top",
                "height": float(rng.uniform(0.1, 0.16)), "dark": bool(rng.random() < 0.6)})
        return Edit("watermark", difficulty, source, {
            "words": draw_words(rng, 1, 2), "opacity": float(rng.uniform(0.3, 0.5)),
            "size": float(rng.uniform(0.1, 0.16)), "angle": float(rng.choice([0.0, 25.0, -25.0])),
            "dark": bool(rng.random() < 0.3)})
    if kind == "blur":
        return Edit(kind, difficulty, source, {"radius": float(rng.uniform(0.004, 0.008) * longest)})
    if kind == "rotate":
        angle = float(rng.uniform(3, 7)) * (1 if rng.random() < 0.5 else -1)
        mode = "fill" if rng.random() < 0.5 else "crop"
        return Edit(kind, difficulty, source, {"angle": angle, "mode": mode,
                                               "fill": int(rng.choice([0, 128, 255]))})
    raise ValueError(f"unknown edit {kind!r}")


def draw_burst_variant(rng: np.random.Generator) -> Edit:
    """One shot of a burst: a slight reframing and exposure change, re-saved as JPEG."""
    return Edit("burst", "burst", Encoding("JPEG", int(rng.integers(82, 96))), {
        "box": _crop_box(rng, 0.01, 0.04), "factor": float(rng.uniform(0.94, 1.06))})


# ---- applying edits -------------------------------------------------------------------

def _crop(image: Image.Image, box: tuple[float, float, float, float]) -> Image.Image:
    w, h = image.size
    l, t, r, b = box
    return image.crop((round(l * w), round(t * h), round(r * w), round(b * h)))


def _fill(image: Image.Image, value: int) -> int | tuple[int, int, int]:
    return value if image.mode == "L" else (value, value, value)


def _rotate(image: Image.Image, angle: float, mode: str, fill: int) -> Image.Image:
    if mode == "fill":
        return image.rotate(angle, Image.Resampling.BICUBIC, expand=True, fillcolor=_fill(image, fill))
    # Largest centred box of the same aspect that holds no corner fill.
    w, h = image.size
    c, s = math.cos(math.radians(abs(angle))), math.sin(math.radians(abs(angle)))
    scale = min(w / (w * c + h * s), h / (w * s + h * c))
    cw, ch = math.floor(w * scale) - 1, math.floor(h * scale) - 1
    rotated = image.rotate(angle, Image.Resampling.BICUBIC, expand=False)
    left, top = (w - cw) // 2, (h - ch) // 2
    return rotated.crop((left, top, left + cw, top + ch))


def _caption_bar(image: Image.Image, p: dict[str, Any]) -> Image.Image:
    image = image.convert("RGB")
    w, h = image.size
    bar = int(p["height"] * h)
    top = h - bar if p["edge"] == "bottom" else 0
    draw = ImageDraw.Draw(image)
    back, ink = ((20, 20, 20), (245, 245, 245)) if p["dark"] else ((245, 245, 245), (20, 20, 20))
    draw.rectangle((0, top, w, top + bar), fill=back)
    f = fitted_font(p["words"], int(bar * 0.6), 0.92 * w)
    draw.text((w / 2, top + bar / 2), p["words"], font=f, fill=ink, anchor="mm")
    return image


def _watermark(image: Image.Image, p: dict[str, Any]) -> Image.Image:
    base = image.convert("RGBA")
    w, h = base.size
    layer = Image.new("RGBA", base.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    f = fitted_font(p["words"], int(p["size"] * min(w, h)), 0.85 * w)
    ink = 20 if p["dark"] else 245
    draw.text((w / 2, h / 2), p["words"], font=f, fill=(ink, ink, ink, int(255 * p["opacity"])),
              anchor="mm")
    if p["angle"]:
        layer = layer.rotate(p["angle"], Image.Resampling.BICUBIC)
    return Image.alpha_composite(base, layer).convert("RGB")


def apply_edit(image: Image.Image, edit: Edit) -> Image.Image:
    """The edited copy of ``image``; deterministic in the image and the edit's parameters."""
    p = edit.params
    name = edit.name
    if name == "downscale":
        return image.resize(tuple(p["size"]), Image.Resampling.LANCZOS)
    if name in ("jpeg_quality", "format_change"):
        return image
    if name in ("light_crop", "heavy_crop"):
        return _crop(image, p["box"])
    if name == "brightness":
        return ImageEnhance.Brightness(image).enhance(p["factor"])
    if name == "hflip":
        return ImageOps.mirror(image)
    if name == "greyscale":
        return image.convert("L")
    if name == "caption_bar":
        return _caption_bar(image, p)
    if name == "watermark":
        return _watermark(image, p)
    if name == "blur":
        return image.filter(ImageFilter.GaussianBlur(p["radius"]))
    if name == "rotate":
        return _rotate(image, p["angle"], p["mode"], p["fill"])
    if name == "burst":
        return ImageEnhance.Brightness(_crop(image, p["box"])).enhance(p["factor"])
    raise ValueError(f"unknown edit {name!r}")
