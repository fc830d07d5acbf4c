"""Self-calibration's core on real photographs: thresholds chosen on a planted sample keep zero
false links on a held-out seed (other copies, other crops, other fills of the same corpus).

Pictures: the real-photo fixtures (Debian's opencv-doc, tests/data/real_photos: among them
stereo pairs and one subject from two viewpoints, the hardest unrelated pairs) and
scikit-image's photographs; model: wfd through the extraction stage's path, scored by its
pair rule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import skimage.data
from PIL import Image

from tasks.graph.self_calibration import Calibration, choose, measure_sample
from tasks.shared.features.content import model_input
from tasks.shared.features.wfd import WeightFreeDescriptor
from tasks.shared.pair_score import PairScore

PHOTOS = Path(__file__).parent / "data" / "real_photos"
SKIMAGE = ("astronaut", "camera", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry",
           "retina", "brick", "grass", "gravel", "coins", "moon")


def calibrate(pictures, embed, score, *, seed: int, per_transform: int, margin: float = 0.02) -> Calibration:
    return choose(measure_sample(pictures, embed, score, seed, per_transform), seed, margin)


@pytest.fixture(scope="module")
def pictures() -> list[Image.Image]:
    out = [Image.open(p).convert("RGB") for p in sorted(PHOTOS.glob("*.jpg"))]
    return out + [Image.fromarray(np.asarray(getattr(skimage.data, n)())).convert("RGB") for n in SKIMAGE]


@pytest.fixture(scope="module")
def wfd():
    model = WeightFreeDescriptor()
    rule = PairScore.from_model(model.fingerprint())

    def embed(images: list[Image.Image]) -> np.ndarray:
        return model.embed(np.stack([model_input(model, im) for im in images]))

    def score(rows: np.ndarray) -> np.ndarray:
        layout = rule.unit_layout(rows).astype(np.float64)
        grey = rule.colourless(rows)
        return np.where(grey[:, None] | grey[None, :], layout @ layout.T, rows.astype(np.float64) @ rows.T)

    return embed, score


def test_thresholds_from_a_planted_sample_keep_zero_false_links_on_a_held_out_seed(pictures, wfd):
    embed, score = wfd
    cal = calibrate(pictures, embed, score, seed=0, per_transform=6, margin=0.02)
    assert cal.closest_unrelated + 0.02 <= cal.link_above <= cal.closest_unrelated + 0.02 + 1e-4  # rounded up
    assert set(cal.recall) >= {"greyscale", "border_10", "offcentre_crop_70"}
    # light edits clear the calibrated threshold on their own; a border is cut off unless it has
    # the colour of the picture's own edge (a black border round the Hubble deep field's black sky)
    for name in ("jpeg_q40", "resize_50", "greyscale", "hflip"):
        assert cal.recall[name] == 1.0, (name, cal.copies[name], cal.link_above)
    assert cal.recall["border_10"] >= 5 / 6, cal.copies["border_10"]
    held_unrelated = measure_sample(pictures, embed, score, seed=1, per_transform=6).unrelated()[2]
    assert held_unrelated.size > 5_000  # 21 originals, 84 copies: every pair of different originals
    print(f"calibrated link > {cal.link_above:.3f} (closest unrelated {cal.closest_unrelated:.3f}); held-out seed: "
          f"closest unrelated {held_unrelated.max():.3f}, recall {cal.recall}")
    assert (held_unrelated > cal.link_above).sum() == 0, (held_unrelated.max(), cal.link_above)
    # the record names what it was fitted on
    assert cal.digest() == calibrate(pictures, embed, score, seed=0, per_transform=6, margin=0.02).digest()
    assert cal.digest() != calibrate(pictures, embed, score, seed=2, per_transform=6, margin=0.02).digest()


def test_a_duplicate_the_corpus_already_holds_is_not_an_unrelated_pair(pictures, wfd):
    """A sample that holds a picture twice (re-encoded, as a corpus holds its own near-duplicates) would
    otherwise fit the threshold to that pair: no threshold would be left below 1."""
    embed, score = wfd
    import io

    buf = io.BytesIO()
    pictures[0].save(buf, "JPEG", quality=85)
    twin = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    cal = calibrate([*pictures, twin], embed, score, seed=0, per_transform=2)
    assert cal.merged_originals == 1
    assert cal.closest_unrelated < 0.95 and cal.link_above < 0.97, cal.unrelated_top[:3]
