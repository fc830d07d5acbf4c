"""Pinned weight files: location resolution, hash checks before loading, refusal of code."""

from __future__ import annotations

import hashlib
import os
import pickle
import uuid
from pathlib import Path

import fsspec
import pytest
import torch
from safetensors.torch import save_file

from corpusforge.hashing import sha256_file
from tasks.shared.features.config import FeaturesConfig, ModelSpec, WeightsSpec
from tasks.shared.features.weights import (
    WeightsError,
    fetch_weights,
    load_state_dict,
    load_torchscript,
    read_state_dict,
    resolve_hf_cache,
    sniff_format,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.timeout(120)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def saved_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2)}
    torch.save(sd, path)
    return sd, sha(path.read_bytes())


class WritesMarker:
    """A pickle payload that creates a file when unpickled by an unsafe loader."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_sha256_file_streams_the_whole_file(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == sha(data)


def test_local_file_with_the_right_pin_loads(tmp_path):
    sd, digest = saved_state_dict(tmp_path / "w.pt")
    for uri in (str(tmp_path / "w.pt"), f"file://{tmp_path / 'w.pt'}"):
        loaded = load_state_dict(WeightsSpec(uri=uri, sha256=digest.upper()))
        assert loaded.keys() == sd.keys() and all(torch.equal(loaded[k], sd[k]) for k in sd)


@pytest.mark.scenario(12)
def test_wrong_pin_is_refused_naming_both_hashes(tmp_path):
    _, digest = saved_state_dict(tmp_path / "w.pt")
    wrong = "0" * 64
    with pytest.raises(WeightsError) as err:
        load_state_dict(WeightsSpec(uri=str(tmp_path / "w.pt"), sha256=wrong))
    assert digest in str(err.value) and wrong in str(err.value)


def test_pin_must_be_a_hex_digest():
    with pytest.raises(ValueError):
        WeightsSpec(uri="x.pt", sha256="abc")
    with pytest.raises(ValueError):
        WeightsSpec(uri="x.pt", sha256="0" * 64, unknown=1)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(WeightsError, match="not found"):
        fetch_weights(WeightsSpec(uri=str(tmp_path / "nope.pt"), sha256="0" * 64))


@pytest.mark.scenario(12)
@pytest.mark.parametrize("container", ["pickle", "torch_zip"])
def test_crafted_pickle_is_refused_without_running_it(tmp_path, container):
    control = tmp_path / "control-marker"
    pickle.loads(pickle.dumps(WritesMarker(control)))  # the payload is real: an unsafe load runs it
    assert control.read_text() == "pwned"

    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    payload = {"w": torch.zeros(2), "x": WritesMarker(marker)}
    if container == "pickle":
        path.write_bytes(pickle.dumps(payload, protocol=4))
    else:
        torch.save(payload, path)
    assert sniff_format(path) == container
    spec = WeightsSpec(uri=str(path), sha256=sha(path.read_bytes()))
    with pytest.raises(WeightsError, match="weights_only"):
        load_state_dict(spec)
    assert not marker.exists()


@pytest.mark.scenario(12)
def test_non_tensor_entries_are_refused(tmp_path):
    torch.save({"w": torch.zeros(1), "note": "hello"}, tmp_path / "w.pt")
    with pytest.raises(WeightsError, match="non-tensor"):
        read_state_dict(tmp_path / "w.pt")


def test_containers_and_module_prefix_are_unwrapped(tmp_path):
    torch.save({"epoch": 3, "state_dict": {"module.a": torch.ones(1), "module.b": torch.zeros(2)}}, tmp_path / "c.pt")
    assert set(read_state_dict(tmp_path / "c.pt")) == {"a", "b"}


def test_safetensors_files_load(tmp_path):
    sd = {"w": torch.randn(3, 4), "b": torch.randn(4)}
    save_file(sd, str(tmp_path / "model.safetensors"))
    assert sniff_format(tmp_path / "model.safetensors") == "safetensors"
    loaded = load_state_dict(WeightsSpec(uri=str(tmp_path / "model.safetensors"),
                                         sha256=sha((tmp_path / "model.safetensors").read_bytes())))
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


@pytest.mark.scenario(12)
def test_torchscript_needs_the_allowlist(tmp_path):
    path = tmp_path / "model.torchscript.pt"
    torch.jit.script(Doubler()).save(str(path))
    digest = sha(path.read_bytes())
    assert sniff_format(path) == "torchscript"
    spec = WeightsSpec(uri=str(path), sha256=digest, format="torchscript")
    with pytest.raises(WeightsError, match="torchscript_allowlist"):
        load_torchscript(spec, allowlist=[])
    with pytest.raises(WeightsError, match="TorchScript archive"):
        load_state_dict(WeightsSpec(uri=str(path), sha256=digest))
    module = load_torchscript(spec, allowlist=[digest.upper()])
    assert torch.equal(module(torch.ones(2)), torch.full((2,), 2.0))
    # an allow-listed pin still has to match the bytes
    other = WeightsSpec(uri=str(path), sha256="1" * 64, format="torchscript")
    with pytest.raises(WeightsError, match="does not match"):
        load_torchscript(other, allowlist=["1" * 64])
    assert FeaturesConfig(torchscript_allowlist=[digest]).torchscript_allowlist == [digest]


def test_remote_uri_is_cached_by_hash_and_reverified(tmp_path):
    data_path = tmp_path / "src.pt"
    sd, digest = saved_state_dict(data_path)
    uri = f"memory://weights-{uuid.uuid4().hex}/sscd.pt"
    with fsspec.open(uri, "wb") as f:
        f.write(data_path.read_bytes())
    cache = tmp_path / "cache"
    spec = WeightsSpec(uri=uri, sha256=digest)
    local = fetch_weights(spec, cache_dir=cache)
    assert local == cache / f"{digest}.pt" and sha256_file(local) == digest
    assert torch.equal(read_state_dict(local)["w"], sd["w"])
    assert fetch_weights(spec, cache_dir=cache) == local  # cache hit
    local.write_bytes(b"tampered")
    with pytest.raises(WeightsError, match="does not match"):
        fetch_weights(spec, cache_dir=cache)
    local.unlink()
    with pytest.raises(WeightsError, match="does not match"):
        fetch_weights(WeightsSpec(uri=uri, sha256="2" * 64), cache_dir=cache)
    assert sorted(p.name for p in cache.iterdir()) == []  # nothing half-written or unverified kept


def make_hf_cache(root: Path, files: dict[str, bytes], rev: str = "0123abcd") -> Path:
    """The huggingface_hub cache layout: blobs named by hash, snapshots linking to them."""
    repo = root / "hub" / "models--org--name"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "blobs").mkdir()
    (repo / "snapshots" / rev).mkdir(parents=True)
    for name, data in files.items():
        blob = repo / "blobs" / sha(data)
        blob.write_bytes(data)
        (repo / "snapshots" / rev / name).symlink_to(os.path.relpath(blob, repo / "snapshots" / rev))
    return repo


def test_hugging_face_cache_directory_resolution(tmp_path):
    sd = {"w": torch.randn(2, 2)}
    save_file(sd, str(tmp_path / "x.safetensors"))
    data = (tmp_path / "x.safetensors").read_bytes()
    repo = make_hf_cache(tmp_path, {"model.safetensors": data, "config.json": b"{}"})
    snapshot_file = repo / "snapshots" / "0123abcd" / "model.safetensors"
    for uri in (str(repo), str(repo / "model.safetensors"), str(snapshot_file)):
        assert resolve_hf_cache(uri) == snapshot_file
        loaded = load_state_dict(WeightsSpec(uri=uri, sha256=sha(data)))
        assert torch.equal(loaded["w"], sd["w"])


def test_hugging_face_cache_ambiguity_and_missing_ref(tmp_path):
    repo = make_hf_cache(tmp_path, {"a.safetensors": b"1", "b.bin": b"2"})
    with pytest.raises(WeightsError, match="append the file name"):
        resolve_hf_cache(str(repo))
    (repo / "refs" / "main").unlink()
    with pytest.raises(WeightsError, match="refs"):
        resolve_hf_cache(str(repo / "a.safetensors"))
    with pytest.raises(WeightsError, match="models--"):
        resolve_hf_cache(str(tmp_path / "plain" / "file.pt"))


def test_model_spec_weights_are_typed():
    spec = ModelSpec(name="sscd_disc_mixup", weights={"uri": "s3://b/k.pt", "sha256": "a" * 64,
                                                      "storage_options": {"anon": True}})
    assert spec.weights.format == "state_dict" and spec.weights.storage_options == {"anon": True}
