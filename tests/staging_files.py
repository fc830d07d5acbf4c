"""Staging shards written for tests the way the staging stage writes them.

``staging/tars/{shard}.tar``, ``staging/index/{shard}.parquet``,
``staging/records/{shard}.parquet`` and last the unit's marker
``_markers/staging/tars/{shard}.tar.json`` (stage contract), whose ``info.images`` is
what the feature stage's fingerprint reads (:func:`tasks.staging.stage.images_digest`).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from PIL import Image

from corpusforge.contract import finish_unit
from corpusforge.layout import STAGING_RECORDS_SCHEMA, staging_index, staging_records, staging_tar
from corpusforge.storage import Store
from corpusforge.tarshard import Sample, write_tar
from tasks.graph.planted import plant
from tasks.staging.stage import images_digest


def write_staging_shard(store: Store, shard: str, records: list[dict[str, Any]], samples: list[Sample]
                        ) -> dict[str, Any]:
    """Write one staging shard: ``records`` are rows of the records file (fields of
    ``STAGING_RECORDS_SCHEMA``, missing ones null; ``key``, ``sha256`` and ``ext`` at least),
    ``samples`` the tar's samples in the same order. Returns the marker."""
    if [r["key"] for r in records] != [s.key for s in samples]:
        raise ValueError("records and samples must list the same keys in the same order")
    with store.atomic_write(staging_tar(shard)) as f:
        result = write_tar(f, samples)
    outputs = {staging_tar(shard): result.sha256,
               staging_index(shard): store.write_parquet(staging_index(shard), result.index),
               staging_records(shard): store.write_parquet(
                   staging_records(shard), pa.Table.from_pylist(records, schema=STAGING_RECORDS_SCHEMA))}
    return finish_unit(store, staging_tar(shard), f"test-staging-{shard}", outputs,
                       {"shard": shard, "count": result.count, "bytes": result.bytes,
                        "images": images_digest(records)})


def stage_images(store: Store, shard: str, images: list[tuple[str, bytes, str]]) -> dict[str, Any]:
    """One staging shard from ``(key, image bytes, ext)`` triples, records filled from the bytes."""
    samples, rows = [], []
    for i, (key, data, ext) in enumerate(images):
        w, h = Image.open(io.BytesIO(data)).size
        samples.append(Sample(key, {ext: data, "txt": b"c", "json": b"{}"}))
        rows.append({"key": key, "part": 0, "row": i, "sha256": hashlib.sha256(data).hexdigest(), "width": w,
                     "height": h, "source": "test", "caption_type": "short", "ext": ext, "bytes": len(data)})
    return write_staging_shard(store, shard, rows, samples)


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def stage_photo_copies(store: Store, photos: Path, transform: str, names: Sequence[str], prefix: str) -> list[str]:
    """Every photograph of ``photos`` (``*.jpg``) in shard 000000 and the ``transform`` copy of each
    of ``names`` (the i-th planted with seed i, keyed ``{prefix}{name}``) in 000001, as PNG; the shards."""
    pictures = {p.stem: Image.open(p).convert("RGB") for p in sorted(photos.glob("*.jpg"))}
    stage_images(store, "000000", [(name, _png(p), "png") for name, p in pictures.items()])
    stage_images(store, "000001", [(f"{prefix}{n}", _png(plant(pictures[n], transform, i)), "png")
                                   for i, n in enumerate(names)])
    return ["000000", "000001"]
