"""Feature models: configs, preprocessing against the reference pipelines, SSCD/CLIP/DINOv2
at random init on tiny inputs, published-style weight files, runtime options."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
import torchvision
import yaml
from PIL import Image
from safetensors.torch import save_file
from open_clip.transform import PreprocessCfg, image_transform_v2
from torchvision import transforms as T

from tasks.shared.features import preprocess as pp
from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig, WeightsSpec
from tasks.shared.features.dinov2 import resample_patch_pos
from tasks.shared.features.registry import MissingWeightsError, build_model, clear_cache, load_model
from tasks.shared.features.weights import WeightsError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.timeout(300)

CPU = RuntimeConfig(device="cpu")
BICUBIC = T.InterpolationMode.BICUBIC
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def photo(w: int, h: int, seed: int = 0) -> Image.Image:
    """A smooth random image (resampling of pure noise hides little), uint8 RGB."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(h // 8, 2), max(w // 8, 2), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.BILINEAR), dtype=np.int16)
    noise = rng.integers(-20, 21, (h, w, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def batch(model, images) -> np.ndarray:
    return np.stack([model.preprocess(im) for im in images])


IMAGES = [photo(97, 61, 1), photo(61, 97, 2), photo(80, 80, 3)]


# ---- configuration ---------------------------------------------------------------------
def test_model_ids_name_distinct_feature_spaces():
    ids = {
        ModelSpec(name="wfd").model_id,
        ModelSpec(name="sscd_disc_mixup").model_id,
        ModelSpec(name="sscd_disc_mixup", preprocessing="sscd_short288").model_id,
        ModelSpec(name="sscd_disc_large").model_id,
        ModelSpec(name="clip").model_id,
        ModelSpec(name="dinov2").model_id,
        ModelSpec(name="dinov2", preprocessing="dinov2_eval").model_id,
        ModelSpec(name="dinov2", arch="vit_small_patch14_reg4_dinov2", image_size=56).model_id,
    }
    assert ids == {"wfd", "sscd_disc_mixup", "sscd_disc_mixup_short288", "sscd_disc_large", "clip_vit_l_14",
                   "dinov2_vitl14_gpic_eval", "dinov2_vitl14_dinov2_eval", "dinov2_vits14_reg4_gpic_eval_s56"}
    assert all(re.fullmatch(r"[a-z0-9_]+", i) for i in ids)


def test_config_rejects_unknown_things_and_loads_from_yaml():
    for bad in ({"name": "resnet"}, {"name": "clip", "preprocessing": "gpic_eval"},
                {"name": "sscd_disc_mixup", "arch": "resnet18"}, {"name": "clip", "colour": "red"}):
        with pytest.raises(ValueError):
            ModelSpec(**bad)
    cfg = FeaturesConfig.model_validate(yaml.safe_load("""
        models:
          - {name: sscd_disc_mixup, weights: {uri: /w/sscd.pt, sha256: "%s"}}
          - {name: dinov2, random_init: true}
        dtype: float32
        runtime: {precision: bf16, channels_last: true}
    """ % ("ab" * 32)))
    assert [m.model_id for m in cfg.models] == ["sscd_disc_mixup", "dinov2_vitl14_gpic_eval"]
    assert cfg.runtime.precision == "bf16"
    assert FeaturesConfig.model_json_schema()["properties"]["torchscript_allowlist"]["title"]


# ---- preprocessing, pixel for pixel against the reference pipelines ---------------------
def imagenet_tensor(steps):
    return T.Compose([*steps, T.ToTensor(), T.Normalize(pp.IMAGENET_MEAN, pp.IMAGENET_STD)])


@pytest.mark.parametrize("image", IMAGES, ids=["landscape", "portrait", "square"])
def test_sscd_preprocessing_matches_the_readme_transforms(image):
    square = imagenet_tensor([T.Resize([40, 40])])(image).numpy()
    short = imagenet_tensor([T.Resize(36)])(image).numpy()
    np.testing.assert_array_equal(pp.sscd_square(image, 40), square)
    np.testing.assert_array_equal(pp.sscd_short(image, 36), short)


@pytest.mark.parametrize("image", [photo(300, 233, 4), photo(233, 300, 5)], ids=["landscape", "portrait"])
def test_dinov2_eval_matches_torchvision(image):
    ref = imagenet_tensor([T.Resize(256, BICUBIC), T.CenterCrop(224)])(image).numpy()
    np.testing.assert_array_equal(pp.dinov2_eval(image), ref)


@pytest.mark.parametrize("image", [photo(301, 260, 6), photo(260, 301, 7), photo(256, 256, 8)])
def test_gpic_eval_is_square_crop_then_pillow_bicubic_256_then_224(image):
    arr = np.asarray(image)
    h, w = arr.shape[:2]
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    img256 = Image.fromarray(arr[top:top + s, left:left + s]).resize((256, 256), Image.BICUBIC)
    np.testing.assert_array_equal(np.asarray(pp.gpic_256(image)), np.asarray(img256))
    # the GPIC evaluation port's DINOv2 transform, applied to the 256x256 image
    ref = imagenet_tensor([T.Resize((224, 224), BICUBIC)])(img256).numpy()
    np.testing.assert_array_equal(pp.gpic_eval(image), ref)


def test_center_square_crop_offsets():
    img = Image.fromarray(np.arange(5 * 8, dtype=np.uint8).reshape(5, 8))
    assert np.array_equal(np.asarray(pp.center_square_crop(img)), np.asarray(img)[:, 1:6])
    assert np.array_equal(np.asarray(pp.center_square_crop(img.transpose(Image.TRANSPOSE))),
                          np.asarray(img.transpose(Image.TRANSPOSE))[1:6, :])


@pytest.mark.parametrize("image", IMAGES[:2], ids=["landscape", "portrait"])
def test_clip_eval_matches_open_clip_transform(image):
    mean, std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    ref = open_clip.image_transform(48, is_train=False, mean=mean, std=std)(image).numpy()
    np.testing.assert_array_equal(pp.clip_eval(image, 48, mean, std), ref)


# ---- SSCD ------------------------------------------------------------------------------
class RefGeM(torch.nn.Module):
    def forward(self, x):
        return x.clamp(min=1e-6).pow(3).mean(dim=(2, 3)).pow(1 / 3)


def reference_sscd_torchvision() -> torch.nn.Module:
    """SSCD's TV_RESNET50 model as the reference code builds it: a torchvision ResNet-50
    with 512 classes whose avgpool is GeM; batch-norm statistics randomised so a key
    mapped to the wrong layer changes the output."""
    torch.manual_seed(123)
    net = torchvision.models.resnet50(num_classes=512)
    net.avgpool = RefGeM()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 2.0)
    return net.eval()


def to_classy_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SSCDNet keys -> the Classy Vision names of sscd_disc_*.classy.pt (test-side inverse)."""
    conv = {"conv1": "convolutional_block.0", "bn1": "convolutional_block.1", "conv2": "convolutional_block.3",
            "bn2": "convolutional_block.4", "conv3": "convolutional_block.6", "bn3": "bn"}
    out = {}
    for k, v in sd.items():
        if k.startswith("proj."):
            out["embeddings.1." + k[5:]] = v
        elif m := re.fullmatch(r"trunk\.(conv1|bn1)\.(.+)", k):
            out[f"backbone.initial_block._module.{0 if m[1] == 'conv1' else 1}.{m[2]}"] = v
        else:
            m = re.fullmatch(r"trunk\.layer(\d)\.(\d+)\.(conv\d|bn\d|downsample\.\d)\.(.+)", k)
            stage = int(m[1]) - 1
            out[f"backbone.blocks.{stage}.block{stage}-{m[2]}.{conv.get(m[3], m[3])}.{m[4]}"] = v
    return out


def test_sscd_random_init_shapes_norms_and_determinism():
    spec = ModelSpec(name="sscd_disc_mixup", random_init=True, image_size=64)
    a, b = build_model(spec, CPU), build_model(spec, CPU)
    x = batch(a, IMAGES)
    assert x.shape == (3, 3, 64, 64) and x.dtype == np.float32
    ya, yb = a.embed(x), b.embed(x)
    assert ya.shape == (3, 512) and ya.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ya, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(ya, yb)
    assert a.random_init and a.fingerprint()["weights"] == "random-init" and a.normalized
    assert not np.allclose(ya[0], ya[1], atol=1e-3)


def test_sscd_published_weight_layouts_reproduce_the_reference(tmp_path):
    ref = reference_sscd_torchvision()
    torch.save({f"backbone.{k}": v for k, v in ref.state_dict().items()}, tmp_path / "sscd.torchvision.pt")
    spec = ModelSpec(name="sscd_disc_mixup", image_size=64,
                     weights=WeightsSpec(uri=str(tmp_path / "sscd.torchvision.pt"),
                                         sha256=sha(tmp_path / "sscd.torchvision.pt")))
    model = build_model(spec, CPU)
    x = batch(model, IMAGES)
    with torch.no_grad():
        expected = F.normalize(ref(torch.from_numpy(x)), dim=1).numpy()
    got = model.embed(x)
    np.testing.assert_allclose(got, expected, atol=2e-5)
    assert not model.random_init and model.fingerprint()["weights"] == spec.weights.sha256

    torch.save(to_classy_keys(model.net.state_dict()), tmp_path / "sscd.classy.pt")
    classy = build_model(spec.model_copy(update={"weights": WeightsSpec(
        uri=str(tmp_path / "sscd.classy.pt"), sha256=sha(tmp_path / "sscd.classy.pt"))}), CPU)
    np.testing.assert_array_equal(classy.embed(x), got)

    class Normalized(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return F.normalize(self.net(x))

    traced = torch.jit.trace(Normalized(ref), torch.from_numpy(x[:1]))
    traced.save(str(tmp_path / "sscd.torchscript.pt"))
    ts_weights = WeightsSpec(uri=str(tmp_path / "sscd.torchscript.pt"), sha256=sha(tmp_path / "sscd.torchscript.pt"),
                             format="torchscript")
    ts_spec = spec.model_copy(update={"weights": ts_weights})
    with pytest.raises(WeightsError, match="torchscript_allowlist"):
        build_model(ts_spec, CPU)
    scripted = build_model(ts_spec, CPU, torchscript_allowlist=[ts_weights.sha256])
    np.testing.assert_allclose(scripted.embed(x), expected, atol=2e-5)


def test_sscd_runtime_precisions_and_short_side_preprocessing():
    spec = ModelSpec(name="sscd_disc_mixup", random_init=True, image_size=64)
    fp32 = build_model(spec, CPU)
    x = batch(fp32, IMAGES)
    ref = fp32.embed(x)
    for precision in ("bf16", "fp16"):
        rt = RuntimeConfig(device="cpu", precision=precision, channels_last=True)
        model = build_model(spec, rt)
        assert model.channels_last
        y = model.embed(x)
        assert y.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-5)
        assert np.min(np.sum(y * ref, axis=1)) > 0.98, precision
    short = build_model(spec.model_copy(update={"preprocessing": "sscd_short288", "image_size": 48}), CPU)
    assert not short.fixed_input and short.model_id == "sscd_disc_mixup_short288_s48"
    shapes = {short.preprocess(im).shape for im in IMAGES}
    assert shapes == {(3, 48, 76), (3, 76, 48), (3, 48, 48)}
    assert short.embed(short.preprocess(IMAGES[0])[None]).shape == (1, 512)


def test_missing_weights_is_a_clear_error():
    for name in ("sscd_disc_mixup", "clip", "dinov2"):
        with pytest.raises(MissingWeightsError, match="random_init"):
            build_model(ModelSpec(name=name), CPU)
    with pytest.raises(ValueError, match="mutually exclusive"):
        build_model(ModelSpec(name="dinov2", random_init=True,
                              weights=WeightsSpec(uri="/x.pt", sha256="0" * 64)), CPU)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            build_model(ModelSpec(**{**DINO_S, "image_size": 28}), RuntimeConfig(device="cuda"))


def test_registry_caches_one_model_per_spec_and_runtime():
    clear_cache()
    spec = ModelSpec(name="dinov2", arch="vit_small_patch14_dinov2", random_init=True, image_size=28)
    first = load_model(spec, CPU)
    assert load_model(ModelSpec(**spec.model_dump()), RuntimeConfig(device="cpu")) is first
    assert load_model(spec, RuntimeConfig(device="cpu", precision="bf16")) is not first
    clear_cache()
    assert load_model(spec, CPU) is not first
    clear_cache()


# ---- CLIP ------------------------------------------------------------------------------
def test_clip_image_embeddings():
    spec = ModelSpec(name="clip", arch="ViT-B-32", random_init=True, image_size=64)
    a, b = build_model(spec, CPU), build_model(spec, CPU)
    x = batch(a, IMAGES)
    assert x.shape == (3, 3, 64, 64)
    ref_tf = image_transform_v2(PreprocessCfg(**a.net.clip.visual.preprocess_cfg), is_train=False)
    np.testing.assert_array_equal(x[0], ref_tf(IMAGES[0]).numpy())
    ya = a.embed(x)
    assert ya.shape == (3, 512) and a.dim == 512 and a.model_id == "clip_vit_b_32_s64"
    np.testing.assert_allclose(np.linalg.norm(ya, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(ya, b.embed(x))
    with torch.no_grad():
        direct = F.normalize(a.net.clip.encode_image(torch.from_numpy(x)), dim=1).numpy()
    np.testing.assert_allclose(ya, direct, atol=1e-6)


def test_clip_weights_round_trip(tmp_path):
    spec = ModelSpec(name="clip", arch="ViT-S-32", random_init=True, image_size=64)
    source = build_model(spec, CPU)
    torch.manual_seed(7)  # weights that differ from the fixed random-init seed
    sd = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
          for k, v in source.net.clip.state_dict().items()}
    save_file(sd, str(tmp_path / "open_clip_model.safetensors"))
    weights = WeightsSpec(uri=str(tmp_path / "open_clip_model.safetensors"),
                          sha256=sha(tmp_path / "open_clip_model.safetensors"))
    loaded = build_model(ModelSpec(name="clip", arch="ViT-S-32", image_size=64, weights=weights), CPU)
    source.net.clip.load_state_dict(sd)
    x = batch(loaded, IMAGES[:2])
    np.testing.assert_array_equal(loaded.embed(x), source.embed(x))
    assert not loaded.random_init
    with pytest.raises(WeightsError, match="does not match"):
        build_model(ModelSpec(name="clip", arch="ViT-S-32", image_size=64,
                              weights=weights.model_copy(update={"sha256": "3" * 64})), CPU)


# ---- DINOv2 ----------------------------------------------------------------------------
DINO_S = dict(name="dinov2", arch="vit_small_patch14_dinov2", random_init=True, image_size=56)


def test_dinov2_cls_features_raw_for_gpic_and_unit_for_dedup():
    stats, dedup = build_model(ModelSpec(**DINO_S), CPU), build_model(ModelSpec(**DINO_S, preprocessing="dinov2_eval"), CPU)
    x = batch(stats, IMAGES)
    assert x.shape == (3, 3, 56, 56)
    raw = stats.embed(x)
    assert raw.shape == (3, 384) and stats.dim == 384 and not stats.normalized
    assert stats.fingerprint()["normalized"] is False
    np.testing.assert_array_equal(raw, stats.forward_raw(x).cpu().numpy())
    assert np.all(np.abs(np.linalg.norm(raw, axis=1) - 1) > 0.1)
    with torch.no_grad():
        tokens = stats.net.forward_features(torch.from_numpy(x))
    np.testing.assert_allclose(raw, tokens[:, 0].numpy(), atol=1e-6)  # pooled output is the normed CLS token
    xd = batch(dedup, IMAGES)
    unit = dedup.embed(xd)
    assert dedup.normalized
    np.testing.assert_allclose(unit, pp_l2(dedup.forward_raw(xd).cpu().numpy()), atol=1e-6)
    np.testing.assert_array_equal(unit, build_model(ModelSpec(**DINO_S, preprocessing="dinov2_eval"), CPU).embed(xd))


def pp_l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def cubic_weights(t: float, a: float = -0.75) -> np.ndarray:
    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.array([far(t + 1), near(t), near(1 - t), far(2 - t)])


def bicubic_by_scale(img: np.ndarray, out: int, scale: float) -> np.ndarray:
    """Brute-force reference: PyTorch-convention bicubic (A = -0.75, half-pixel centres,
    source step 1/scale, edge-clamped taps), separable, float64. img: [M, M, D]."""
    m = img.shape[0]

    def matrix():
        w = np.zeros((out, m))
        for i in range(out):
            src = (i + 0.5) / scale - 0.5
            base = int(np.floor(src))
            for tap, wt in zip(range(base - 1, base + 3), cubic_weights(src - base), strict=True):
                w[i, min(max(tap, 0), m - 1)] += wt
        return w

    w = matrix()
    return np.einsum("ij,jkd,lk->ild", w, img.astype(np.float64), w)


def test_position_resampling_matches_dinov2_hub_formula():
    rng = np.random.default_rng(0)
    pos = rng.standard_normal((1, 7 * 7, 5)).astype(np.float32)
    got = resample_patch_pos(torch.from_numpy(pos), 4, registers=False).numpy().reshape(4, 4, 5)
    expected = bicubic_by_scale(pos.reshape(7, 7, 5), 4, (4 + 0.1) / 7)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    size_based = bicubic_by_scale(pos.reshape(7, 7, 5), 4, 4 / 7)
    assert not np.allclose(got, size_based, atol=1e-3)  # the +0.1 offset matters
    same = torch.from_numpy(pos)
    assert resample_patch_pos(same, 7, registers=True) is same
    assert resample_patch_pos(same, 4, registers=True).shape == (1, 16, 5)


def perturbed(sd: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in sd.items()}


def test_dinov2_timm_and_original_weight_layouts(tmp_path):
    source = build_model(ModelSpec(**DINO_S), CPU)
    sd = perturbed(source.net.state_dict(), 1)
    source.net.load_state_dict(sd)
    x = batch(source, IMAGES)
    expected = source.embed(x)

    save_file(sd, str(tmp_path / "model.safetensors"))
    original = {**sd, "mask_token": torch.zeros(1, 384)}
    torch.save(original, tmp_path / "dinov2_vits14_pretrain.pth")
    for name in ("model.safetensors", "dinov2_vits14_pretrain.pth"):
        spec = ModelSpec(**{**DINO_S, "random_init": False},
                         weights=WeightsSpec(uri=str(tmp_path / name), sha256=sha(tmp_path / name)))
        np.testing.assert_array_equal(build_model(spec, CPU).embed(x), expected)

    # a checkpoint for a larger grid (like 518 px -> 37x37) is resampled the hub's way
    big = build_model(ModelSpec(**{**DINO_S, "image_size": 98}), CPU)
    big_sd = perturbed(big.net.state_dict(), 2)
    torch.save(big_sd, tmp_path / "grid7.pth")
    spec = ModelSpec(**{**DINO_S, "random_init": False},
                     weights=WeightsSpec(uri=str(tmp_path / "grid7.pth"), sha256=sha(tmp_path / "grid7.pth")))
    loaded = build_model(spec, CPU).net.pos_embed.detach()
    assert torch.equal(loaded[:, :1], big_sd["pos_embed"][:, :1])
    expected_pos = bicubic_by_scale(big_sd["pos_embed"][0, 1:].numpy().reshape(7, 7, 384), 4, 4.1 / 7)
    np.testing.assert_allclose(loaded[0, 1:].numpy().reshape(4, 4, 384), expected_pos, atol=1e-5)


def test_dinov2_register_model_from_original_layout(tmp_path):
    spec = ModelSpec(**{**DINO_S, "arch": "vit_small_patch14_reg4_dinov2"})
    source = build_model(spec, CPU)
    sd = perturbed(source.net.state_dict(), 3)
    source.net.load_state_dict(sd)
    x = batch(source, IMAGES)
    # DINOv2's layout: a CLS position inside pos_embed, registers without positions
    cls_pos = 0.1 * torch.randn(1, 1, 384, generator=torch.Generator().manual_seed(4))
    original = {k: v for k, v in sd.items() if k not in ("reg_token", "cls_token", "pos_embed")}
    original.update(register_tokens=sd["reg_token"], cls_token=sd["cls_token"] - cls_pos,
                    pos_embed=torch.cat([cls_pos, sd["pos_embed"]], dim=1), mask_token=torch.zeros(1, 384))
    torch.save(original, tmp_path / "reg.pth")
    loaded = build_model(spec.model_copy(update={"random_init": False, "weights": WeightsSpec(
        uri=str(tmp_path / "reg.pth"), sha256=sha(tmp_path / "reg.pth"))}), CPU)
    np.testing.assert_allclose(loaded.embed(x), source.embed(x), atol=1e-5)


# ---- the default (large) variants --------------------------------------------------------
@pytest.mark.slow
def test_default_large_variants_build():
    for spec, dim in ((ModelSpec(name="sscd_disc_large", random_init=True, image_size=64), 1024),
                      (ModelSpec(name="clip", random_init=True, image_size=28), 768),
                      (ModelSpec(name="dinov2", random_init=True, image_size=28), 1024)):
        model = build_model(spec, CPU)
        y = model.embed(batch(model, IMAGES[:1]))
        assert y.shape == (1, dim) and model.dim == dim
        del model


@pytest.mark.gpu
@needs_cuda
def test_cuda_bf16_matches_cpu_fp32():
    for spec in (ModelSpec(name="sscd_disc_mixup", random_init=True, image_size=128), ModelSpec(**DINO_S)):
        cpu = build_model(spec, CPU)
        gpu = build_model(spec, RuntimeConfig(device="cuda", precision="bf16", channels_last=True))
        x = batch(cpu, IMAGES)
        a, b = pp_l2(cpu.embed(x)), pp_l2(gpu.embed(x))
        assert np.min(np.sum(a * b, axis=1)) > 0.98


@pytest.mark.parametrize("arch", ["vit_small_patch14_dinov2"])
def test_features_are_the_same_bytes_whatever_torch_threads_the_process_had(arch):
    """A Dask worker process runs torch on one thread, a thread-run flow on every core, and
    MKL uses fewer on a loaded machine: the features (and every score made from them) must
    not follow. Unset ``torch_threads`` means one thread on CPU."""
    spec = ModelSpec(name="dinov2", arch=arch, image_size=56, random_init=True)
    batch = np.random.default_rng(0).standard_normal((6, 3, 56, 56)).astype(np.float32)
    before = torch.get_num_threads()
    features = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            features.append(build_model(spec, RuntimeConfig()).embed(batch))
    finally:
        torch.set_num_threads(before)
    assert features[0].tobytes() == features[1].tobytes()
