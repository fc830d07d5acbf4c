"""Small synthetic corpora for the GPIC interoperability tests: a folder of mixed-format
images with caption and metadata sidecars, and GPIC-format release tars."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

CAPTION_TYPES = ("tag", "short", "medium", "long")


def image_bytes(seed: int, fmt: str, size: tuple[int, int] = (48, 40)) -> bytes:
    """A random RGB image (distinct per seed, so no two are near-duplicates) in ``fmt``."""
    arr = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    kwargs = {"lossless": True} if fmt == "WEBP" else {}
    Image.fromarray(arr).save(buf, fmt, **kwargs)
    return buf.getvalue()


def mixed_folder(root: Path, n: int = 24) -> Path:
    """``n`` images cycling JPEG/PNG/WebP with a caption and a metadata sidecar each."""
    root.mkdir(parents=True)
    for i in range(n):
        fmt, ext = [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")][i % 3]
        (root / f"img{i:03d}.{ext}").write_bytes(image_bytes(i, fmt))
        (root / f"img{i:03d}.txt").write_text(f"caption number {i}")
        (root / f"img{i:03d}.json").write_text(json.dumps({
            "key": f"img{i:03d}", "caption_type": CAPTION_TYPES[i % 4], "license": "cc-by-4.0",
            "license_url": "https://creativecommons.org/licenses/by/4.0/", "attribution": f"author {i}",
            "retrieved_at": "2025-01-01T00:00:00Z"}))
    return root


def gpic_sample(key: str, seed: int, fmt: str, tiers: list[str], caption_type: str) -> list[tuple[str, bytes]]:
    """One sample as GPIC writes it: ``{key}.json`` then ``{key}.jpg|png``."""
    data = image_bytes(seed, fmt, (40 + seed % 7, 36))
    meta = {"retrieved_at": "2025-03-01T00:00:00Z", "license": "cc0-1.0", "license_url": "", "attribution": "",
            "key": key, "img_width": 40 + seed % 7, "img_height": 36, "split": tiers,
            "caption_type": caption_type, "caption": f"gpic caption {seed}"}
    return [(f"{key}.json", json.dumps(meta).encode()), (f"{key}.{'jpg' if fmt == 'JPEG' else 'png'}", data)]


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def read_tar(path: Path) -> list[tuple[str, bytes]]:
    """(member name, bytes) in the tar's order: what a layout test compares."""
    with tarfile.open(path) as t:
        return [(m.name, t.extractfile(m).read()) for m in t]


def gpic_release(root: Path, train_shards: int = 3, per_shard: int = 4, nano: int = 1, lite: int = 2) -> Path:
    """A GPIC-format release: train/gpic_train_NNNNN.tar (tiers: shard prefixes of ``nano``
    and ``lite`` shards, full = all), val/ and test/ with one shard each."""
    seed = 0
    for split, shards in (("train", train_shards), ("val", 1), ("test", 1)):
        for s in range(shards):
            members: list[tuple[str, bytes]] = []
            for _ in range(per_shard):
                tiers = ([t for t, n in (("nano", nano), ("lite", lite)) if s < n] + ["full"]) \
                    if split == "train" else []
                members += gpic_sample(f"g{seed:05d}", seed, "PNG" if seed % 5 == 0 else "JPEG", tiers,
                                       CAPTION_TYPES[seed % 4])
                seed += 1
            write_tar(root / split / f"gpic_{split}_{s:05d}.tar", members)
    return root
