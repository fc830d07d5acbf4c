"""A near-duplicate evaluation set from real photographs that packages ship, with its truth.

Sources (no download beyond the two packages; nothing is redistributed except the test
fixtures below):

* Debian's ``opencv-doc`` (:data:`OPENCV_DOC`, Apache-2.0 / BSD-3-Clause per its copyright
  file): the photographs of ``examples/data`` and a few other example folders, fetched with
  ``apt-get download`` into the cache folder and unpacked with ``dpkg-deb -x``;
* scikit-image's bundled photographs (the ``sample`` extra, already in the venv).

Truth: every original is its own group, except photographs that show one subject and are
*not* the same picture (:data:`SAME_SUBJECT`: stereo pairs, other viewpoints, other poses),
which must never be linked, and natural variants their authors ship (:data:`NATURAL`:
consecutive video frames, an edited copy), which should be. ``build`` writes the
originals, each transform of :mod:`tasks.graph.planted` on a seeded sample of them (one
copy per original and transform, stored as PNG: a transform's JPEG re-encode is inside it), and
``truth.json``::

    python bench/real_photos.py --out /tmp/real --seed 0          # ~130 originals, 14 transforms
    python bench/real_photos.py --fixtures tests/data/real_photos  # the test fixtures

The test fixtures (``tests/data/real_photos``) are :data:`FIXTURES` from ``opencv-doc``,
longer side at most 512 px, JPEG quality 90.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from tasks.graph.planted import TRANSFORMS, plant  # noqa: E402

OPENCV_DOC = ("opencv-doc", "4.6.0+dfsg-12")
OPENCV_EXAMPLES = "usr/share/doc/opencv-doc/examples"
# Real photographs among the package's example images (drawings, renders of shapes,
# scanned text and tiny crops left out); paths relative to OPENCV_EXAMPLES.
OPENCV_PHOTOS = (
    *(f"data/{n}" for n in (
        "aero1.jpg", "aero3.jpg", "aloeL.jpg", "aloeR.jpg", "apple.jpg", "baboon.jpg", "basketball1.png",
        "basketball2.png", "board.jpg", "box.png", "box_in_scene.png", "building.jpg", "butterfly.jpg",
        "chicky_512.png", "ela_modified.jpg", "ela_original.jpg", "fruits.jpg", "graf1.png", "graf3.png",
        "home.jpg", "leuvenA.jpg", "leuvenB.jpg", "licenseplate_motion.jpg", "messi5.jpg", "orange.jpg",
        "pic2.png", "pic3.png", "rubberwhale1.png", "rubberwhale2.png", "smarties.png", "squirrel_cls.jpg",
        "starry_night.jpg", "stuff.jpg", "sudoku.png", "text_defocus.jpg", "text_motion.jpg")),
    *(f"data/left{i:02d}.jpg" for i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14)),
    *(f"data/right{i:02d}.jpg" for i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14)),
    "alphamat/input_images/plant.jpg", "dnn_superres/butterfly.png", "fuzzy/input.png", "reg/home.png",
    *(f"hfs/data/{i:03d}.jpg" for i in range(3)),
    *(f"text/scenetext{i:02d}.jpg" for i in range(1, 7)),
    *(f"text/scenetext_segmented_word{i:02d}.jpg" for i in range(1, 6)),
)
SKIMAGE_PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
                  "retina", "brick", "grass", "gravel", "coins", "moon", "motorcycle_left", "motorcycle_right")
# Different photographs of one subject: never the same picture (a link between two is false).
SAME_SUBJECT = (
    tuple(f"data/{s}{i:02d}.jpg" for s in ("left", "right") for i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14)),
    ("data/aloeL.jpg", "data/aloeR.jpg"), ("data/leuvenA.jpg", "data/leuvenB.jpg"),
    ("data/graf1.png", "data/graf3.png"), ("data/aero1.jpg", "data/aero3.jpg"),
    ("data/box.png", "data/box_in_scene.png"), ("skimage/motorcycle_left", "skimage/motorcycle_right"),
)
# Natural variants shipped by the authors: the same picture (a link is found, not false).
NATURAL = (("data/basketball1.png", "data/basketball2.png"), ("data/rubberwhale1.png", "data/rubberwhale2.png"),
           ("data/ela_original.jpg", "data/ela_modified.jpg"), ("data/text_defocus.jpg", "data/text_motion.jpg"))
FIXTURES = ("data/left01.jpg", "data/left02.jpg", "data/leuvenA.jpg", "data/leuvenB.jpg", "data/aloeL.jpg",
            "data/aloeR.jpg", "data/graf1.png", "data/graf3.png")
FIXTURE_SIDE = 512


def opencv_examples(cache: Path) -> Path:
    """The unpacked ``examples`` folder of :data:`OPENCV_DOC` (fetched once into ``cache``)."""
    name, version = OPENCV_DOC
    unpacked = cache / f"{name}_{version}"
    if not (unpacked / OPENCV_EXAMPLES).is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", f"{name}={version}"], cwd=cache, check=True)
        deb = next(cache.glob(f"{name}_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    return unpacked / OPENCV_EXAMPLES


def originals(cache: Path) -> dict[str, Image.Image]:
    """Name -> RGB picture of every source photograph (``data/...``, ``skimage/...``)."""
    import skimage.data

    examples = opencv_examples(cache)
    out = {name: Image.open(examples / name).convert("RGB") for name in OPENCV_PHOTOS}
    for name in SKIMAGE_PHOTOS:
        if name.startswith("motorcycle"):
            left, right, _ = skimage.data.stereo_motorcycle()
            pixels = left if name.endswith("left") else right
        else:
            pixels = getattr(skimage.data, name)()
        out[f"skimage/{name}"] = Image.fromarray(np.asarray(pixels)).convert("RGB")
    return out


def groups() -> dict[str, str]:
    """Original name -> its truth group: natural variants share one, everything else its own."""
    out = {}
    for pair in NATURAL:
        for name in pair:
            out[name] = pair[0]
    return out


def build(out: Path, cache: Path, seed: int, per_transform: int | None) -> dict:
    """Write originals, planted copies and ``truth.json`` under ``out``; return the truth."""
    pictures = originals(cache)
    names = sorted(pictures)
    group = groups()
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    records = []
    for i, name in enumerate(names):
        key = f"o{i:04d}"
        pictures[name].save(out / "images" / f"{key}.png")
        records.append({"key": key, "source": name, "group": group.get(name, name), "transform": None})
    by_source = {r["source"]: r["key"] for r in records}
    for t, transform in enumerate(sorted(TRANSFORMS)):
        chosen = names if per_transform is None else sorted(rng.choice(names, per_transform, replace=False))
        for j, name in enumerate(chosen):
            key = f"c{t:02d}{j:04d}"
            copy = plant(pictures[name], transform, seed * 1_000_003 + t * 10_007 + j)
            copy.save(out / "images" / f"{key}.png")  # lossless: a transform's own JPEG is inside it
            records.append({"key": key, "source": name, "group": group.get(name, name), "transform": transform,
                            "copy_of": by_source[name]})
    truth = {"seed": seed, "opencv_doc": "=".join(OPENCV_DOC), "records": records,
             "same_subject": [[by_source[n] for n in g] for g in SAME_SUBJECT],
             "natural": [[by_source[n] for n in pair] for pair in NATURAL]}
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth


def write_fixtures(folder: Path, cache: Path) -> None:
    """The test fixtures: :data:`FIXTURES`, longer side at most :data:`FIXTURE_SIDE`, JPEG q90."""
    examples = opencv_examples(cache)
    folder.mkdir(parents=True, exist_ok=True)
    for name in FIXTURES:
        image = Image.open(examples / name)
        image = image.convert("L" if image.mode == "L" else "RGB")
        image.thumbnail((FIXTURE_SIDE, FIXTURE_SIDE), Image.Resampling.LANCZOS)
        image.save(folder / (Path(name).stem + ".jpg"), quality=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the evaluation set here")
    parser.add_argument("--fixtures", help="write the test fixtures here")
    parser.add_argument("--cache", default=str(ROOT / ".cache" / "debian"), help="where opencv-doc is unpacked")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-transform", type=int, default=None, help="originals per transform (default: all)")
    args = parser.parse_args(argv)
    if args.fixtures:
        write_fixtures(Path(args.fixtures), Path(args.cache))
    if args.out:
        truth = build(Path(args.out), Path(args.cache), args.seed, args.per_transform)
        print(f"{sum(r['transform'] is None for r in truth['records'])} originals, "
              f"{sum(r['transform'] is not None for r in truth['records'])} copies -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
