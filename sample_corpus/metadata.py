"""Per-record metadata like GPIC's (§2.1): caption style, source, licence, attribution, retrieval time.

Everything is drawn from the record's own random stream: no clock, no order dependence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa

# GPIC's caption mix (App. F) and source split (§2.1: 87.7 % Flickr, 12.3 % Wikimedia).
CAPTION_TYPE_MIX = {"tag": 0.01, "short": 0.45, "medium": 0.45, "long": 0.09}
SOURCE_MIX = {"flickr": 0.88, "wikimedia": 0.12}
LICENSE_URLS = {
    "CC BY 2.0": "https://creativecommons.org/licenses/by/2.0/",
    "CC0 1.0": "https://creativecommons.org/publicdomain/zero/1.0/",
    "Public Domain Mark 1.0": "https://creativecommons.org/publicdomain/mark/1.0/",
    "No known restrictions": "https://www.flickr.com/commons/usage/",
}
# "No known restrictions" is a Flickr Commons statement, so Wikimedia never carries it.
LICENSE_MIX = {
    "flickr": {"CC BY 2.0": 0.70, "CC0 1.0": 0.08, "Public Domain Mark 1.0": 0.12,
               "No known restrictions": 0.10},
    "wikimedia": {"CC BY 2.0": 0.55, "CC0 1.0": 0.20, "Public Domain Mark 1.0": 0.25},
}
SOURCE_NAMES = {"flickr": "Flickr", "wikimedia": "Wikimedia Commons"}

FIRST_NAMES = ("Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines",
               "Jonas", "Kemi", "Lars", "Maya", "Nikos", "Olga", "Pablo", "Quinn", "Rosa",
               "Sami", "Tara", "Umar", "Vera", "Wen", "Ximena", "Yusuf", "Zoe")
LAST_NAMES = ("Abbott", "Berg", "Costa", "Duarte", "Eriksen", "Fischer", "Garcia", "Haddad",
              "Ito", "Jansen", "Kowalski", "Larsen", "Moreau", "Nakamura", "Okafor", "Petrov",
              "Quispe", "Rossi", "Silva", "Tanaka", "Urban", "Varga", "Weber", "Yilmaz", "Zhou")
ARCHIVES = ("Harbour City Archives", "Northfield Historical Society", "The Valley Museum",
            "Riverside Public Library", "Coastal Heritage Collection")

# When the crawl happened: a 90-day window starting on a seed-dependent day of 2025.
CRAWL_YEAR_START = datetime(2025, 1, 1, tzinfo=timezone.utc)
CRAWL_WINDOW = timedelta(days=90)

METADATA_COLUMNS = ("key", "path", "caption", "caption_type", "source", "license",
                    "license_url", "attribution", "retrieved_at")
METADATA_SCHEMA = pa.schema([(name, pa.string()) for name in METADATA_COLUMNS])


@dataclass(frozen=True)
class RecordMetadata:
    caption_type: str
    source: str
    license: str
    license_url: str
    attribution: str
    retrieved_at: str


def _pick(rng: np.random.Generator, mix: dict[str, float]) -> str:
    names = list(mix)
    return names[int(rng.choice(len(names), p=np.array(list(mix.values())) / sum(mix.values())))]


def crawl_start(seed_rng: np.random.Generator) -> datetime:
    """The first day of the simulated crawl, drawn once per corpus."""
    return CRAWL_YEAR_START + timedelta(days=int(seed_rng.integers(0, 275)))


def draw_metadata(rng: np.random.Generator, start: datetime) -> RecordMetadata:
    """Caption style, source, licence, attribution and retrieval time of one record."""
    caption_type = _pick(rng, CAPTION_TYPE_MIX)
    source = _pick(rng, SOURCE_MIX)
    license_name = _pick(rng, LICENSE_MIX[source])
    if license_name == "No known restrictions":
        who = ARCHIVES[int(rng.integers(len(ARCHIVES)))]
    else:
        who = f"{FIRST_NAMES[int(rng.integers(len(FIRST_NAMES)))]} {LAST_NAMES[int(rng.integers(len(LAST_NAMES)))]}"
    seconds = int(rng.integers(0, int(CRAWL_WINDOW.total_seconds())))
    retrieved = (start + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return RecordMetadata(caption_type, source, license_name, LICENSE_URLS[license_name],
                          f"Photo by {who} on {SOURCE_NAMES[source]}", retrieved)
