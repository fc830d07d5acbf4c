"""The sample corpus design: every row, file, edit and caption, decided before any pixel exists.

Designing is cheap (random draws and string formatting), so the metadata table and the
ground truth of a corpus of any size can be produced and checked without encoding
images; rendering then follows the design group by group. Each decision draws from its own
named random stream (``stream(seed, ...)``), so changing one part of the generator does
not reshuffle everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from corpusforge.hashing import stable_int
from sample_corpus.bad_records import (
    BAD_KINDS, BOMB_SIZES, EXIF_ROTATED_STORED, SPECIAL_KINDS, UNSAFE_PATHS, extreme_aspect_size,
    small_size)
from sample_corpus.captions import PLAIN, write_caption
from sample_corpus.edits import (
    EASY_EDITS, HARD_EDITS, MIN_SOURCE_SIDE, Edit, draw_burst_variant, draw_edit)
from sample_corpus.encoding import Encoding
from sample_corpus.metadata import (
    METADATA_COLUMNS, METADATA_SCHEMA, RecordMetadata, crawl_start, draw_metadata)
from sample_corpus.photos import PHOTOS, PhotoCrop, draw_photo_crop
from sample_corpus.scenes import Scene, draw_scene

FORMAT_MIX = {"JPEG": 0.8, "PNG": 0.1, "WEBP": 0.1}
ASPECTS = ((1.0, 0.15), (4 / 3, 0.35), (3 / 2, 0.3), (16 / 9, 0.15), (2.0, 0.05))
LARGE_SHARE = 0.015          # originals with a longer side of 1600–2500 px
ROWS_PER_PHOTO = 10          # at most one scikit-image photo per this many rows
ROWS_PER_BURST = 500
EXACT_SHARE = 0.02
NEAR_SHARE = 0.08
ROWS_PER_FOLDER = 1000

Content = Scene | PhotoCrop


def stream(seed: int, *parts: Any) -> np.random.Generator:
    """An independent random stream for one named decision of the corpus ``seed``."""
    return np.random.default_rng(stable_int(seed, "/".join(map(str, parts)), 2**63))


@dataclass(frozen=True)
class Member:
    """One row of a group and how its file is made.

    ``make`` is one of: encode, copy (byte copy of the group's first file), edit, truncate,
    empty, random, bomb, cmyk, exif, none (no file is written).
    """

    role: str
    make: str
    ext: str
    encoding: Encoding | None = None
    edit: Edit | None = None
    param: tuple = ()
    path: str | None = None      # a fixed path instead of images/<folder>/<key>.<ext>


@dataclass(frozen=True)
class Group:
    """An original and the rows derived from it, rendered together from one set of pixels."""

    gid: int
    content: Content
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Row:
    key: str
    path: str
    gid: int
    member: int
    caption: str
    meta: RecordMetadata


@dataclass(frozen=True)
class SampleDesign:
    n: int
    seed: int
    groups: tuple[Group, ...]
    rows: tuple[Row, ...]        # in table order

    def member(self, row: Row) -> Member:
        return self.groups[row.gid].members[row.member]

    def metadata_table(self) -> pa.Table:
        """The metadata table, one row per record, in table order."""
        columns: dict[str, list[str]] = {name: [] for name in METADATA_COLUMNS}
        for row in self.rows:
            values = {"key": row.key, "path": row.path, "caption": row.caption,
                      **{f: getattr(row.meta, f) for f in ("caption_type", "source", "license",
                                                           "license_url", "attribution",
                                                           "retrieved_at")}}
            for name in METADATA_COLUMNS:
                columns[name].append(values[name])
        return pa.table(columns, schema=METADATA_SCHEMA)

    def ground_truth(self) -> dict[str, list[dict[str, Any]]]:
        """What a correct pipeline must find, keyed by record key (lists sorted by key)."""
        keys = {(r.gid, r.member): r.key for r in self.rows}
        truth: dict[str, list[dict[str, Any]]] = {
            "exact_duplicates": [], "near_duplicates": [], "clusters": [], "bad_records": [],
            "valid_special": []}
        for g in self.groups:
            first = keys[(g.gid, 0)]
            for i, m in enumerate(g.members):
                key = keys[(g.gid, i)]
                if m.role == "exact_duplicate":
                    truth["exact_duplicates"].append({"key": key, "copy_of": first})
                elif m.role == "near_duplicate":
                    truth["near_duplicates"].append({"key": key, "copy_of": first, "edit": m.edit.name,
                                                     "difficulty": m.edit.difficulty})
                elif m.role in BAD_KINDS:
                    status, reason = BAD_KINDS[m.role]
                    truth["bad_records"].append({"key": key, "kind": m.role, "expected_status": status,
                                                 "expected_reason": reason})
                elif m.role in SPECIAL_KINDS:
                    width, height = (g.content.width, g.content.height)
                    truth["valid_special"].append({"key": key, "kind": m.role, "expected_width": width,
                                                   "expected_height": height,
                                                   "expected_format": SPECIAL_KINDS[m.role]})
            if g.members[0].role == "burst_original":
                truth["clusters"].append({"keys": [keys[(g.gid, i)] for i in range(len(g.members))],
                                          "edit": "burst"})
        for name, items in truth.items():
            items.sort(key=lambda item: item["keys"][0] if name == "clusters" else item["key"])
        return truth

    def summary(self) -> dict[str, int]:
        """Counts per kind of row."""
        roles = [self.member(r).role for r in self.rows]
        near = [self.member(r).edit.difficulty for r in self.rows
                if self.member(r).role == "near_duplicate"]
        return {
            "rows": len(self.rows),
            "originals": roles.count("original"),
            "photos": sum(isinstance(g.content, PhotoCrop) for g in self.groups),
            "exact_duplicates": roles.count("exact_duplicate"),
            "near_duplicates_easy": near.count("easy"),
            "near_duplicates_hard": near.count("hard"),
            "burst_clusters": roles.count("burst_original"),
            "burst_variants": roles.count("burst_variant"),
            "bad_records": sum(role in BAD_KINDS for role in roles),
            "valid_special": sum(role in SPECIAL_KINDS for role in roles),
            "files": sum(self.member(r).make != "none" for r in self.rows),
        }


# ---- drawing contents ---------------------------------------------------------------

def _pick(rng: np.random.Generator, mix: dict[str, float]) -> str:
    names = list(mix)
    return names[int(rng.choice(len(names), p=list(mix.values())))]


def draw_size(rng: np.random.Generator) -> tuple[int, int]:
    """Width and height of an original: mostly 300–900 px sides, a few large ones."""
    aspect = ASPECTS[int(rng.choice(len(ASPECTS), p=[p for _, p in ASPECTS]))][0]
    if rng.random() < LARGE_SHARE:
        longest = int(rng.integers(1600, 2501))
        shortest = round(longest / aspect)
    else:
        longest = int(rng.integers(400, 901))
        shortest = max(300, round(longest / aspect))
        longest = max(longest, round(shortest * aspect))
    return (longest, shortest) if rng.random() < 0.7 else (shortest, longest)


def _encoding(rng: np.random.Generator, formats: dict[str, float] = FORMAT_MIX) -> Encoding:
    return Encoding(_pick(rng, formats), int(rng.integers(80, 96)))


def _scene_original(rng: np.random.Generator, min_side: int = 0) -> tuple[Scene, Encoding]:
    size = draw_size(rng)
    while max(size) < min_side:
        size = draw_size(rng)
    return draw_scene(rng, *size), _encoding(rng)


# ---- the design ---------------------------------------------------------------------

def _pool(n_procedural: int, photos: list[PhotoCrop], seed: int) -> list[tuple[Content, Encoding]]:
    pool: list[tuple[Content, Encoding]] = [
        (crop, _encoding(stream(seed, "photo-format", crop.photo.name))) for crop in photos]
    pool += [_scene_original(stream(seed, "original", i)) for i in range(n_procedural)]
    return pool


def _near_groups(pool: list[tuple[Content, Encoding]], order: list[int], n_easy: int, n_hard: int,
                 seed: int) -> tuple[list[tuple[int, str]], list[int]]:
    """Pair near-duplicate edit kinds with distinct sources; return (pairs, unused pool indices)."""
    rng = stream(seed, "edit-kinds")
    kinds = ([EASY_EDITS[(int(rng.integers(5)) + i) % len(EASY_EDITS)] for i in range(n_easy)]
             + [HARD_EDITS[(int(rng.integers(6)) + i) % len(HARD_EDITS)] for i in range(n_hard)])
    big = [i for i in order if max(pool[i][0].width, pool[i][0].height) >= MIN_SOURCE_SIDE]
    if len(big) < len(kinds):
        raise ValueError("too few rows to plant the near-duplicates; use a larger n")
    sources = big[: len(kinds)]
    # A greyscale copy of a photo would contradict its hand-written colour caption.
    for i, kind in enumerate(kinds):
        if kind == "greyscale" and isinstance(pool[sources[i]][0], PhotoCrop):
            j = next(j for j, k in enumerate(kinds)
                     if k != "greyscale" and isinstance(pool[sources[j]][0], Scene))
            sources[i], sources[j] = sources[j], sources[i]
    used = set(sources)
    return list(zip(sources, kinds, strict=True)), [i for i in order if i not in used]


def _bad_group(kind: str, copy: int, seed: int) -> tuple[Content, Member]:
    rng = stream(seed, "bad", kind, copy)
    size = small_size(rng) if kind == "too_small" else (
        extreme_aspect_size(rng) if kind == "extreme_aspect" else draw_size(rng))
    scene = draw_scene(rng, *size)
    jpeg = Encoding("JPEG", int(rng.integers(80, 96)))
    member = {
        "too_small": lambda: Member(kind, "encode", "jpg", jpeg),
        "extreme_aspect": lambda: Member(kind, "encode", "jpg", jpeg),
        "truncated_jpeg": lambda: Member(kind, "truncate", "jpg", jpeg),
        "empty_file": lambda: Member(kind, "empty", "jpg"),
        "not_an_image": lambda: Member(kind, "random", "png", param=(int(rng.integers(2**63)),)),
        "decompression_bomb": lambda: Member(kind, "bomb", "png", param=BOMB_SIZES[copy % len(BOMB_SIZES)]),
        "missing_file": lambda: Member(kind, "none", "jpg"),
        "unsafe_path": lambda: Member(kind, "none", "jpg", path=UNSAFE_PATHS[copy % len(UNSAFE_PATHS)]),
    }[kind]()
    return scene, member


def _special_group(kind: str, copy: int, seed: int) -> tuple[Content, Member]:
    rng = stream(seed, "special", kind, copy)
    if kind == "exif_rotated":
        stored_w, stored_h = EXIF_ROTATED_STORED
        scene = draw_scene(rng, stored_h, stored_w)    # the upright picture viewers show
    else:
        scene = draw_scene(rng, *draw_size(rng))
    jpeg = Encoding("JPEG", int(rng.integers(80, 96)))
    member = {
        "png_as_jpg": Member(kind, "encode", "jpg", Encoding("PNG")),
        "cmyk_jpeg": Member(kind, "cmyk", "jpg", jpeg),
        "exif_rotated": Member(kind, "exif", "jpg", jpeg),
    }[kind]
    return scene, member


def _groups(n: int, seed: int) -> list[tuple[Content, tuple[Member, ...]]]:
    per_bad = 1 + n // 1000
    per_special = 1 + n // 2000
    n_exact = max(1, round(EXACT_SHARE * n))
    n_near = max(2, round(NEAR_SHARE * n))
    n_easy, n_hard = (n_near + 1) // 2, n_near // 2
    bursts = []
    for b in range(max(1, round(n / ROWS_PER_BURST))):
        rng = stream(seed, "burst", b)
        scene, _ = _scene_original(rng, MIN_SOURCE_SIDE)
        variants = [draw_burst_variant(rng) for _ in range(int(rng.integers(5, 7)))]
        bursts.append((scene, (Member("burst_original", "encode", "jpg", Encoding("JPEG", int(rng.integers(85, 96)))),
                               *(Member("burst_variant", "edit", "jpg", edit=v) for v in variants))))
    fixed = (len(BAD_KINDS) * per_bad + len(SPECIAL_KINDS) * per_special
             + sum(len(members) for _, members in bursts))
    singles = n - fixed - 2 * n_exact - 2 * n_near
    if singles < 0:
        raise ValueError(f"n={n} is too small for the planted records ({n - singles} rows needed)")
    rng = stream(seed, "photos")
    n_photos = min(len(PHOTOS), n // ROWS_PER_PHOTO, singles + n_exact + n_near)
    photos = [draw_photo_crop(PHOTOS[int(i)], stream(seed, "photo", PHOTOS[int(i)].name))
              for i in sorted(rng.permutation(len(PHOTOS))[:n_photos])]
    pool = _pool(singles + n_exact + n_near - n_photos, photos, seed)
    order = [int(i) for i in stream(seed, "roles").permutation(len(pool))]
    near, rest = _near_groups(pool, order, n_easy, n_hard, seed)

    groups: list[tuple[Content, tuple[Member, ...]]] = []
    for j, (i, kind) in enumerate(near):
        content, enc = pool[i]
        edit = draw_edit(kind, stream(seed, "edit", j), (content.width, content.height), enc)
        groups.append((content, (Member("original", "encode", enc.ext, enc),
                                 Member("near_duplicate", "edit", edit.encoding.ext, edit=edit))))
    for i in rest[:n_exact]:
        content, enc = pool[i]
        groups.append((content, (Member("original", "encode", enc.ext, enc),
                                 Member("exact_duplicate", "copy", enc.ext, enc))))
    for i in sorted(rest[n_exact:]):
        content, enc = pool[i]
        groups.append((content, (Member("original", "encode", enc.ext, enc),)))
    groups += bursts
    for kind in BAD_KINDS:
        groups += [(c, (m,)) for c, m in (_bad_group(kind, k, seed) for k in range(per_bad))]
    for kind in SPECIAL_KINDS:
        groups += [(c, (m,)) for c, m in (_special_group(kind, k, seed) for k in range(per_special))]
    return groups


def _table_order(group_of: np.ndarray, seed: int) -> np.ndarray:
    """A shuffle of the rows in which no two rows of one group are neighbours."""
    rng = stream(seed, "shuffle")
    for _ in range(10_000):
        order = rng.permutation(len(group_of))
        g = group_of[order]
        if not np.any(g[1:] == g[:-1]):
            return order
    raise ValueError("cannot spread related rows apart; use a larger n")


def design_sample_corpus(n: int = 2000, seed: int = 0) -> SampleDesign:
    """Design a sample corpus of ``n`` metadata rows; same (n, seed) gives the same design."""
    if n < 1:
        raise ValueError("n must be positive")
    drafted = _groups(n, seed)
    groups = tuple(Group(gid, content, members) for gid, (content, members) in enumerate(drafted))
    slots = [(g.gid, i) for g in groups for i in range(len(g.members))]
    order = _table_order(np.array([gid for gid, _ in slots]), seed)
    width = max(6, len(str(n - 1)))
    start = crawl_start(stream(seed, "crawl"))
    rows = []
    for position, slot in enumerate(order):
        gid, index = slots[int(slot)]
        group, member = groups[gid], groups[gid].members[index]
        key = f"s{position:0{width}d}"
        path = member.path or f"images/{position // ROWS_PER_FOLDER:03d}/{key}.{member.ext}"
        meta = draw_metadata(stream(seed, "metadata", int(slot)), start)
        view = member.edit.caption_view() if member.role == "near_duplicate" else PLAIN
        caption = write_caption(group.content, meta.caption_type, stream(seed, "caption", int(slot)), view)
        rows.append(Row(key, path, gid, index, caption, meta))
    return SampleDesign(n, seed, groups, tuple(rows))
