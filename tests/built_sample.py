"""The sample corpus's end-to-end build settings: the session's one built sample corpus
(``built_sample`` in tests/conftest.py) and the end-to-end tests that build it again use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.build_corpus import BuildConfig


def config(source: Path | str, out: Path | str, **overrides: Any) -> BuildConfig:
    """Small partitions and shards (several of each from 160 records), the default features
    and near-duplicate removal, and statistics with a tiny random-init DINOv2; two worker
    processes when run as a flow."""
    data = {
        "source": str(source), "out": str(out),
        "input": {"partition_size": 40},
        "staging": {"shard_size": 40},
        "splits": {"shard_size": 20, "val": 0.1, "test": 0.15},
        "dask": {"n_workers": 2, "processes": True},
        "reference_stats": {"splits": ["test", "val"], "model": {
            "name": "dinov2", "arch": "vit_small_patch14_dinov2", "image_size": 28, "random_init": True}},
    }
    data.update(overrides)
    return BuildConfig.model_validate(data)
