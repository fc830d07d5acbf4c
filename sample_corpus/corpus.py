"""Render a designed sample corpus and write it: images, ground truth, then the metadata table.

The metadata table is written last, so a folder with ``metadata.parquet`` is complete.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PIL import Image

from corpusforge.storage import Store
from sample_corpus.bad_records import bomb_png, cmyk_jpeg, exif_rotated_jpeg, not_an_image, truncated
from sample_corpus.edits import apply_edit
from sample_corpus.encoding import encode
from sample_corpus.photos import PhotoCrop, render_photo
from sample_corpus.design import Group, Member, design_sample_corpus
from sample_corpus.scenes import render_scene


def render_group(group: Group) -> list[bytes | None]:
    """The file bytes of each member of ``group`` (``None`` where no file is written)."""
    pixels: list[Image.Image] = []

    def image() -> Image.Image:
        if not pixels:
            content = group.content
            pixels.append(render_photo(content) if isinstance(content, PhotoCrop) else render_scene(content))
        return pixels[0]

    makers: dict[str, Callable[[Member], bytes | None]] = {
        "encode": lambda m: encode(image(), m.encoding),
        "copy": lambda m: out[0],
        "edit": lambda m: encode(apply_edit(image(), m.edit), m.edit.encoding),
        "truncate": lambda m: truncated(encode(image(), m.encoding)),
        "empty": lambda m: b"",
        "random": lambda m: not_an_image(np.random.default_rng(m.param[0])),
        "bomb": lambda m: bomb_png(*m.param),
        "cmyk": lambda m: cmyk_jpeg(image(), m.encoding.quality),
        "exif": lambda m: exif_rotated_jpeg(image(), m.encoding.quality),
        "none": lambda m: None,
    }
    out: list[bytes | None] = []
    for member in group.members:
        out.append(makers[member.make](member))
    return out


def write_sample_corpus(out_dir: str, n: int = 2000, seed: int = 0) -> dict:
    """Write a sample corpus of ``n`` metadata rows to ``out_dir``; return counts per kind.

    Same (n, seed) gives byte-identical files. ``out_dir`` must be empty or absent: a file
    left from another run could sit where a planted "missing file" is supposed to be.
    """
    store = Store(out_dir, fsync=False)  # throwaway test data: no per-file disk flush
    if store.listdir(""):
        raise FileExistsError(f"{out_dir} is not empty")
    design = design_sample_corpus(n, seed)
    paths = {(row.gid, row.member): row.path for row in design.rows}
    total = 0
    for group in design.groups:
        for index, data in enumerate(render_group(group)):
            if data is not None:
                store.write_bytes(paths[(group.gid, index)], data)
                total += len(data)
    store.write_json("ground_truth.json", design.ground_truth())
    store.write_parquet("metadata.parquet", design.metadata_table())
    return {**design.summary(), "bytes": total}
