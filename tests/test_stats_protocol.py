"""GPIC's evaluation protocol: preprocessing pixel for pixel, raw DINOv2 features, provenance checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from tasks.shared.features import preprocess as pp
from tasks.shared.features.config import ModelSpec, RuntimeConfig
from tasks.shared.features.registry import load_model
from tasks.stats.evaluate import ProtocolMismatch, Reference, check_model, expected_identity
from tasks.shared.provenance import RANDOM_INIT_WARNING, model_deviations

pytestmark = pytest.mark.timeout(120)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def direct_gpic_eval(image: Image.Image, size: int = 224) -> np.ndarray:
    """App. B.1 written out with Pillow alone: square centre crop, bicubic 256, bicubic size."""
    w, h = image.size
    s = min(w, h)
    box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
    img = image.crop(box)
    if img.size != (256, 256):
        img = img.resize((256, 256), resample=Image.Resampling.BICUBIC)
    img = img.resize((size, size), resample=Image.Resampling.BICUBIC)
    x = np.asarray(img, dtype=np.float32) / np.float32(255.0)
    x = (x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return x.transpose(2, 0, 1)


def picture(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("size", [(640, 480), (301, 517), (256, 256), (100, 150), (257, 256), (1000, 999)])
def test_gpic_eval_equals_direct_pillow_pixel_for_pixel(size):
    image = picture(*size, seed=size[0])
    got = pp.gpic_eval(image)
    assert got.dtype == np.float32 and got.shape == (3, 224, 224)
    np.testing.assert_array_equal(got, direct_gpic_eval(image))


def test_gpic_eval_equals_the_ports_torchvision_transform_on_256_images():
    """The port: Resize((224, 224)) bicubic + ToTensor + Normalize on the released 256×256 images."""
    image = picture(256, 256, seed=7)
    port = transforms.Compose([transforms.Resize((224, 224), interpolation=transforms.InterpolationMode.BICUBIC),
                               transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    np.testing.assert_array_equal(pp.gpic_eval(image), port(image).numpy())


SMALL = ModelSpec(name="dinov2", arch="vit_small_patch14_dinov2", random_init=True, image_size=28)


def test_dinov2_gpic_eval_embeds_raw_cls_features():
    model = load_model(SMALL, RuntimeConfig(batch_size=4))
    batch = np.stack([model.preprocess(picture(40, 30, s)) for s in range(3)])
    feats = model.embed(batch)
    assert model.normalized is False and feats.shape == (3, 384)
    assert not np.allclose(np.linalg.norm(feats, axis=1), 1.0)
    with torch.inference_mode():
        cls = model.net.forward_features(torch.from_numpy(batch))[:, 0].numpy()
    np.testing.assert_allclose(feats, cls, rtol=1e-5, atol=1e-5)


def _reference(identity: dict | None) -> Reference:
    prov = None if identity is None else {"model": identity, "protocol_deviations": []}
    return Reference("ref.npz", np.zeros(3), np.eye(3), 10, None, prov)


def test_changed_model_or_preprocessing_is_detected():
    model = load_model(SMALL, RuntimeConfig())
    ref = _reference(model.fingerprint())
    assert check_model(ref, model.fingerprint(), allow_mismatch=False) == []
    assert check_model(ref, expected_identity(SMALL), allow_mismatch=False) == []
    other_prep = SMALL.model_copy(update={"preprocessing": "dinov2_eval"})
    with pytest.raises(ProtocolMismatch, match="preprocessing"):
        check_model(ref, expected_identity(other_prep), allow_mismatch=False)
    other_arch = SMALL.model_copy(update={"arch": "vit_small_patch14_reg4_dinov2"})
    with pytest.raises(ProtocolMismatch, match="arch"):
        check_model(ref, expected_identity(other_arch), allow_mismatch=False)
    changed_weights = {**model.fingerprint(), "weights": "ab" * 32, "random_init": False}
    found = check_model(ref, changed_weights, allow_mismatch=True)
    assert any(m.startswith("weights:") for m in found) and any(m.startswith("random_init:") for m in found)


def test_gpic_release_reference_assumes_the_protocol_model():
    ref = _reference(None)
    protocol = ModelSpec(name="dinov2", random_init=True)
    assert check_model(ref, expected_identity(protocol), allow_mismatch=False) == []
    with pytest.raises(ProtocolMismatch):
        check_model(ref, expected_identity(SMALL), allow_mismatch=False)


def test_deviations_name_every_departure_from_the_protocol():
    model = load_model(SMALL, RuntimeConfig())
    devs = model_deviations(model.fingerprint())
    assert devs[0] == RANDOM_INIT_WARNING
    assert any("vit_small_patch14_dinov2" in d for d in devs)
    default = {"model_id": "dinov2_vitl14_gpic_eval", "arch": "vit_large_patch14_dinov2", "random_init": False,
               "preprocessing": "gpic_eval", "normalized": False}
    assert model_deviations(default) == []
    assert "input size" in model_deviations({**default, "model_id": "dinov2_vitl14_gpic_eval_s112"})[0]
    assert "preprocessing" in model_deviations({**default, "preprocessing": "dinov2_eval", "normalized": True})[0]


def test_deviations_list_a_resize_the_port_mode_and_int8_beside_anything_else():
    """Each deviation is listed on its own: a resized input is not hidden by random weights,
    the port's preprocessing is named, and a model's own declared deviation (int8) is kept."""
    from tasks.shared.features.sscd_onnx import DEVIATION

    devs = model_deviations(load_model(SMALL, RuntimeConfig()).fingerprint())
    assert devs[0] == RANDOM_INIT_WARNING and any(d.startswith("input resized to 28×28 px") for d in devs)
    port = {"model_id": "dinov2_vitl14_gpic_eval_port", "arch": "vit_large_patch14_dinov2", "random_init": False,
            "preprocessing": "gpic_eval_port", "normalized": False}
    assert len(model_deviations(port)) == 1 and "port mode" in model_deviations(port)[0]
    int8 = {"model_id": "sscd_onnx_s224", "arch": "sscd_disc_mixup_int8", "weights": "ab" * 32, "random_init": False,
            "preprocessing": "sscd_onnx_square224", "normalized": True, "protocol_deviation": DEVIATION}
    devs = model_deviations(int8)
    assert DEVIATION in devs and any(d.startswith("input resized to 224×224 px") for d in devs)
