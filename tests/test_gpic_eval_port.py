"""The ``gpic_eval_port`` evaluation mode and gpic-eval's ``test_stats.npz`` (issue 13, items 5, 6).

Preprocessing is compared with torchvision on a PIL image, pixel for pixel; FD, PRDC and
MMD on fixed features with straightforward re-implementations of the port's conventions
(GPIC_FORMAT.md), given the same seeds and subsamples."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import scipy.linalg
from PIL import Image
from torchvision import transforms as T

from tasks.shared.features import preprocess as pp
from tasks.stats.compare import compare
from tasks.stats.config import MetricsConfig
from tasks.stats.evaluate import (
    ChunkFeatures,
    Reference,
    evaluate_features,
    load_reference,
    render_report,
)
from tasks.stats.fd import frechet_distance
from tasks.stats.gpic_stats import GPIC_KEYS, gpic_stats_bytes
from tasks.stats.mmd import mmd
from tasks.stats.moments import Moments
from tasks.stats.prdc import prdc


def photo(w: int, h: int, seed: int = 0) -> Image.Image:
    """A smooth-ish non-square RGB image (random noise would hide resampling differences)."""
    rng = np.random.default_rng(seed)
    small = (rng.random((h // 10 + 1, w // 10 + 1, 3)) * 255).astype("uint8")
    return Image.fromarray(small).resize((w, h), Image.BILINEAR)


def test_port_preprocessing_equals_torchvision_squash_exactly():
    image = photo(500, 300)
    reference = T.Compose([T.Resize((224, 224), interpolation=T.InterpolationMode.BICUBIC), T.ToTensor(),
                           T.Normalize(pp.IMAGENET_MEAN, pp.IMAGENET_STD)])(image)
    ours = pp.gpic_eval_port(image)
    assert ours.dtype == np.float32 and ours.shape == (3, 224, 224)
    assert np.array_equal(ours, reference.numpy())


def test_the_two_modes_differ_on_non_square_images_and_agree_on_gpic_images():
    wide = photo(500, 300)
    diff = np.abs(pp.gpic_eval(wide) - pp.gpic_eval_port(wide)).mean()
    assert diff > 0.3  # the App. B.1 crop drops 40 % of a 500×300 image; the port squashes it
    square = photo(256, 256, seed=1)  # GPIC's released images: 256×256, both modes are one bicubic step
    assert np.array_equal(pp.gpic_eval(square), pp.gpic_eval_port(square))


def reference_fd(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """The port's FD, written out: float64 moments, sqrtm with the 1e-6 fallback."""
    mu1, mu2 = x.mean(0), y.mean(0)
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2)
    if not np.isfinite(covmean).all():
        off = np.eye(s1.shape[0]) * 1e-6
        covmean = scipy.linalg.sqrtm((s1 + off) @ (s2 + off))
    covmean = covmean.real
    fd_mu = float(((mu1 - mu2) ** 2).sum())
    fd_sigma = float(np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))
    return fd_mu + fd_sigma, fd_mu, fd_sigma


def reference_prdc(real: np.ndarray, fake: np.ndarray, k: int = 5) -> dict[str, float]:
    """clovaai/prdc written out: full Euclidean distance matrices, k-th neighbour radii."""
    def dist(a, b):
        return np.sqrt(np.maximum((a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T, 0))

    r_real = np.sort(dist(real, real), axis=1)[:, k]
    r_fake = np.sort(dist(fake, fake), axis=1)[:, k]
    d = dist(real, fake)
    return {"precision": float((d < r_real[:, None]).any(0).mean()),
            "recall": float((d < r_fake[None, :]).any(1).mean()),
            "density": float((d < r_real[:, None]).sum(0).mean() / k),
            "coverage": float((d.min(1) < r_real).mean())}


def reference_mmd(real: np.ndarray, fake: np.ndarray, subsets: int, size: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    d = real.shape[1]
    values = []
    for _ in range(subsets):
        x = real[rng.choice(len(real), size, replace=False)]
        y = fake[rng.choice(len(fake), size, replace=False)]
        kxx, kyy, kxy = ((a @ b.T / d + 1) ** 3 for a, b in ((x, x), (y, y), (x, y)))
        values.append((kxx.sum() - np.trace(kxx)) / (size * (size - 1))
                      + (kyy.sum() - np.trace(kyy)) / (size * (size - 1)) - 2 * kxy.sum() / size**2)
    return float(np.mean(values))


@pytest.fixture(scope="module")
def features():
    rng = np.random.default_rng(7)
    real = rng.normal(size=(700, 24))
    fake = rng.normal(0.2, 1.1, size=(650, 24))
    return real, fake


def test_fd_equals_the_port(features):
    real, fake = features
    a, b = Moments.of(fake), Moments.of(real)
    ours = frechet_distance(a.mean, a.covariance(), b.mean, b.covariance())
    fd, fd_mu, fd_sigma = reference_fd(fake, real)
    assert abs(ours.fd - fd) < 1e-6 and abs(ours.fd_mu - fd_mu) < 1e-6 and abs(ours.fd_sigma - fd_sigma) < 1e-6


def test_prdc_and_mmd_equal_the_port_given_the_same_subsamples(features):
    real, fake = features
    cfg = MetricsConfig(prdc_max_samples=500, mmd_subsets=10, mmd_subset_size=100, seed=3)
    rng = np.random.default_rng(cfg.seed)  # the subsample compare() draws: reference first, then generated
    real_sub = real[np.sort(rng.choice(len(real), 500, replace=False))]
    fake_sub = fake[np.sort(rng.choice(len(fake), 500, replace=False))]
    expected = reference_prdc(real_sub, fake_sub)
    p = prdc(real_sub, fake_sub, k=5)
    assert {k: getattr(p, k) for k in expected} == expected
    a, b = Moments.of(fake), Moments.of(real)
    out = compare(a.mean, a.covariance(), fake, b.mean, b.covariance(), real, cfg)
    assert {k: out[k] for k in expected} == expected
    assert abs(out["mmd2"] - reference_mmd(real, fake, 10, 100, 3)) < 1e-9
    assert abs(mmd(real, fake, n_subsets=10, subset_size=100, seed=3).mmd2 - out["mmd2"]) == 0


def gpic_file(tmp_path, n_rows: int, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n_rows, dim)).astype(np.float32)
    path = tmp_path / "test_stats.npz"
    np.savez(path, dino_mu=emb.mean(0).astype(np.float64), dino_sigma=np.cov(emb, rowvar=False),
             dino_embeddings=emb)
    return path, emb


def test_evaluate_names_the_mode_and_says_what_a_gpic_file_cannot_prove(tmp_path):
    path, _ = gpic_file(tmp_path, 300)
    reference = load_reference(str(path))
    assert reference.provenance is None and reference.n == 300
    fake = np.random.default_rng(1).normal(size=(200, 8)).astype(np.float32)
    identity = {"model_id": "dinov2_vitl14_gpic_eval_port", "arch": "vit_large_patch14_dinov2",
                "preprocessing": "gpic_eval_port", "random_init": True}
    cfg = MetricsConfig(prdc_max_samples=150, mmd_subsets=5, mmd_subset_size=50)
    result = evaluate_features([ChunkFeatures([f"g{i}" for i in range(200)], fake, {}, identity)], reference, cfg,
                               mode="gpic_eval_port")
    assert result["protocol"]["mode"] == "gpic_eval_port"
    assert result["protocol"]["seeds"] == {"prdc_subsample": 0, "mmd_subsets": 0}
    checks = result["reference"]["checks"]
    assert any("cannot" in c for c in checks["cannot_check"]) and checks["checked"]
    assert any("300 reference samples" in d and "50,000" in d for d in result["protocol"]["deviations"])
    assert "gpic_eval_port" in render_report(result)


def test_gpic_stats_written_here_load_with_gpic_keys_and_are_verified(tmp_path):
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(60, 8))
    mu, sigma = feats.mean(0), np.cov(feats, rowvar=False)
    data = gpic_stats_bytes(mu, sigma, feats[:40].astype(np.float32))
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted(GPIC_KEYS)
        assert npz["dino_mu"].shape == (8,) and npz["dino_sigma"].shape == (8, 8)
        assert npz["dino_embeddings"].shape == (40, 8) and npz["dino_embeddings"].dtype == np.float32
    (tmp_path / "test_stats.npz").write_bytes(data)
    sidecar = {"n": 60, "model": {"model_id": "m"}, "protocol_deviations": [],
               "files": {"gpic_npz": {"path": "stats/test_stats.npz",
                                      "sha256": __import__("hashlib").sha256(data).hexdigest()}}}
    (tmp_path / "test-m.json").write_text(json.dumps(sidecar))
    reference = load_reference(str(tmp_path / "test_stats.npz"))
    assert reference.provenance == sidecar and reference.n == 60
    assert isinstance(reference, Reference) and reference.features.shape == (40, 8)


def test_evaluate_config_mode_picks_the_preprocessing():
    from pydantic import ValidationError

    from flows.evaluate import EvaluateConfig

    base = {"generated": ["gen/"], "reference": "test_stats.npz", "out": "o"}
    assert EvaluateConfig(**base).model.resolved_preprocessing == "gpic_eval"
    port = EvaluateConfig(**base, protocol="gpic_eval_port")
    assert port.model.resolved_preprocessing == "gpic_eval_port" and port.model.model_id.endswith("gpic_eval_port")
    with pytest.raises(ValidationError, match="uses preprocessing 'gpic_eval_port'"):
        EvaluateConfig(**base, protocol="gpic_eval_port", model={"name": "dinov2", "preprocessing": "gpic_eval"})
