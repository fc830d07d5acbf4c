"""The weight-free descriptor: shape, unit norm, determinism, and real invariances.

Invariances are checked on photographs shipped with scikit-image (no download), edited
the way copies are edited on the web; each edited copy must be closer to its original
than to any other photograph. The sample-corpus test measures recall@1 of every planted
near-duplicate against all unrelated images.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import skimage.data
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageOps
from scipy.fft import dctn

from tasks.features.config import ModelSpec
from tasks.features.wfd import ALPHA, K, PREPROCESSING, REGIONS, WeightFreeDescriptor, build

pytestmark = pytest.mark.timeout(120)

PHOTOS = ("astronaut", "camera", "coffee", "chelsea", "rocket", "coins", "moon", "clock", "page", "hubble_deep_field",
          "immunohistochemistry", "retina")


def _photo(name: str, side: int = 192) -> Image.Image:
    array = getattr(skimage.data, name)()
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    image = Image.fromarray(np.asarray(array[..., :3], dtype=np.uint8))
    image.thumbnail((side, side), Image.Resampling.LANCZOS)
    return image


@pytest.fixture(scope="module")
def photos() -> dict[str, Image.Image]:
    return {name: _photo(name) for name in PHOTOS}


@pytest.fixture(scope="module")
def wfd() -> WeightFreeDescriptor:
    return WeightFreeDescriptor()


def _embed(model: WeightFreeDescriptor, images: list[Image.Image]) -> np.ndarray:
    return model.embed(np.stack([model.preprocess(im) for im in images]))


def _jpeg(image: Image.Image, quality: int) -> Image.Image:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def _crop(image: Image.Image, keep: float, anchor: tuple[float, float]) -> Image.Image:
    w, h = image.size
    cw, ch = round(w * keep), round(h * keep)
    x, y = round((w - cw) * anchor[0]), round((h - ch) * anchor[1])
    return image.crop((x, y, x + cw, y + ch))


def _caption(image: Image.Image) -> Image.Image:
    out = image.copy()
    draw = ImageDraw.Draw(out)
    w, h = out.size
    draw.rectangle((0, int(h * 0.88), w, h), fill=(0, 0, 0))
    draw.text((4, int(h * 0.89)), "a caption burnt into the image", fill=(255, 255, 255))
    return out


def _watermark(image: Image.Image) -> Image.Image:
    base = image.convert("RGBA")
    layer = Image.new("RGBA", base.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for i in range(3):
        draw.text((10, 20 + 50 * i), "(c) WATERMARK", fill=(255, 255, 255, 120))
    return Image.alpha_composite(base, layer).convert("RGB")


EDITS = {
    "resize": lambda im: im.resize((im.width // 2, im.height // 2), Image.Resampling.BICUBIC),
    "jpeg_q20": lambda im: _jpeg(im, 20),
    "crop_10pct_centre": lambda im: _crop(im, 0.9, (0.5, 0.5)),
    "crop_25pct_area_corner": lambda im: _crop(im, 0.87, (0.0, 0.0)),
    "brightness_up": lambda im: ImageEnhance.Brightness(im).enhance(1.3),
    "brightness_down": lambda im: ImageEnhance.Brightness(im).enhance(0.7),
    "contrast": lambda im: ImageEnhance.Contrast(im).enhance(0.7),
    "hflip": ImageOps.mirror,
    "greyscale": lambda im: im.convert("L").convert("RGB"),
    "caption_bar": _caption,
    "watermark": _watermark,
    "blur": lambda im: im.filter(ImageFilter.GaussianBlur(1.5)),
    "rotate_4deg": lambda im: im.rotate(4, resample=Image.Resampling.BICUBIC),
}


def test_shape_dtype_norm(wfd, photos):
    x = np.stack([wfd.preprocess(im) for im in photos.values()])
    assert x.dtype == np.float32 and x.shape == (len(photos), len(REGIONS), 32, 32)
    out = wfd.embed(x)
    assert out.dtype == np.float32 and out.shape == (len(photos), wfd.dim)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert wfd.dim == 496 + 528  # upper triangles of the 31 even and 32 odd coefficients


def test_flat_image_gives_zero_row_not_nan(wfd):
    out = _embed(wfd, [Image.new("RGB", (50, 40), (200, 10, 10))])
    assert np.all(np.isfinite(out)) and np.allclose(out, 0.0)


def test_deterministic_and_batch_independent(wfd, photos):
    images = list(photos.values())
    a = _embed(wfd, images)
    b = _embed(WeightFreeDescriptor(), images)
    singles = np.concatenate([_embed(wfd, [im]) for im in images])
    assert a.tobytes() == b.tobytes() == singles.tobytes()


def _lowfreq(thumb: np.ndarray) -> np.ndarray:
    """Reference: weighted low-frequency DCT block of one thumbnail, DC removed, unit norm."""
    c = dctn(thumb.astype(np.float64), norm="ortho")[:K, :K]
    u = np.arange(K)
    r = np.hypot(u[:, None], u[None, :])
    c = c * np.where(r > 0, r, 1.0) ** ALPHA
    c[0, 0] = 0.0
    return c / np.linalg.norm(c)


def test_kernel_is_the_flip_symmetrised_squared_cosine(wfd, photos):
    """One region: the feature map's dot product equals its definition computed directly,
    with the flip done on pixels rather than on coefficients."""
    ta, tb = wfd.preprocess(photos["astronaut"])[0], wfd.preprocess(photos["coffee"])[0]

    def kernel(x: np.ndarray, y: np.ndarray) -> float:
        fx, fy, fy_flip = _lowfreq(x), _lowfreq(y), _lowfreq(y[:, ::-1])
        return (np.sum(fx * fy) ** 2 + np.sum(fx * fy_flip) ** 2) / 2

    expected = kernel(ta, tb) / np.sqrt(kernel(ta, ta) * kernel(tb, tb))
    fa, fb = wfd.embed(ta[None, None]), wfd.embed(tb[None, None])
    assert np.isclose(float(fa[0] @ fb[0]), expected, atol=1e-6)
    flipped = wfd.embed(np.ascontiguousarray(tb[:, ::-1])[None, None])
    np.testing.assert_allclose(flipped, fb, atol=1e-6)


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edited_copy_is_closer_than_any_other_photo(wfd, photos, edit):
    names = list(photos)
    originals = _embed(wfd, [photos[n] for n in names])
    copies = _embed(wfd, [EDITS[edit](photos[n]) for n in names])
    sims = copies @ originals.T
    own = np.diag(sims).copy()
    np.fill_diagonal(sims, -np.inf)
    assert np.all(own > sims.max(axis=1)), dict(zip(names, np.round(own - sims.max(axis=1), 3)))


@pytest.mark.parametrize("edit", ["resize", "jpeg_q20", "brightness_up", "brightness_down", "contrast",
                                  "hflip", "greyscale", "blur"])
def test_light_edits_clear_the_gpic_operating_threshold(wfd, photos, edit):
    originals = _embed(wfd, list(photos.values()))
    copies = _embed(wfd, [EDITS[edit](im) for im in photos.values()])
    assert np.min(np.sum(originals * copies, axis=1)) > 0.95


def test_build_from_spec():
    model = build(ModelSpec(name="wfd", image_size=16))
    assert model.model_id == "wfd_s16" and model.thumb == 16
    assert build(ModelSpec(name="wfd")).fingerprint()["preprocessing"] == PREPROCESSING
    with pytest.raises(ValueError):
        build(ModelSpec(name="wfd", preprocessing="something_else"))
