"""Captions in GPIC's four styles, written from a scene spec or a photo's hand-made text.

tag = unordered comma-separated keywords, short = one sentence, medium = 2–3 sentences,
long = a 5–7 sentence paragraph (GPIC App. F). Captions of edited copies describe what the
copy shows: mirrored positions after a flip, greys after a greyscale conversion, and any
text overlaid on the picture.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sample_corpus.photos import PhotoCrop
from sample_corpus.scenes import Background, Lettering, Lines, Scene, Shape, greyscale, mirrored

CAPTION_TYPES = ("tag", "short", "medium", "long")
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
           "ten", "eleven", "twelve")


@dataclass(frozen=True)
class CaptionView:
    """What an edited copy changes about its original, as far as a caption can tell."""

    mirrored: bool = False
    greyscale: bool = False
    overlay: str | None = None        # "caption_bar" or "watermark"
    overlay_words: str = ""
    overlay_where: str = "bottom"     # edge of a caption bar


PLAIN = CaptionView()


def write_caption(subject: Scene | PhotoCrop, caption_type: str, rng: np.random.Generator,
                  view: CaptionView = PLAIN) -> str:
    """A caption of ``caption_type`` for ``subject`` as seen through ``view``."""
    if caption_type not in CAPTION_TYPES:
        raise ValueError(f"unknown caption type {caption_type!r}")
    extras = _view_sentences(view)
    if isinstance(subject, PhotoCrop):
        return _photo_caption(subject, caption_type, rng, view, extras)
    scene = mirrored(subject) if view.mirrored else subject
    scene = greyscale(scene) if view.greyscale else scene
    writer = {"tag": _scene_tags, "short": _scene_short, "medium": _scene_medium,
              "long": _scene_long}[caption_type]
    return writer(scene, rng, view, extras)


# ---- small phrase helpers ---------------------------------------------------------------

def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _cap(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


def _where(x: float, y: float) -> str:
    col = "left" if x < 0.36 else "right" if x > 0.64 else "centre"
    row = "top" if y < 0.36 else "bottom" if y > 0.64 else "middle"
    return {
        ("top", "left"): "in the upper left", ("top", "centre"): "near the top",
        ("top", "right"): "in the upper right", ("middle", "left"): "on the left",
        ("middle", "centre"): "in the centre", ("middle", "right"): "on the right",
        ("bottom", "left"): "in the lower left", ("bottom", "centre"): "near the bottom",
        ("bottom", "right"): "in the lower right",
    }[(row, col)]


def _size_word(size: float) -> str:
    return "small " if size < 0.1 else "large " if size > 0.2 else ""


@dataclass
class _Group:
    shapes: list[Shape]

    @property
    def count(self) -> int:
        return len(self.shapes)

    def phrase(self, definite: bool = False) -> str:
        s = self.shapes[0]
        outline = "outlined " if s.outline else ""
        if self.count == 1:
            body = f"{_size_word(s.size)}{outline}{s.colour.name} {s.kind}"
            return f"the {body}" if definite else _article(body)
        body = f"{NUMBERS[min(self.count, 12)]} {outline}{s.colour.name} {s.kind}s"
        return f"the {body}" if definite else body

    def placement(self) -> str:
        places = list(dict.fromkeys(_where(s.x, s.y) for s in self.shapes))
        return _join(places)


def _groups(scene: Scene) -> list[_Group]:
    groups: dict[tuple, _Group] = {}
    for s in scene.shapes:
        groups.setdefault((s.colour.name, s.kind, s.outline), _Group([])).shapes.append(s)
    return list(groups.values())


def _names_pair(bg: Background) -> tuple[str, str]:
    return bg.colours[0].name, bg.colours[1].name


def _stripe_orientation(angle: float) -> str:
    a = angle % 180
    return "vertical" if a < 25 or a > 155 else "horizontal" if 65 < a < 115 else "diagonal"


def _background_phrase(bg: Background) -> str:
    c1, c2 = _names_pair(bg)
    if bg.style == "solid":
        return f"a plain {c1} background"
    if bg.style == "gradient":
        return _article(f"{c1}-to-{c2} gradient") if c1 != c2 else f"a soft {c1} gradient"
    if bg.style == "radial":
        return _article(f"{c1} glow fading to {c2}") if c1 != c2 else f"a soft {c1} glow"
    pair = f"{c1} and {c2}" if c1 != c2 else f"two shades of {c1}"
    if bg.style == "stripes":
        return f"{_stripe_orientation(bg.angle)} {pair} stripes"
    return _article(f"{pair} checkerboard")


_DIRECTIONS = ("from left to right", "diagonally from the upper left to the lower right",
               "from top to bottom", "diagonally from the upper right to the lower left",
               "from right to left", "diagonally from the lower right to the upper left",
               "from bottom to top", "diagonally from the lower left to the upper right")


def _background_sentence(bg: Background) -> str:
    c1, c2 = _names_pair(bg)
    if bg.style == "solid":
        return f"The background is a flat, even {c1}."
    if bg.style == "gradient":
        direction = _DIRECTIONS[int(round((bg.angle % 360) / 45)) % 8]
        return f"The background shades from {c1} to {c2} {direction}."
    if bg.style == "radial":
        return (f"The background glows {c1} around a point {_where(*bg.centre)} "
                f"and fades to {c2} towards the edges.")
    width = "Narrow" if bg.period < 0.12 else "Broad"
    if bg.style == "stripes":
        return f"{width} {_stripe_orientation(bg.angle)} stripes of {c1} and {c2} fill the background."
    return f"The background is a checkerboard of {c1} and {c2} squares."


def _lines_phrase(lines: Lines) -> str:
    colour = lines.colour.name
    if lines.style == "zigzag":
        return (_article(f"{colour} zigzag line") if lines.count == 1
                else f"{NUMBERS[lines.count]} {colour} zigzag lines")
    if lines.style == "criss-crossing":
        return (_article(f"thin {colour} line") if lines.count == 1
                else f"{NUMBERS[lines.count]} thin {colour} criss-crossing lines")
    return (_article(f"thin {colour} {lines.style} line") if lines.count == 1
            else f"{NUMBERS[lines.count]} thin {colour} {lines.style} lines")


_TEXTURE_PHRASES = {"grain": "a fine grainy texture", "clouds": "soft, cloudy patches of light and shade",
                    "speckles": "tiny scattered speckles"}


def _words_phrase(text: Lettering) -> str:
    return f'the word "{text.words}"' if " " not in text.words else f'the words "{text.words}"'


def _view_sentences(view: CaptionView) -> list[str]:
    out = []
    if view.overlay == "caption_bar":
        out.append(f'A caption bar along the {view.overlay_where} reads "{view.overlay_words}".')
    elif view.overlay == "watermark":
        out.append(f'A faint watermark reading "{view.overlay_words}" is stamped across the picture.')
    if view.greyscale:
        out.append("The whole picture is in black and white.")
    return out


def _view_tags(view: CaptionView) -> list[str]:
    tags = []
    if view.overlay == "caption_bar":
        tags += ["caption", view.overlay_words.lower()]
    elif view.overlay == "watermark":
        tags += ["watermark", view.overlay_words.lower()]
    if view.greyscale:
        tags.append("black and white")
    return tags


def _shuffled(tags: list[str], rng: np.random.Generator) -> str:
    unique = list(dict.fromkeys(tags))
    order = rng.permutation(len(unique))
    return ", ".join(unique[int(i)] for i in order)


# ---- scenes ------------------------------------------------------------------------------

def _scene_tags(scene: Scene, rng: np.random.Generator, view: CaptionView, extras: list[str]) -> str:
    bg = scene.background
    c1, c2 = _names_pair(bg)
    tags = [{"solid": f"{c1} background", "gradient": f"{c1} and {c2} gradient",
             "radial": f"{c1} glow", "stripes": "stripes", "checker": "checkerboard"}[bg.style]]
    for g in _groups(scene):
        s = g.shapes[0]
        tags.append(f"{s.colour.name} {s.kind}{'s' if g.count > 1 else ''}")
    if scene.lines:
        tags.append("zigzag line" if scene.lines.style == "zigzag" else f"{scene.lines.style} lines")
    if scene.texture:
        tags.append({"grain": "grainy texture", "clouds": "cloudy texture", "speckles": "speckles"}[scene.texture])
    if scene.lettering:
        tags += ["text", scene.lettering.words.lower()]
    tags.append(["abstract", "geometric shapes", "graphic design"][int(rng.integers(3))])
    return _shuffled(tags + _view_tags(view), rng)


def _subject(scene: Scene) -> tuple[str, bool]:
    groups = _groups(scene)
    phrases = [g.phrase() for g in groups[:3]]
    if len(groups) > 3:
        phrases.append("a few more shapes")
    plural = len(scene.shapes) > 1
    return _join(phrases), plural


def _scene_short(scene: Scene, rng: np.random.Generator, view: CaptionView, extras: list[str]) -> str:
    subject, plural = _subject(scene)
    bg = _background_phrase(scene.background)
    if view.greyscale or rng.random() < 0.35:
        lead = "A black-and-white picture of" if view.greyscale else "A simple graphic of"
        sentence = f"{lead} {subject} on {bg}"
    else:
        verb = [("sits on", "sit on"), ("floats over", "float over"),
                ("stands out against", "stand out against")][int(rng.integers(3))][int(plural)]
        sentence = f"{_cap(subject)} {verb} {bg}"
    if view.overlay == "caption_bar":
        sentence += f', with a caption bar reading "{view.overlay_words}"'
    elif view.overlay == "watermark":
        sentence += f', under a faint "{view.overlay_words}" watermark'
    elif scene.lettering:
        sentence += f", with {_words_phrase(scene.lettering)}"
    elif scene.lines:
        sentence += f", crossed by {_lines_phrase(scene.lines)}"
    return sentence + "."


def _detail_sentences(scene: Scene) -> list[str]:
    out = []
    if scene.lines:
        many = scene.lines.count > 1
        out.append(f"{_cap(_lines_phrase(scene.lines))} {'run' if many else 'runs'} across the picture.")
    if scene.lettering:
        t = scene.lettering
        many = " " in t.words
        out.append(f"{_cap(_words_phrase(t))} {'appear' if many else 'appears'} in {t.colour.name} "
                   f"letters {_where(t.x, t.y)}.")
    if scene.texture:
        out.append(f"{_cap(_TEXTURE_PHRASES[scene.texture])} "
                   f"{'covers' if scene.texture == 'grain' else 'cover'} the whole picture.")
    return out


def _placement_sentence(group: _Group, definite: bool = False) -> str:
    verb = "sits" if group.count == 1 else "appear"
    return f"{_cap(group.phrase(definite))} {verb} {group.placement()}."


def _scene_medium(scene: Scene, rng: np.random.Generator, view: CaptionView, extras: list[str]) -> str:
    sentences = [_scene_short(scene, rng, CaptionView(greyscale=view.greyscale), [])]
    groups = _groups(scene)
    sentences.append(_placement_sentence(groups[0], definite=True))
    more = extras + _detail_sentences(scene) + [_background_sentence(scene.background)]
    if rng.random() < 0.6:
        sentences.append(more[0])
    elif extras:
        sentences[-1] = extras[0]
    return " ".join(sentences)


def _palette_sentence(scene: Scene) -> str:
    names = [scene.background.colours[0].name, scene.background.colours[1].name]
    names += [s.colour.name for s in scene.shapes]
    return f"The colours are mostly {_join(list(dict.fromkeys(names))[:4])}."


def _mood_sentence(scene: Scene) -> str:
    rgb = np.mean([c.rgb for c in scene.background.colours], axis=0)
    luma = float(rgb @ np.array([0.299, 0.587, 0.114]))
    spread = float(np.ptp(rgb))
    if luma < 80:
        return "The overall look is dark and moody."
    if spread < 40:
        return "The overall look is calm and muted."
    return "The overall look is bright and bold." if luma > 150 else "The overall look is rich and warm."


def _scene_long(scene: Scene, rng: np.random.Generator, view: CaptionView, extras: list[str]) -> str:
    count = len(scene.shapes)
    noun = "simple shape is" if count == 1 else "simple shapes are"
    # (priority, sentence): the seven most important survive, told in this order.
    ranked: list[tuple[int, str]] = [
        (0, f"{_cap(NUMBERS[count])} {noun} arranged on {_background_phrase(scene.background)}."),
        (1, _background_sentence(scene.background))]
    ranked += [(1, s) for s in extras]
    ranked += [(2 + i, _placement_sentence(g)) for i, g in enumerate(_groups(scene)[:3])]
    ranked += [(3, s) for s in _detail_sentences(scene)]
    ranked += [(5, _palette_sentence(scene)), (6, _mood_sentence(scene))]
    keep = sorted(range(len(ranked)), key=lambda i: (ranked[i][0], i))[:7]
    return " ".join(ranked[i][1] for i in sorted(keep))


# ---- photos ------------------------------------------------------------------------------

def _photo_caption(crop: PhotoCrop, caption_type: str, rng: np.random.Generator,
                   view: CaptionView, extras: list[str]) -> str:
    photo = crop.photo
    if caption_type == "tag":
        return _shuffled(list(photo.tags) + _view_tags(view), rng)
    if caption_type == "short":
        sentence = photo.sentences[0][:-1]
        if view.overlay == "caption_bar":
            sentence += f', with a caption bar reading "{view.overlay_words}"'
        elif view.overlay == "watermark":
            sentence += f', under a faint "{view.overlay_words}" watermark'
        return sentence + "."
    if caption_type == "medium":
        body = list(photo.sentences[: int(rng.integers(2, 4))])
        if extras:
            body[-1] = extras[0]
        return " ".join(body)
    return " ".join(list(photo.sentences) + extras)
