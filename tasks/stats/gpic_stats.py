"""gpic-eval's reference statistics file, ``test_stats.npz``: writing it and judging one.

GPIC's toolkit reads ``dino_mu`` (d,), ``dino_sigma`` (d, d) and, for PRDC and MMD,
``dino_embeddings`` (N, d) (GPIC_FORMAT.md). The file holds no provenance: not the model,
preprocessing, images or even how many images µ and Σ summarise. The reference stage
writes one for the test split of a DINOv2 model, ``stats/test_stats.npz``, beside its own
sidecar ``stats/test-{model_id}.json``, which records the file's SHA-256 (``files.gpic_npz``)
and how its embeddings were sampled. :func:`provenance_of` finds that sidecar again by
hash, so a file written here is verified; for any other file (GPIC's published one
included) :func:`reference_checks` says what can and cannot be checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
from typing import Any

import fsspec
import numpy as np

GPIC_KEYS = ("dino_mu", "dino_sigma", "dino_embeddings")
PROTOCOL_DIM = 1024  # DINOv2 ViT-L/14
RECOMMENDED_REFERENCE = 50_000


def npz_bytes(**arrays: np.ndarray) -> bytes:
    """An npz file's bytes, deterministic: numpy gives zip members the fixed 1980 timestamp."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def gpic_stats_bytes(mu: np.ndarray, sigma: np.ndarray, embeddings: np.ndarray) -> bytes:
    """µ and Σ float64 as the toolkit computes them, embeddings float32."""
    return npz_bytes(dino_mu=np.asarray(mu, np.float64), dino_sigma=np.asarray(sigma, np.float64),
                     dino_embeddings=np.ascontiguousarray(embeddings, dtype=np.float32))


def provenance_of(npz_uri: str, data: bytes, storage_options: dict[str, Any]) -> dict[str, Any] | None:
    """The sidecar beside ``npz_uri`` that names this file by SHA-256, or None."""
    sha = hashlib.sha256(data).hexdigest()
    fs, path = fsspec.core.url_to_fs(npz_uri, **storage_options)
    for candidate in sorted(fs.glob(posixpath.join(posixpath.dirname(path), "*.json"))):
        try:
            sidecar = json.loads(fs.cat_file(candidate))
        except (ValueError, OSError):
            continue
        entry = (sidecar.get("files") or {}).get("gpic_npz") if isinstance(sidecar, dict) else None
        if isinstance(entry, dict) and entry.get("sha256") == sha:
            return sidecar
    return None


def reference_checks(arrays: dict[str, np.ndarray], provenance: dict[str, Any] | None) -> dict[str, list[str]]:
    """What was checked about a test_stats.npz and what cannot be (recorded in metrics.json)."""
    d = arrays["dino_mu"].shape[0]
    checked = [f"dino_mu has shape ({d},), dino_sigma ({d}, {d})",
               "dino_sigma is symmetric (to 1e-6 relative) with a non-negative diagonal"]
    if "dino_embeddings" in arrays:
        checked.append(f"dino_embeddings has {arrays['dino_embeddings'].shape[0]} rows of dimension {d}")
    if provenance is not None:
        checked.append("SHA-256 of the file equals the one recorded in this project's sidecar, whose model, "
                       "preprocessing, weights, manifest hash and sample size are used")
        cannot = ["the sidecar is this project's own record: nothing signs it"]
    else:
        cannot = [
            ("cannot check which model, weights and preprocessing made the features (no provenance in the file): "
             "assumed DINOv2 ViT-L/14 without registers with the evaluation preprocessing in use"),
            ("cannot check which images, or how many, dino_mu and dino_sigma summarise: n is taken as the number "
             "of dino_embeddings rows"),
            "cannot check that dino_embeddings is a random sample of the same images",
        ]
    if d != PROTOCOL_DIM:
        cannot.append(f"dimension {d} is not DINOv2 ViT-L/14's {PROTOCOL_DIM}")
    return {"checked": checked, "cannot_check": cannot}


def validate_arrays(arrays: dict[str, np.ndarray], uri: str) -> None:
    """A clear error for a malformed file instead of a shape error deep in the metrics."""
    mu, sigma = arrays.get("dino_mu"), arrays.get("dino_sigma")
    if mu is None or sigma is None:
        raise ValueError(f"{uri}: a gpic-eval statistics file needs dino_mu and dino_sigma")
    d = mu.shape[0] if mu.ndim == 1 else -1
    if d < 1 or sigma.shape != (d, d):
        raise ValueError(f"{uri}: dino_mu {mu.shape} and dino_sigma {sigma.shape} do not match")
    if not np.allclose(sigma, sigma.T, rtol=1e-6, atol=1e-12 * float(np.abs(sigma).max() or 1)) \
            or (np.diagonal(sigma) < 0).any():
        raise ValueError(f"{uri}: dino_sigma is not a covariance matrix (asymmetric or negative variance)")
    emb = arrays.get("dino_embeddings")
    if emb is not None and (emb.ndim != 2 or emb.shape[1] != d):
        raise ValueError(f"{uri}: dino_embeddings {emb.shape} does not have dimension {d}")


def small_reference_warning(n: int) -> str | None:
    if n >= RECOMMENDED_REFERENCE:
        return None
    return (f"only {n} reference samples (gpic-eval uses 50,000 or more); FD and PRDC against a small "
            "reference are biased and noisy")
