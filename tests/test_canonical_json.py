"""canonical_json (the text every fingerprint and marker hashes) calls a C encoder built
once instead of json.dumps: the text must be json.dumps's, byte for byte, or every
fingerprint would change."""

from __future__ import annotations

import datetime
import json

from hypothesis import given
from hypothesis import strategies as st

from corpusforge.hashing import canonical_json

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


def reference(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@given(JSON)
def test_canonical_json_is_json_dumps_text(obj):
    assert canonical_json(obj) == reference(obj)


def test_canonical_json_of_a_staged_samples_metadata_and_odd_values():
    meta = {"key": "s000001", "width": 640, "height": 480, "license": None, "caption_type": "long",
            "attribution": "Photo by Zoë «Ω» on Flickr \u2028 \"quoted\" \\ \n", "sha256": "ab" * 32}
    for obj in (meta, [meta, (1, 2.5, float("inf"), float("nan"), -0.0)], "a string", 7, None,
                {"when": datetime.date(2026, 11, 30)}, {2: "int keys", 1: "sorted"}):
        assert canonical_json(obj) == reference(obj)
