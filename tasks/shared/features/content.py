"""The picture inside its frame: uniform borders, letterboxes, padding and rotation corners cut off.

Every copy detector describes the whole frame it is given, so a frame that is not the
picture dominates: a copy with a 10 % black border, a letterboxed frame, a screenshot's
padding or the filled corners of a rotated copy scores far below its original, and two
*different* pictures that share a black border or white rotation corners score close to
each other (on real photographs the closest unrelated pairs of every tool were such pairs).
:func:`content_box` finds the picture's own box and :func:`picture_content` crops to it;
the extraction stage applies it to every decoded image before any model's ``preprocess``
(one function, so every copy-detection model sees the same picture), except for the
evaluation protocol's preprocessings, whose input is fixed by their reference
(``STATISTICS_PREPROCESSING``). The feature fingerprint names :data:`CONTENT_RULE`.

Two steps on a small analysis thumbnail (longer side ``ANALYSIS_SIDE``): uniform bands are
peeled off each side (:func:`_peel`, :func:`_border_run`), then the corner triangles of a copy
turned in its frame are cut to the largest box clear of them (:func:`_inscribed`); the thresholds
and what each one spares are in docs/features.md.

A picture with no such frame is returned unchanged (the same object), so features of
ordinary photographs do not change. Deterministic: integer pixel arithmetic on a Pillow
thumbnail (``Image.reduce``), then a crop of the full image at the box scaled back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from tasks.shared.features.config import STATISTICS_PREPROCESSING

if TYPE_CHECKING:  # torch comes with the model, not with this module's callers
    from tasks.shared.features.base import FeatureModel

CONTENT_RULE = "trim_uniform_border_and_rotation_corners_v2"
ANALYSIS_SIDE = 256  # px: the thumbnail the frame is measured on
LINE_TOLERANCE = 10  # grey levels: a uniform line's pixels lie within this of its colour ...
LINE_OUTLIERS = 0.2  # ... all but this share of them (a title bar's text: up to 15 %)
NOISE_LEVELS = 24  # grey levels: JPEG ringing in a border beside the picture stays within this of its colour
JPEG_BLOCK = 8  # px of the full image: how far that ringing reaches
PEEL_ROUNDS = 3  # a frame of up to three bands on one side (title bar, margin, ...)
MAX_SIDE_TRIM = 0.4  # at most this share of the frame is cut from one side
MIN_KEPT = 0.2  # nothing is trimmed when less than this share of a side would remain
STEP_DEPTH = 0.05  # a border is followed by this share of lines of the picture ...
STEP_LEVELS = 16  # ... in which at least STEP_SHARE of the pixels are further than this from its colour
STEP_SHARE = 0.5
MAX_CORNER_FILL = 0.25  # corner fill reachable from the corners: at most this share of the area
MIN_CORNER_FILL = 0.002  # below this share the corners are the picture's own pixels
MAX_FILL_COLOURED_INSIDE = 0.5  # corners of the picture's own colour (a flat backdrop) are no fill
MIN_TRIANGLE_FILL = 0.9  # a fill covers its triangles (but for the blurred hypotenuse); a picture's corners do not


def content_rule(model: FeatureModel) -> str | None:
    """:data:`CONTENT_RULE` when ``model`` describes the picture without its frame, None for
    the evaluation protocol's preprocessings (their input is fixed by their reference)."""
    return None if model.preprocessing in STATISTICS_PREPROCESSING else CONTENT_RULE


def model_input(model: FeatureModel, image: Image.Image, content: Image.Image | None = None) -> np.ndarray:
    """What ``model`` embeds for a decoded ``image``: its ``preprocess`` of the picture
    without its frame (``content``, when the caller already cut it), or of the whole frame
    for the protocol's preprocessings. Every path that embeds for copy detection calls this."""
    if content_rule(model) is None:
        return np.asarray(model.preprocess(image), dtype=np.float32)
    return np.asarray(model.preprocess(picture_content(image) if content is None else content), dtype=np.float32)


def content_box(image: Image.Image) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the picture inside ``image``'s frame, in its pixels."""
    width, height = image.size
    small = image if image.mode == "RGB" else image.convert("RGB")
    factor = -(-max(width, height) // ANALYSIS_SIDE)  # ceil: box-averaged by an integer factor
    if factor > 1:
        small = small.reduce(factor)
    rgb = np.asarray(small, dtype=np.int16)
    h, w = rgb.shape[:2]
    top, bottom, left, right = _peel(rgb, -(-JPEG_BLOCK // factor))
    if (bottom - top) < MIN_KEPT * h or (right - left) < MIN_KEPT * w:
        top, bottom, left, right = 0, h, 0, w
    inner = _inscribed(rgb[top:bottom, left:right])
    if inner is not None:
        l2, t2, r2, b2 = inner
        left, top, right, bottom = left + l2, top + t2, left + r2, top + b2
    if (left, top, right, bottom) == (0, 0, w, h):
        return 0, 0, width, height
    sx, sy = width / w, height / h
    # rounded inwards: no pixel of the frame is kept
    return (min(width - 1, int(np.ceil(left * sx))), min(height - 1, int(np.ceil(top * sy))),
            max(1, int(np.floor(right * sx))), max(1, int(np.floor(bottom * sy))))


def picture_content(image: Image.Image) -> Image.Image:
    """``image`` cropped to :func:`content_box` (the same object when there is no frame)."""
    box = content_box(image)
    return image if box == (0, 0, *image.size) else image.crop(box)


def _peel(rgb: np.ndarray, ringing: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of what is left after peeling uniform bands, rows then
    columns, in up to ``PEEL_ROUNDS`` rounds; each side loses at most ``MAX_SIDE_TRIM`` in all."""
    h, w = rgb.shape[:2]
    top, bottom, left, right = 0, h, 0, w
    for _ in range(PEEL_ROUNDS):
        before = (top, bottom, left, right)
        rows = rgb[top:bottom, left:right]
        cut_top = _border_run(rows, int(MAX_SIDE_TRIM * h) - top, ringing)
        cut_bottom = _border_run(rows[::-1], int(MAX_SIDE_TRIM * h) - (h - bottom), ringing)
        top, bottom = top + cut_top, max(top + cut_top, bottom - cut_bottom)
        cols = rgb[top:bottom, left:right].transpose(1, 0, 2)
        cut_left = _border_run(cols, int(MAX_SIDE_TRIM * w) - left, ringing)
        cut_right = _border_run(cols[::-1], int(MAX_SIDE_TRIM * w) - (w - right), ringing)
        left, right = left + cut_left, max(left + cut_left, right - cut_right)
        if (top, bottom, left, right) == before or bottom - top < 2 or right - left < 2:
            break
    return top, bottom, left, right


def _border_run(lines: np.ndarray, limit: int, ringing: int) -> int:
    """How many of the first ``limit`` lines are a border: uniform in the colour of the first
    one (all but ``LINE_OUTLIERS`` of the pixels) up to a last line with no outlier at all (a
    title bar's text lies inside its bar; the first rows of a picture turned in its frame,
    mostly corner fill, never end on such a line), then up to ``ringing`` lines within
    ``NOISE_LEVELS`` of the colour (a JPEG block's ringing beside the picture's edge; a
    gradient of the picture's own goes no further than that), and followed by a picture that is not (at
    least ``STEP_SHARE`` of the pixels of the next ``STEP_DEPTH`` of the lines further than
    ``STEP_LEVELS`` from that colour: another colour or texture). Without that step the flat
    band is the picture's own (a dark, noisy sky) and is kept, so copies whose noise differs
    are never cut differently."""
    if limit <= 0 or not len(lines):
        return 0
    colour = np.median(lines[0], axis=0)
    if np.mean(np.abs(lines[0] - colour).max(axis=1) > LINE_TOLERANCE) > LINE_OUTLIERS:
        return 0  # most pictures: their first line is no band's
    deviation = np.abs(lines[:limit] - colour).max(axis=2)  # [lines, pixels]
    off = np.mean(deviation > LINE_TOLERANCE, axis=1)
    band = int(np.argmax(off > LINE_OUTLIERS)) if (off > LINE_OUTLIERS).any() else len(off)
    clean = np.flatnonzero(off[:band] == 0)
    count = int(clean[-1]) + 1 if len(clean) else 0  # one past the band's last line with no outlier at all
    noisy = deviation[count:count + ringing].max(axis=1) > NOISE_LEVELS if count else np.ones(0, bool)
    count += int(np.argmax(noisy)) if noisy.any() else len(noisy)  # JPEG ringing beside the picture's edge
    depth = max(2, int(STEP_DEPTH * len(lines)))
    inside = lines[count:count + depth].reshape(-1, lines.shape[-1])
    if count == 0 or not len(inside) or np.mean(np.abs(inside - colour).max(axis=1) > STEP_LEVELS) < STEP_SHARE:
        return 0
    return count


def _inscribed(rgb: np.ndarray) -> tuple[int, int, int, int] | None:
    """The largest axis-aligned box clear of four corner triangles of fill, or None when the
    corners hold none. Each triangle is measured by its legs, the runs of fill colour along
    the frame's edges from that corner: a picture turned in its frame touches every edge at
    one point, and the runs along the edges cannot leak into the picture's own dark or light
    areas as a flood fill would."""
    h, w = rgb.shape[:2]
    if h < 8 or w < 8:
        return None
    corners = rgb[[0, 0, -1, -1], [0, -1, 0, -1]]
    colour = np.median(corners, axis=0)
    if np.abs(corners - colour).max() > LINE_TOLERANCE:
        return None
    close = np.abs(rgb - colour).max(axis=2) <= LINE_TOLERANCE

    def run(line: np.ndarray) -> int:
        return int(np.argmin(line)) if not line.all() else len(line)

    # legs (along x, along y) of the triangles at top-left, top-right, bottom-left, bottom-right
    legs = [(run(close[0]), run(close[:, 0])), (run(close[0, ::-1]), run(close[:, -1])),
            (run(close[-1]), run(close[::-1, 0])), (run(close[-1, ::-1]), run(close[::-1, -1]))]
    if any(a < 2 or b < 2 or a >= w or b >= h for a, b in legs):
        return None
    share = sum(a * b / 2 for a, b in legs) / (h * w)
    if not MIN_CORNER_FILL <= share <= MAX_CORNER_FILL:
        return None
    y = np.arange(h) + 0.5
    (tla, tlb), (tra, trb), (bla, blb), (bra, brb) = legs
    left_edge = np.ceil(np.maximum(tla * (1 - y / tlb), bla * (1 - (h - y) / blb))).clip(min=0)
    right_edge = w - np.ceil(np.maximum(tra * (1 - y / trb), bra * (1 - (h - y) / brb))).clip(min=0)
    left_edge, right_edge = left_edge.astype(np.int64), right_edge.astype(np.int64)
    x = np.arange(w)[None, :] + 0.5
    triangles = (x < left_edge[:, None]) | (x >= right_edge[:, None])
    if close[triangles].mean() < MIN_TRIANGLE_FILL:  # dark or light corners of the picture's own
        return None
    best, box = 0, None
    for y0 in range(h):
        lo = np.maximum.accumulate(left_edge[y0:])
        hi = np.minimum.accumulate(right_edge[y0:])
        area = (hi - lo).clip(min=0) * np.arange(1, h - y0 + 1)
        k = int(np.argmax(area))
        if area[k] > best:
            best, box = int(area[k]), (int(lo[k]), y0, int(hi[k]), y0 + k + 1)
    if box is None or best < MIN_KEPT * h * w:
        return None
    l0, t0, r0, b0 = box
    # the fill is not the picture's own colour: most of what is kept is another colour
    return box if close[t0:b0, l0:r0].mean() <= MAX_FILL_COLOURED_INSIDE else None
