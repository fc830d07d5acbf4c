"""Words and fonts for text drawn into images (scene lettering, caption bars, watermarks)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import ImageFont

# Short sign-like words: text in pictures is usually a name, a place or a notice.
WORDS = (
    "OPEN", "SALE", "HARBOR", "SUMMER", "MARKET", "CAFE", "NORTH", "GARDEN", "RIVER",
    "STATION", "LIGHT", "HELLO", "WELCOME", "FRESH", "BAKERY", "CITY", "PARK", "MUSEUM",
    "LIBRARY", "EXIT", "HOTEL", "BOOKS", "MUSIC", "JAZZ", "NIGHT", "SUNDAY", "LOCAL",
    "FARM", "ISLAND", "BRIDGE", "TOWER", "COFFEE", "TEA", "DREAM", "WAVE", "STAR",
    "MOON", "FOREST", "VALLEY", "ROAD", "PIER", "PLAZA", "FESTIVAL", "GALLERY",
    "THEATRE", "ARCADE", "CORNER", "SQUARE", "WINTER", "GOLDEN", "BLUE", "OLD", "TOWN",
)


def draw_words(rng: np.random.Generator, low: int, high: int) -> str:
    """Between ``low`` and ``high`` distinct words, space-separated."""
    count = int(rng.integers(low, high + 1))
    picks = rng.choice(len(WORDS), size=count, replace=False)
    return " ".join(WORDS[int(i)] for i in picks)


@lru_cache(maxsize=128)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Pillow's bundled scalable font: identical glyphs on every machine with this Pillow."""
    return ImageFont.load_default(size=max(8, int(size)))


def fitted_font(text: str, size: int, max_width: float) -> ImageFont.FreeTypeFont:
    """The font at ``size``, shrunk until ``text`` is at most ``max_width`` pixels wide."""
    size = max(8, int(size))
    f = font(size)
    left, _, right, _ = f.getbbox(text)
    if right - left > max_width:
        size = max(8, int(size * max_width / (right - left)))
        f = font(size)
    return f
