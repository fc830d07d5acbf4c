"""Stable hashing and serialisation: the basis of fingerprints, seeds and receipts."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
# The C encoder behind _CANONICAL, built once: JSONEncoder.encode builds it on every call,
# a quarter of the time of encoding a staged sample's metadata. Same settings, same text
# (no check for circular references: one fails with RecursionError instead of ValueError).
_C_ENCODER = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, str, json.encoder.encode_basestring, None, ":", ",", True, False, True)


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace variation, so equal data hash equally
    (``json.dumps`` with these settings, without building an encoder per call)."""
    if _C_ENCODER is None:  # an interpreter without the C accelerator
        return _CANONICAL.encode(obj)
    return "".join(_C_ENCODER(obj, 0))


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a local file, streamed (weights and index lists can be gigabytes)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(*parts: Any) -> str:
    """A short stable hash of any JSON-able parts (configs, versions, input hashes)."""
    return hashlib.sha256(canonical_json(list(parts)).encode()).hexdigest()[:32]


def stable_uniform(seed: int, key: str) -> float:
    """A deterministic pseudo-random number in [0, 1) for ``key``: shuffles and sampling that
    must not depend on shard order or worker count."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def stable_int(seed: int, key: str, modulo: int) -> int:
    """A deterministic integer in [0, modulo) for ``key`` (hash partitioning)."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % modulo
