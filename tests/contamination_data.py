"""Synthetic texts for the contamination tests: template captions with planted copies and edits.

Captions are drawn from a small grammar over shared vocabulary, so unrelated captions
share many 3-shingles (a hard case for LSH: lots of low-Jaccard pairs), and planted
queries are exact copies, case/punctuation variants, word substitutions at a known
rate, tag lists, or fresh captions.
"""

from __future__ import annotations

import numpy as np

SIZES = ["small", "large", "tiny", "huge", "narrow", "wide", "tall", "round"]
COLOURS = ["red", "blue", "green", "yellow", "black", "white", "grey", "orange", "purple", "brown", "pink", "teal"]
THINGS = ["car", "dog", "cat", "house", "tree", "boat", "lamp", "chair", "bird", "bicycle", "robot", "lantern",
          "kettle", "window", "bridge", "tower", "horse", "train", "flower", "clock"]
VERBS = ["stands", "sits", "rests", "waits", "leans", "hangs", "glows", "floats"]
PLACES = ["in a quiet street", "on a sandy beach", "near a busy market", "under a cloudy sky", "beside a river",
          "inside a bright kitchen", "in a snowy field", "at the edge of a forest", "on a wooden table"]
EXTRAS = ["with soft light", "at dusk", "in the morning", "seen from above", "with a blurred background",
          "in heavy rain", "next to a fence", "with long shadows", "on a windy day", "framed by leaves"]


def caption(rng: np.random.Generator) -> str:
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    first = f"A {pick(SIZES)} {pick(COLOURS)} {pick(THINGS)} {pick(VERBS)} {pick(PLACES)}"
    second = f"a {pick(COLOURS)} {pick(THINGS)} {pick(EXTRAS)}"
    return f"{first}, beside {second}." if rng.random() < 0.7 else f"{first} {pick(EXTRAS)}."


def captions(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [caption(rng) for _ in range(n)]


def substitute(text: str, rate: float, rng: np.random.Generator) -> str:
    """Replace about ``rate`` of the words with unrelated ones."""
    words = text.split()
    for i in range(len(words)):
        if rng.random() < rate:
            words[i] = f"zq{int(rng.integers(10**6))}"
    return " ".join(words)


def planted_queries(corpus: list[str], n_each: int, seed: int) -> tuple[list[str], list[str]]:
    """Queries and their kind: exact copies, case/punctuation variants, light and heavy word
    substitutions, tag lists of a corpus caption's words, formulaic negative controls (new
    captions from the same grammar) and unrelated ones (other words altogether)."""
    rng = np.random.default_rng(seed)
    texts, kinds = [], []
    for kind in ("exact", "variant", "light_edit", "heavy_edit", "tags", "formulaic", "unrelated"):
        for _ in range(n_each):
            src = corpus[int(rng.integers(len(corpus)))]
            if kind == "exact":
                t = src
            elif kind == "variant":
                t = src.upper().replace(",", " ;")
            elif kind == "light_edit":
                t = substitute(src, 0.08, rng)
            elif kind == "heavy_edit":
                t = substitute(src, 0.45, rng)
            elif kind == "tags":
                words = [w.strip(",.") for w in src.split()[1:6]]
                t = ", ".join(words)
            elif kind == "formulaic":
                t = caption(np.random.default_rng(int(rng.integers(2**31)) + 10**9))
            else:
                t = " ".join(f"w{int(rng.integers(10**6))}" for _ in range(int(rng.integers(8, 20))))
            texts.append(t)
            kinds.append(kind)
    return texts, kinds


def noise_png(rng: np.random.Generator, size: tuple[int, int] = (300, 240)) -> bytes:
    """A smooth random picture unlike any sample-corpus scene."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)).resize(size, Image.Resampling.BICUBIC).save(
        buf, "PNG")
    return buf.getvalue()


def write_eval_set(root, corpus_root, captions: dict[str, str], n_copies: int, n_edits: int, n_other: int,
                   seed: int = 0, held_out_copies: int = 0, n_corrupt: int = 0, n_grey: int = 0) -> dict:
    """An evaluation table with image files: byte-identical copies, edited copies (80 %
    resize, JPEG q80) and greyscale copies (PNG) of training images, copies of held-out
    (test split) images, and unrelated pictures, and truncated PNGs (undecodable). Copies
    carry their training caption; returns planted id → training key."""
    import shutil
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from PIL import Image

    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    manifest = ds.dataset(Path(corpus_root) / "manifest").to_table().to_pylist()
    kept = sorted((r for r in manifest if r["status"] == "kept"), key=lambda r: r["key"])
    train = [r for r in kept if r["split"] == "train"]
    test = [r for r in kept if r["split"] == "test"]
    rng = np.random.default_rng(seed)
    rows, planted = [], {}
    for i, r in enumerate(train[:n_copies]):
        shutil.copyfile(r["source_path"], root / "images" / f"copy{i}.img")
        cap = captions.get(r["key"]) or f"copy {i}"
        rows.append({"id": f"copy{i}", "path": f"images/copy{i}.img", "question": "What does the picture show?",
                     "answer": cap, "category": "copies"})
        planted[f"copy{i}"] = r["key"]
    for i, r in enumerate(train[n_copies:n_copies + n_edits]):
        im = Image.open(r["source_path"]).convert("RGB")
        im.resize((int(im.width * 0.8), int(im.height * 0.8))).save(root / "images" / f"edit{i}.jpg", quality=80)
        rows.append({"id": f"edit{i}", "path": f"images/edit{i}.jpg", "question": "Which colour dominates?",
                     "answer": "blue", "category": "edits"})
        planted[f"edit{i}"] = r["key"]
    for i, r in enumerate(train[n_copies + n_edits:n_copies + n_edits + n_grey]):
        Image.open(r["source_path"]).convert("L").save(root / "images" / f"grey{i}.png")
        rows.append({"id": f"grey{i}", "path": f"images/grey{i}.png", "question": "Is it in colour?",
                     "answer": "no", "category": "greyscale"})
        planted[f"grey{i}"] = r["key"]
    for i, r in enumerate(test[:held_out_copies]):
        shutil.copyfile(r["source_path"], root / "images" / f"held{i}.img")
        rows.append({"id": f"held{i}", "path": f"images/held{i}.img", "question": "q", "answer": "n/a",
                     "category": "held_out"})
    for i in range(n_other):
        (root / "images" / f"other{i}.png").write_bytes(noise_png(rng))
        rows.append({"id": f"other{i}", "path": f"images/other{i}.png", "question": f"Is item {i} a fractal?",
                     "answer": "a purple banana balancing on a windy roof", "category": "clean"})
    for i in range(n_corrupt):
        (root / "images" / f"broken{i}.png").write_bytes(noise_png(rng)[:200])
        rows.append({"id": f"broken{i}", "path": f"images/broken{i}.png", "question": "q", "answer": "n/a",
                     "category": "broken"})
    pq.write_table(pa.Table.from_pylist(rows), root / "bench.parquet")
    return planted
