"""Optional Inception-v3 statistics model: config, preprocessing, random init at a tiny
input size, a published-layout torchvision weights file, refusals, protocol deviation."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import transforms as T

from tasks.shared.features import preprocess as pp
from tasks.shared.features.config import ModelSpec, RuntimeConfig, WeightsSpec
from tasks.shared.features.extract import decode_size
from tasks.shared.features.registry import MissingWeightsError, build_model
from tasks.shared.features.weights import WeightsError
from tasks.shared.provenance import RANDOM_INIT_WARNING, model_deviations

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.timeout(300)

CPU = RuntimeConfig(device="cpu")
SIZE = 75  # the architecture's minimum input side
SPEC = ModelSpec(name="inception", random_init=True, image_size=SIZE)


def photo(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(h // 8, 2), max(w // 8, 2), 3), dtype=np.uint8)
    return Image.fromarray(small).resize((w, h), Image.BILINEAR)


IMAGES = [photo(97, 61, 1), photo(61, 97, 2), photo(80, 80, 3)]


def batch(model, images) -> np.ndarray:
    return np.stack([model.preprocess(im) for im in images])


def published_state(seed: int = 1) -> dict[str, torch.Tensor]:
    """A random torchvision inception_v3 as torchvision publishes it: aux logits and fc
    included, non-trivial BatchNorm statistics."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False,
                                              transform_input=True)
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return net.state_dict()


def save(state: dict, path: Path) -> WeightsSpec:
    torch.save(state, path)
    return WeightsSpec(uri=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def test_config_id_and_fixed_architecture():
    assert ModelSpec(name="inception").model_id == "inception_v3"
    assert ModelSpec(name="inception", preprocessing="inception_299").model_id == "inception_v3"
    assert SPEC.model_id == "inception_v3_s75"
    assert ModelSpec(name="inception").resolved_preprocessing == "inception_299"
    for bad in ({"arch": "inception_v4"}, {"preprocessing": "gpic_eval"}):
        with pytest.raises(ValueError):
            ModelSpec(name="inception", **bad)
    with pytest.raises(ValueError, match="at least 75"):
        build_model(ModelSpec(name="inception", random_init=True, image_size=64), CPU)


@pytest.mark.parametrize("image", [photo(97, 61, 4), photo(299, 299, 5)], ids=["resized", "already-299"])
def test_preprocessing_matches_torchvision_resize_bicubic(image):
    ref = T.Compose([T.Resize((299, 299), T.InterpolationMode.BICUBIC), T.ToTensor(),
                     T.Normalize(pp.IMAGENET_MEAN, pp.IMAGENET_STD)])(image).numpy()
    np.testing.assert_array_equal(pp.inception_299(image), ref)


def test_random_init_raw_2048_features_deterministic_and_flagged():
    a, b = build_model(SPEC, CPU), build_model(SPEC, CPU)
    x = batch(a, IMAGES)
    assert x.shape == (3, 3, SIZE, SIZE) and x.dtype == np.float32
    fa, fb = a.embed(x), b.embed(x)
    assert fa.shape == (3, 2048) and fa.dtype == np.float32 and a.dim == 2048
    np.testing.assert_array_equal(fa, fb)  # fixed seed: same values on every worker
    assert not a.normalized and not np.allclose(np.linalg.norm(fa, axis=1), 1.0)
    assert np.isfinite(fa).all() and (fa >= 0).all()  # pooled ReLU activations
    fp = a.fingerprint()
    assert a.random_init and fp["weights"] == "random-init" and fp["arch"] == "inception_v3"
    assert fp["preprocessing"] == "inception_299" and fp["normalized"] is False
    # a statistics model: full decodes, no JPEG draft scaling
    assert decode_size([a]) is None


def test_transform_input_maps_imagenet_normalised_pixels_to_minus_one_one():
    model = build_model(SPEC, CPU)
    image = IMAGES[0]
    x = torch.from_numpy(model.preprocess(image))[None]
    pixels = np.asarray(image.resize((SIZE, SIZE), Image.BICUBIC), dtype=np.float32) / 255
    expected = (pixels.transpose(2, 0, 1)[None] - 0.5) / 0.5
    np.testing.assert_allclose(model.net._transform_input(x).numpy(), expected, atol=1e-5)


def test_published_torchvision_file_loads_and_matches_torchvision(tmp_path):
    state = published_state()
    assert any(k.startswith("AuxLogits.") for k in state) and "fc.weight" in state
    spec = ModelSpec(name="inception", image_size=SIZE, weights=save(state, tmp_path / "inception.pth"))
    model = build_model(spec, CPU)
    assert not model.random_init and model.fingerprint()["weights"] == spec.weights.sha256

    ref = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False, transform_input=True)
    ref.load_state_dict(state)
    ref.fc = torch.nn.Identity()
    ref.eval()
    x = batch(model, IMAGES)
    with torch.inference_mode():
        expected = ref(torch.from_numpy(x)).numpy()
    got = model.embed(x)
    assert got.shape == (3, 2048)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # and not what the seed-0 random init gives
    assert not np.allclose(got, build_model(SPEC, CPU).embed(x))


def test_only_aux_and_fc_keys_are_tolerated(tmp_path):
    state = published_state()
    extra = {**state, "Mixed_8a.extra": torch.zeros(1)}
    with pytest.raises(RuntimeError, match="Unexpected"):
        build_model(ModelSpec(name="inception", image_size=SIZE, weights=save(extra, tmp_path / "extra.pth")), CPU)
    missing = {k: v for k, v in state.items() if not k.startswith("Mixed_7c.")}
    with pytest.raises(RuntimeError, match="Missing"):
        build_model(ModelSpec(name="inception", image_size=SIZE, weights=save(missing, tmp_path / "miss.pth")), CPU)


def test_wrong_sha256_is_refused_and_missing_weights_is_a_clear_error(tmp_path):
    path = tmp_path / "inception.pth"
    path.write_bytes(b"not even a checkpoint")
    wrong = WeightsSpec(uri=str(path), sha256="ab" * 32)
    with pytest.raises(WeightsError, match="does not match"):
        build_model(ModelSpec(name="inception", image_size=SIZE, weights=wrong), CPU)
    with pytest.raises(MissingWeightsError, match="random_init"):
        build_model(ModelSpec(name="inception"), CPU)


def test_provenance_records_inception_as_a_protocol_deviation():
    identity = build_model(SPEC, CPU).fingerprint()
    devs = model_deviations(identity)
    assert devs[0] == RANDOM_INIT_WARNING
    assert any("inception_v3 instead of DINOv2" in d for d in devs)
    assert any("preprocessing 'inception_299'" in d for d in devs)
    # with real (pinned) weights it is still a deviation, just not a random-init one
    trained = {**identity, "random_init": False, "weights": "cd" * 32, "model_id": "inception_v3"}
    devs = model_deviations(trained)
    assert RANDOM_INIT_WARNING not in devs and any("inception_v3" in d for d in devs)
