"""Image preprocessing as plain PIL/numpy functions, testable pixel for pixel.

Each named preprocessing reproduces its reference exactly (the tests compare them with
the torchvision/open_clip pipelines they stand for): all resampling is done by Pillow on
uint8 images, as torchvision does for PIL inputs, and the float conversion follows
``ToTensor`` + ``Normalize`` in float32.

* ``sscd_square320`` / ``sscd_short288``: the SSCD README's ``Resize([320, 320])`` and
  ``Resize(288)`` (torchvision's default, bilinear) + ImageNet normalisation.
* ``clip_eval``: open_clip's eval transform: short side to the input size (bicubic),
  centre crop, the model's mean/std.
* ``dinov2_eval``: DINOv2's linear-eval transform: short side to 256 (bicubic), centre
  crop 224, ImageNet normalisation.
* ``gpic_eval``: GPIC App. B.1 + its evaluation port: centre crop along the longer side
  to a square, Pillow bicubic to 256x256, then ``Resize((224, 224))`` bicubic and
  ImageNet normalisation (on released GPIC images, already 256x256, only the last step
  changes pixels).
* ``gpic_eval_port``: GPIC's evaluation port exactly (GPIC_FORMAT.md): the whole image
  squashed to 224x224 by torchvision ``Resize((224, 224))`` bicubic (no crop, aspect not
  kept), ImageNet normalisation. Equal to ``gpic_eval`` on square images of 256x256
  (GPIC's own), different on any other: on a 500x300 image the inputs differ by ~0.7 in
  normalised units on average (the crop drops 40 % of the picture).
* ``inception_299``: the optional Inception-v3 statistics model's input: ``gpic_eval_port``'s
  steps at 299x299 (why bicubic, and ``transform_input``: ``inception.py``).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def center_square_crop(image: Image.Image) -> Image.Image:
    """Crop the longer side to the shorter one, centred (offset rounded down)."""
    w, h = image.size
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    return image if (w, h) == (s, s) else image.crop((left, top, left + s, top + s))


def resize_short_side(image: Image.Image, size: int, resample: int) -> Image.Image:
    """Short side to ``size``, long side scaled and truncated, like torchvision ``Resize(int)``."""
    w, h = image.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    new_w, new_h = (size, new_long) if w <= h else (new_long, size)
    return image if (new_w, new_h) == (w, h) else image.resize((new_w, new_h), resample)


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """A centred ``size`` x ``size`` crop with torchvision ``CenterCrop``'s rounding."""
    w, h = image.size
    left = int(round((w - size) / 2.0))
    top = int(round((h - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


def to_chw_float(image: Image.Image, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """uint8 RGB image -> normalised float32 CHW array (``ToTensor`` then ``Normalize``)."""
    x = np.asarray(image.convert("RGB"), dtype=np.uint8).astype(np.float32) / np.float32(255)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def sscd_square(image: Image.Image, size: int = 320) -> np.ndarray:
    """SSCD batch preprocessing: skew to a square (copy detection tolerates it)."""
    return to_chw_float(image.resize((size, size), Image.BILINEAR), IMAGENET_MEAN, IMAGENET_STD)


def sscd_short(image: Image.Image, size: int = 288) -> np.ndarray:
    """SSCD single-image preprocessing: short side to ``size``, aspect kept (variable shape)."""
    return to_chw_float(resize_short_side(image, size, Image.BILINEAR), IMAGENET_MEAN, IMAGENET_STD)


def clip_eval(image: Image.Image, size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    return to_chw_float(center_crop(resize_short_side(image, size, Image.BICUBIC), size), mean, std)


def dinov2_eval(image: Image.Image, size: int = 224) -> np.ndarray:
    resized = resize_short_side(image, int(round(size * 256 / 224)), Image.BICUBIC)
    return to_chw_float(center_crop(resized, size), IMAGENET_MEAN, IMAGENET_STD)


def gpic_256(image: Image.Image) -> Image.Image:
    """GPIC's 256x256 image: centre square crop, Pillow bicubic."""
    square = center_square_crop(image)
    return square if square.size == (256, 256) else square.resize((256, 256), Image.BICUBIC)


def gpic_eval(image: Image.Image, size: int = 224) -> np.ndarray:
    resized = gpic_256(image).resize((size, size), Image.BICUBIC)
    return to_chw_float(resized, IMAGENET_MEAN, IMAGENET_STD)


def gpic_eval_port(image: Image.Image, size: int = 224) -> np.ndarray:
    """torchvision ``Resize((size, size), BICUBIC)`` on a PIL image is Pillow's bicubic
    ``resize`` of the whole image; then ``ToTensor`` + ``Normalize``."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    resized = rgb if rgb.size == (size, size) else rgb.resize((size, size), Image.BICUBIC)
    return to_chw_float(resized, IMAGENET_MEAN, IMAGENET_STD)


def inception_299(image: Image.Image, size: int = 299) -> np.ndarray:
    """Whole image to ``size`` x ``size`` (Pillow bicubic on uint8), ImageNet mean/std: the
    steps of :func:`gpic_eval_port` at Inception's input size."""
    return gpic_eval_port(image, size)
