"""Procedural scenes: a small spec drawn from a random stream, rendered to pixels on demand.

The spec is what captions describe and what the design stores. Pixels are made only when a
file is written, so a whole corpus can be designed (and its metadata checked) without
encoding a single image. Every scene draws its own palette, background, shapes, lines,
texture and lettering, which keeps unrelated images visually distinct.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from sample_corpus.lettering import draw_words, fitted_font

NAMED_COLOURS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("red", (210, 40, 40)), ("crimson", (165, 20, 50)), ("orange", (240, 140, 30)),
    ("yellow", (240, 210, 40)), ("gold", (212, 175, 55)), ("lime green", (150, 210, 60)),
    ("green", (40, 150, 60)), ("dark green", (20, 90, 40)), ("teal", (20, 140, 140)),
    ("turquoise", (60, 200, 190)), ("sky blue", (110, 180, 235)), ("blue", (40, 80, 200)),
    ("navy", (20, 30, 100)), ("purple", (120, 50, 160)), ("violet", (170, 110, 220)),
    ("magenta", (210, 40, 160)), ("pink", (240, 150, 180)), ("brown", (120, 75, 40)),
    ("beige", (225, 205, 165)), ("cream", (250, 240, 210)), ("white", (245, 245, 245)),
    ("light grey", (190, 190, 190)), ("grey", (128, 128, 128)), ("charcoal", (60, 60, 65)),
    ("black", (15, 15, 15)),
)
SHAPE_KINDS = ("circle", "square", "triangle", "pentagon", "hexagon", "star", "ring",
               "diamond", "rectangle", "oval")
BACKGROUND_STYLES = ("gradient", "radial", "solid", "stripes", "checker")
LINE_STYLES = ("diagonal", "horizontal", "vertical", "criss-crossing", "zigzag")
TEXTURES = ("grain", "clouds", "speckles")


@dataclass(frozen=True)
class Colour:
    name: str
    rgb: tuple[int, int, int]


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: Colour
    x: float          # centre, as a fraction of the width
    y: float          # centre, as a fraction of the height
    size: float       # radius, as a fraction of the shorter side
    angle: float      # degrees
    outline: bool     # drawn as an outline instead of filled


@dataclass(frozen=True)
class Background:
    style: str
    colours: tuple[Colour, Colour]
    angle: float      # direction of a gradient / normal of stripes, degrees (0 = to the right)
    period: float     # stripe or checker period, fraction of the shorter side
    centre: tuple[float, float]  # centre of a radial glow


@dataclass(frozen=True)
class Lines:
    count: int
    colour: Colour
    style: str
    width: float      # fraction of the shorter side


@dataclass(frozen=True)
class Lettering:
    words: str
    colour: Colour
    x: float
    y: float
    size: float       # letter height, fraction of the shorter side


@dataclass(frozen=True)
class Scene:
    width: int
    height: int
    background: Background
    shapes: tuple[Shape, ...]
    lines: Lines | None
    lettering: Lettering | None
    texture: str | None
    texture_strength: float
    pixel_seed: int   # drives pixel-level randomness: noise, line placement


def _jittered(rng: np.random.Generator, index: int) -> Colour:
    name, rgb = NAMED_COLOURS[index]
    jitter = rng.integers(-14, 15, size=3)
    return Colour(name, tuple(int(v) for v in np.clip(np.array(rgb) + jitter, 0, 255)))


def draw_scene(rng: np.random.Generator, width: int, height: int) -> Scene:
    """Draw a random scene spec of the given pixel size."""
    picks = rng.choice(len(NAMED_COLOURS), size=6, replace=False)
    palette = [_jittered(rng, int(i)) for i in picks]
    style = BACKGROUND_STYLES[int(rng.choice(len(BACKGROUND_STYLES), p=[.35, .15, .2, .15, .15]))]
    background = Background(
        style=style, colours=(palette[0], palette[1]), angle=float(rng.uniform(0, 360)),
        period=float(rng.uniform(0.06, 0.25)),
        centre=(float(rng.uniform(0.2, 0.8)), float(rng.uniform(0.2, 0.8))))
    shapes = tuple(
        Shape(kind=SHAPE_KINDS[int(rng.integers(len(SHAPE_KINDS)))],
              colour=palette[int(rng.integers(2, 6))],
              x=float(rng.uniform(0.12, 0.88)), y=float(rng.uniform(0.12, 0.88)),
              size=float(rng.uniform(0.05, 0.3)), angle=float(rng.uniform(0, 360)),
              outline=bool(rng.random() < 0.2))
        for _ in range(int(rng.integers(1, 7))))
    lines = None
    if rng.random() < 0.4:
        lines = Lines(count=int(rng.integers(1, 9)), colour=palette[int(rng.integers(2, 6))],
                      style=LINE_STYLES[int(rng.integers(len(LINE_STYLES)))],
                      width=float(rng.uniform(0.004, 0.02)))
    lettering = None
    if rng.random() < 0.35:
        lettering = Lettering(words=draw_words(rng, 1, 3), colour=palette[int(rng.integers(2, 6))],
                              x=float(rng.uniform(0.25, 0.75)), y=float(rng.uniform(0.15, 0.85)),
                              size=float(rng.uniform(0.06, 0.14)))
    texture = None
    if rng.random() < 0.6:
        texture = TEXTURES[int(rng.integers(len(TEXTURES)))]
    return Scene(width=width, height=height, background=background, shapes=shapes, lines=lines,
                 lettering=lettering, texture=texture,
                 texture_strength=float(rng.uniform(0.3, 1.0)),
                 pixel_seed=int(rng.integers(2**63)))


# ---- views used by captions of edited copies ------------------------------------------

def mirrored(scene: Scene) -> Scene:
    """The scene as it looks after a horizontal flip (for describing a flipped copy)."""
    bg = scene.background
    return replace(
        scene,
        background=replace(bg, angle=(180.0 - bg.angle) % 360.0, centre=(1 - bg.centre[0], bg.centre[1])),
        shapes=tuple(replace(s, x=1 - s.x) for s in scene.shapes),
        lettering=replace(scene.lettering, x=1 - scene.lettering.x) if scene.lettering else None)


GREY_NAMES = ((40, "black"), (90, "charcoal"), (150, "grey"), (215, "light grey"), (256, "white"))


def grey_colour(colour: Colour) -> Colour:
    """The grey a colour becomes under Pillow's ``convert("L")`` (ITU-R 601-2 luma)."""
    r, g, b = colour.rgb
    luma = int(round(r * 0.299 + g * 0.587 + b * 0.114))
    name = next(n for limit, n in GREY_NAMES if luma < limit)
    return Colour(name, (luma, luma, luma))


def greyscale(scene: Scene) -> Scene:
    """The scene as it looks in greyscale (for describing a greyscale copy)."""
    bg = scene.background
    return replace(
        scene,
        background=replace(bg, colours=(grey_colour(bg.colours[0]), grey_colour(bg.colours[1]))),
        shapes=tuple(replace(s, colour=grey_colour(s.colour)) for s in scene.shapes),
        lines=replace(scene.lines, colour=grey_colour(scene.lines.colour)) if scene.lines else None,
        lettering=(replace(scene.lettering, colour=grey_colour(scene.lettering.colour))
                   if scene.lettering else None))


# ---- rendering ------------------------------------------------------------------------

def _mix(c1: Colour, c2: Colour, t: np.ndarray) -> np.ndarray:
    a = np.asarray(c1.rgb, np.float32)
    b = np.asarray(c2.rgb, np.float32)
    return np.clip(a + (b - a) * t[..., None], 0, 255).astype(np.uint8)


def _smooth_background(scene: Scene) -> Image.Image:
    """Gradients and glows vary slowly: compute them on a coarse grid and upsample."""
    w, h = scene.width, scene.height
    bg = scene.background
    step = 8
    ws, hs = w // step + 2, h // step + 2
    xs = ((np.arange(ws, dtype=np.float32) + 0.5) * (w / ws))[None, :]
    ys = ((np.arange(hs, dtype=np.float32) + 0.5) * (h / hs))[:, None]
    if bg.style == "gradient":
        a = math.radians(bg.angle)
        proj = xs * math.cos(a) + ys * math.sin(a)
        t = (proj - proj.min()) / max(float(proj.max() - proj.min()), 1.0)
    else:  # radial
        d = np.hypot(xs - bg.centre[0] * w, ys - bg.centre[1] * h)
        t = np.clip(d / (0.75 * max(w, h)), 0, 1)
    coarse = Image.fromarray(_mix(*bg.colours, t), mode="RGB")
    return coarse.resize((w, h), Image.Resampling.BILINEAR)


def _background(scene: Scene) -> Image.Image:
    w, h = scene.width, scene.height
    bg = scene.background
    c1, c2 = bg.colours
    if bg.style == "solid":
        return Image.new("RGB", (w, h), c1.rgb)
    if bg.style in ("gradient", "radial"):
        return _smooth_background(scene)
    period = max(4.0, bg.period * min(w, h))
    ys = np.arange(h, dtype=np.float32)[:, None] / period
    xs = np.arange(w, dtype=np.float32)[None, :] / period
    if bg.style == "stripes":
        a = math.radians(bg.angle)
        # Shift by an even number of periods so truncation acts as floor and parity is kept.
        shift = 2 * math.ceil((w + h) / period)
        band = ((xs * math.cos(a) + (ys * math.sin(a) + shift)).astype(np.int32) & 1).astype(bool)
    else:  # checker
        band = (xs.astype(np.int32) & 1).astype(bool) ^ (ys.astype(np.int32) & 1).astype(bool)
    pixels = np.where(band[..., None], np.array(c2.rgb, np.uint8), np.array(c1.rgb, np.uint8))
    return Image.fromarray(pixels, mode="RGB")


def _add_signed(image: Image.Image, layer: np.ndarray) -> Image.Image:
    """``image + layer - 128`` per pixel, clipped; ``layer`` is a uint8 map centred on 128."""
    grey = Image.fromarray(layer, mode="L")
    return ImageChops.add(image, Image.merge("RGB", (grey, grey, grey)), scale=1.0, offset=-128)


def _clouds(rng: np.random.Generator, w: int, h: int, strength: float) -> np.ndarray:
    cell = int(rng.integers(24, 72))
    coarse = rng.normal(size=(h // cell + 2, w // cell + 2)).astype(np.float32)
    coarse = np.clip(128 + coarse * (28.0 * strength), 0, 255).astype(np.uint8)
    smooth = Image.fromarray(coarse, mode="L").resize((w, h), Image.Resampling.BICUBIC)
    return np.asarray(smooth)


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if kind == "star":
        radii = [r if i % 2 == 0 else 0.45 * r for i in range(10)]
        corners = [(radii[i], 2 * math.pi * i / 10) for i in range(10)]
    elif kind in ("rectangle", "oval", "diamond"):
        if kind == "oval":
            corners = [(1.0, 2 * math.pi * i / 48) for i in range(48)]
        else:
            corners = [(1.0, t) for t in ((0.5, math.pi - 0.5, math.pi + 0.5, -0.5) if kind == "rectangle"
                                          else (0, math.pi / 2, math.pi, 3 * math.pi / 2))]
        stretch = 0.55 if kind != "diamond" else 0.65
        pts = [(r * m * math.cos(t), r * m * stretch * math.sin(t)) for m, t in corners]
        a = math.radians(angle)
        return [(cx + x * math.cos(a) - y * math.sin(a), cy + x * math.sin(a) + y * math.cos(a))
                for x, y in pts]
    else:
        sides = {"triangle": 3, "square": 4, "pentagon": 5, "hexagon": 6}[kind]
        corners = [(r, 2 * math.pi * i / sides) for i in range(sides)]
    a = math.radians(angle)
    return [(cx + m * math.cos(t + a), cy + m * math.sin(t + a)) for m, t in corners]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: Shape, w: int, h: int) -> None:
    r = shape.size * min(w, h)
    cx, cy = shape.x * w, shape.y * h
    stroke = max(2, int(r * 0.12))
    fill = None if shape.outline else shape.colour.rgb
    outline = shape.colour.rgb if shape.outline else None
    if shape.kind == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=outline, width=stroke)
    elif shape.kind == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=shape.colour.rgb,
                     width=max(3, int(r * 0.25)))
    else:
        draw.polygon(_polygon(shape.kind, cx, cy, r, shape.angle), fill=fill, outline=outline,
                     width=stroke if shape.outline else 1)


def _draw_lines(draw: ImageDraw.ImageDraw, lines: Lines, rng: np.random.Generator, w: int, h: int) -> None:
    width = max(1, int(lines.width * min(w, h)))
    colour = lines.colour.rgb
    for i in range(lines.count):
        f = (i + float(rng.uniform(0.2, 0.8))) / lines.count
        if lines.style == "horizontal":
            draw.line((0, f * h, w, f * h), fill=colour, width=width)
        elif lines.style == "vertical":
            draw.line((f * w, 0, f * w, h), fill=colour, width=width)
        elif lines.style == "diagonal":
            x0 = (2 * f - 1) * w
            draw.line((x0, 0, x0 + w, h), fill=colour, width=width)
        elif lines.style == "criss-crossing":
            p = rng.uniform(0, 1, size=4)
            draw.line((p[0] * w, 0, p[1] * w, h) if i % 2 else (0, p[2] * h, w, p[3] * h),
                      fill=colour, width=width)
        else:  # zigzag
            teeth = int(rng.integers(4, 10))
            amp = float(rng.uniform(0.03, 0.08)) * h
            pts = [(w * k / teeth, f * h + (amp if k % 2 else -amp)) for k in range(teeth + 1)]
            draw.line(pts, fill=colour, width=width, joint="curve")


def _draw_lettering(draw: ImageDraw.ImageDraw, text: Lettering, w: int, h: int) -> None:
    f = fitted_font(text.words, int(text.size * min(w, h)), 0.9 * w)
    left, top, right, bottom = draw.textbbox((0, 0), text.words, font=f, anchor="mm")
    x = min(max(text.x * w, -left), w - right)
    y = min(max(text.y * h, -top), h - bottom)
    draw.text((x, y), text.words, font=f, fill=text.colour.rgb, anchor="mm")


def render_scene(scene: Scene) -> Image.Image:
    """Render the scene to an RGB image; the same spec always gives the same pixels."""
    rng = np.random.default_rng(scene.pixel_seed)
    w, h = scene.width, scene.height
    image = _background(scene)
    if scene.texture == "clouds":
        image = _add_signed(image, _clouds(rng, w, h, scene.texture_strength))
    draw = ImageDraw.Draw(image)
    for shape in scene.shapes:
        _draw_shape(draw, shape, w, h)
    if scene.lines is not None:
        _draw_lines(draw, scene.lines, rng, w, h)
    if scene.lettering is not None:
        _draw_lettering(draw, scene.lettering, w, h)
    if scene.texture == "grain":
        amp = int(4 + 10 * scene.texture_strength)
        image = _add_signed(image, rng.integers(128 - amp, 129 + amp, size=(h, w), dtype=np.uint8))
    elif scene.texture == "speckles":
        arr = np.array(image)
        mask = rng.random((h, w), dtype=np.float32) < 0.004 * scene.texture_strength
        arr[mask] = rng.integers(0, 256, size=(int(mask.sum()), 1), dtype=np.uint8)
        image = Image.fromarray(arr)
    return image
