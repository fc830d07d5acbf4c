"""Real photographs shipped inside scikit-image, each used once as an original.

Procedural scenes are easy to tell apart; real photographs give the feature extractors
and the near-duplicate search natural image statistics to work on. Only images that are
part of the scikit-image wheel are used (no download). Their captions are written by hand
from what is visible, and avoid left/right so they stay true for mirrored copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import skimage.data
from PIL import Image


@dataclass(frozen=True)
class Photo:
    name: str                  # scikit-image loader name
    size: tuple[int, int]      # source width, height
    is_colour: bool
    tags: tuple[str, ...]
    sentences: tuple[str, ...]  # most important first; a short caption uses the first


PHOTOS: tuple[Photo, ...] = (
    Photo("astronaut", (512, 512), True,
          ("astronaut", "orange flight suit", "smiling woman", "American flag", "space shuttle model",
           "helmet", "portrait"),
          ("A smiling astronaut in an orange flight suit poses for an official portrait.",
           "She has short, curly brown hair and round mission patches on the chest of her suit.",
           "A round helmet with a dark, shiny visor rests beside her.",
           "An American flag hangs behind her, next to a white model of a space shuttle.",
           "The backdrop is a soft, mottled grey.")),
    Photo("coffee", (600, 400), True,
          ("coffee cup", "espresso", "red saucer", "spoon", "wooden table", "cafe"),
          ("A cup of espresso sits on a red saucer on a wooden table.",
           "The cup is red on the outside and white inside, filled with coffee under a light crema.",
           "A small silver spoon rests on the saucer next to the cup.",
           "The wooden table has a warm brown grain.",
           "The background is dark and out of focus.")),
    Photo("chelsea", (451, 300), True,
          ("tabby cat", "cat face", "green eyes", "whiskers", "close-up", "pet"),
          ("A close-up of a tabby cat's face looking straight at the camera.",
           "The cat has striped brown and grey fur, pale green eyes and a pink nose.",
           "Long white whiskers spread out from its muzzle.",
           "The top of its head is cut off by the edge of the picture.",
           "The background is soft and blurry.")),
    Photo("rocket", (640, 427), True,
          ("rocket", "launch pad", "towers", "floodlights", "dusk", "blue sky"),
          ("A white rocket stands on a launch pad at dusk.",
           "Tall metal lattice towers and thin masts rise around it.",
           "Bright floodlights glow along the ground at the base of the pad.",
           "The sky is a deep, even blue.",
           "The rocket is small compared with the towers around it.")),
    Photo("camera", (512, 512), False,
          ("cameraman", "tripod", "camera", "grass field", "black and white"),
          ("A black-and-white photo of a man looking through a camera on a tripod.",
           "He wears a dark coat and stands on a wide, grassy field.",
           "The camera sits on a tall, three-legged stand.",
           "Low buildings and a tall tower are visible in the distance.",
           "The sky is pale and cloudless.")),
    Photo("coins", (384, 303), False,
          ("coins", "ancient coins", "rows", "dark background", "black and white"),
          ("Rows of old coins are laid out on a dark background.",
           "The coins are silver-grey and have faces and figures stamped on them.",
           "They are arranged in four rows and are slightly different sizes.",
           "Each coin has a worn, textured surface.",
           "The black-and-white photo shows the coins from above.")),
    Photo("moon", (512, 512), False,
          ("moon surface", "craters", "grey", "close-up", "black and white"),
          ("A grey close-up of the surface of the moon.",
           "Small craters and bumps dot the smooth ground.",
           "A dark, shadowed patch stretches down through the middle.",
           "A round crater stands out near the top.",
           "The picture is in black and white.")),
    Photo("hubble_deep_field", (1000, 872), True,
          ("galaxies", "deep space", "stars", "black sky", "astronomy"),
          ("A deep-space view filled with hundreds of tiny galaxies.",
           "The galaxies glow white, orange, red and blue against a black sky.",
           "Some are small dots, while others show spiral or oval shapes.",
           "A few bright stars show spiky points of light.",
           "The black background makes the colourful points stand out.")),
    Photo("retina", (1411, 1411), True,
          ("retina", "eye", "blood vessels", "medical image", "orange"),
          ("A photo of the back of a human eye, showing the retina.",
           "The round image is orange and red against a black background.",
           "Dark red blood vessels branch out across the surface.",
           "A bright yellow spot marks where the vessels meet.",
           "A darker spot sits near the centre of the circle.")),
    Photo("immunohistochemistry", (512, 512), True,
          ("microscope image", "stained tissue", "cells", "brown", "blue nuclei"),
          ("A microscope image of stained tissue.",
           "Brown-stained bands of cells form curved, finger-like shapes.",
           "Small blue nuclei are scattered through the pale background.",
           "The tissue between the brown structures looks soft and fibrous.",
           "The colours are mostly brown, white and light blue.")),
    Photo("grass", (512, 512), False,
          ("grass", "texture", "close-up", "black and white"),
          ("A black-and-white close-up of a patch of grass.",
           "Thin blades of grass cross over each other in all directions.",
           "The texture fills the whole frame.",
           "Light and shadow create a busy, tangled pattern.",
           "There is no sky or horizon in view.")),
    Photo("gravel", (512, 512), False,
          ("gravel", "stones", "texture", "black and white"),
          ("A black-and-white close-up of gravel.",
           "Small, angular stones cover the whole picture.",
           "Each stone has light edges and dark gaps around it.",
           "The pebbles are packed closely together.",
           "The view looks straight down at the ground.")),
    Photo("brick", (512, 512), False,
          ("bricks", "pavement", "pattern", "texture", "black and white"),
          ("A black-and-white view of a brick pavement.",
           "Long, narrow grey bricks are laid in tidy rows.",
           "Light mortar lines separate each brick.",
           "The pattern continues to the edges of the frame.",
           "The surface is seen at a slight angle, so the rows look slanted.")),
    Photo("clock", (400, 300), False,
          ("clock", "motion blur", "grey", "black and white"),
          ("A blurry black-and-white photo of a round clock.",
           "The clock face is a pale circle in the middle of the frame.",
           "Motion blur smears the details of the clock into streaks.",
           "The background is a plain, smooth grey.",
           "No numbers or hands can be read.")),
    Photo("cell", (550, 660), False,
          ("cell", "microscope image", "grey", "black and white"),
          ("A black-and-white microscope image of a single round cell.",
           "The cell appears as a bright, white disk.",
           "It sits on a grainy grey background.",
           "Faint dark specks and ripples cover the background.",
           "Most of the frame is empty space around the cell.")),
    Photo("motorcycle", (741, 500), True,
          ("motorcycle", "red motorbike", "garage", "shelves", "boxes"),
          ("A red motorcycle is parked inside a garage.",
           "The bike has a black seat, chrome exhaust pipes and spoked wheels.",
           "Metal shelves filled with cardboard boxes stand behind it.",
           "A wooden chair and other furniture sit at the back of the room.",
           "The floor is bare grey concrete.")),
)
PHOTOS_BY_NAME = {p.name: p for p in PHOTOS}


@dataclass(frozen=True)
class PhotoCrop:
    """One use of a photo: a crop of the source, resized to the output size."""

    photo: Photo
    box: tuple[float, float, float, float]  # left, top, right, bottom as fractions of the source
    width: int
    height: int


def draw_photo_crop(photo: Photo, rng: np.random.Generator) -> PhotoCrop:
    """Crop up to 8 % off each dimension, then scale so the longer side lies in 400–900 px."""
    cut_w, cut_h = rng.uniform(0.0, 0.08, size=2)
    left, top = float(rng.uniform(0, cut_w)), float(rng.uniform(0, cut_h))
    box = (left, top, left + 1 - float(cut_w), top + 1 - float(cut_h))
    src_w = photo.size[0] * (box[2] - box[0])
    src_h = photo.size[1] * (box[3] - box[1])
    longest = float(np.clip(max(src_w, src_h) * rng.uniform(0.8, 1.2), 400, 900))
    scale = longest / max(src_w, src_h)
    return PhotoCrop(photo, box, int(round(src_w * scale)), int(round(src_h * scale)))


def load_photo(name: str) -> Image.Image:
    """The full source photo (RGB or L) from scikit-image's bundled data."""
    if name == "motorcycle":
        array = skimage.data.stereo_motorcycle()[0]
    else:
        array = getattr(skimage.data, name)()
    return Image.fromarray(np.ascontiguousarray(array))


def render_photo(crop: PhotoCrop) -> Image.Image:
    """Crop and resize the source photo as the design says."""
    image = load_photo(crop.photo.name)
    w, h = image.size
    l, t, r, b = crop.box
    image = image.crop((round(l * w), round(t * h), round(r * w), round(b * h)))
    return image.resize((crop.width, crop.height), Image.Resampling.LANCZOS)
