"""Features of only the records a consumer selects: ranged reads, reuse, reruns.

Real staging shards (the ground floor's tar writer and index, tests/staging_files.py)
and the weight-free descriptor, which embeds each image on its own, so subset features
must equal the matching rows of a full extraction bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

import tasks.shared.features.extract as extract_module
from corpusforge.feature_files import prune_subset, read_shard_errors, read_shard_features
from corpusforge.layout import feature_keys, feature_vectors
from corpusforge.storage import Store
from tasks.shared.features.extract import Selection, extract_shard
from tests.test_extract import _cfg, _write_staging, two_shard_corpus

pytestmark = pytest.mark.timeout(180)
SUBSET = "picked"


@dataclass(frozen=True)
class Picked(Selection):
    """A fixed set of keys per shard."""

    by_shard: dict[str, frozenset[str]] = field(default_factory=dict)

    def keys(self, store: Store, shard: str) -> set[str]:
        return set(self.by_shard.get(shard, ()))


def _pick(**by_shard: list[int]) -> Picked:
    return Picked(SUBSET, {s.removeprefix("s"): frozenset(f"k{i:05d}" for i in seeds) for s, seeds in by_shard.items()})


def _subset_files(store: Store, shard: str) -> tuple[bytes, bytes]:
    return (store.read_bytes(feature_vectors("wfd", shard, SUBSET)),
            store.read_bytes(feature_keys("wfd", shard, SUBSET)))


@pytest.fixture()
def corpus(tmp_path) -> Store:
    return two_shard_corpus(tmp_path)


def test_a_small_selection_is_read_by_ranged_reads_and_equals_the_full_rows(corpus, tmp_path, monkeypatch):
    reference = Store(str(tmp_path / "reference"))
    _write_staging(reference, "000001", list(range(11, 20)))
    extract_shard(reference, "000001", _cfg())
    all_keys, all_feats = read_shard_features(reference, "wfd", "000001")

    def no_stream(*args, **kwargs):
        raise AssertionError("a small selection must not stream the whole tar")

    monkeypatch.setattr(extract_module, "iter_tar_samples", no_stream)
    result = extract_shard(corpus, "000001", _cfg(), _pick(s000001=[12, 15, 18]))
    assert result.info["images"] == 3
    assert result.info["models"]["wfd"] | {"fingerprint": None} == {
        "action": "computed", "ok": 3, "errors": 0, "random_init": False, "dim": 1072, "fingerprint": None,
        "subset": SUBSET}
    keys, feats = read_shard_features(corpus, "wfd", "000001", SUBSET)
    assert keys == ["k00012", "k00015", "k00018"]
    rows = [all_keys.index(k) for k in keys]
    assert feats.tobytes() == all_feats[rows].tobytes()
    assert not corpus.exists(feature_vectors("wfd", "000001"))  # the features of every image stay untouched


def test_a_selected_undecodable_image_is_that_record_error(corpus):
    result = extract_shard(corpus, "000000", _cfg(), _pick(s000000=[1, 4]))
    assert (result.info["models"]["wfd"]["ok"], result.info["models"]["wfd"]["errors"]) == (1, 1)
    errors = read_shard_errors(corpus, "wfd", "000000", SUBSET)
    assert list(errors) == ["k00004"] and errors["k00004"].startswith("decode:")


def test_selecting_everything_streams_the_tar_and_equals_the_full_files(corpus, tmp_path):
    everything = _pick(s000000=list(range(0, 11)))
    extract_shard(corpus, "000000", _cfg(), everything)
    other = Store(str(tmp_path / "other"))
    _write_staging(other, "000000", list(range(0, 11)), corrupt={4})
    extract_shard(other, "000000", _cfg())
    assert _subset_files(corpus, "000000") == (other.read_bytes(feature_vectors("wfd", "000000")),
                                               other.read_bytes(feature_keys("wfd", "000000")))


def test_rerun_redoes_only_the_shard_whose_selection_changed_and_equals_fresh(corpus, tmp_path):
    first = _pick(s000000=[0, 2], s000001=[11, 13])
    assert [extract_shard(corpus, s, _cfg(), first).info["models"]["wfd"]["action"]
            for s in ("000000", "000001")] == ["computed", "computed"]
    assert [extract_shard(corpus, s, _cfg(), first).info["models"]["wfd"]["action"]
            for s in ("000000", "000001")] == ["skipped", "skipped"]
    second = _pick(s000000=[0, 2], s000001=[11, 13, 19])
    assert [extract_shard(corpus, s, _cfg(), second).info["models"]["wfd"]["action"]
            for s in ("000000", "000001")] == ["skipped", "computed"]
    fresh = Store(str(tmp_path / "fresh"))
    _write_staging(fresh, "000000", list(range(0, 11)), corrupt={4})
    _write_staging(fresh, "000001", list(range(11, 20)))
    for s in ("000000", "000001"):
        extract_shard(fresh, s, _cfg(), second)
        assert _subset_files(corpus, s) == _subset_files(fresh, s)
    prune_subset(corpus, "wfd", SUBSET, ["000001"])
    assert not corpus.exists(feature_vectors("wfd", "000000", SUBSET))
    assert extract_shard(corpus, "000000", _cfg(), second).info["models"]["wfd"]["action"] == "computed"


def test_features_of_every_image_with_the_same_fingerprint_are_reused(corpus):
    extract_shard(corpus, "000000", _cfg())
    result = extract_shard(corpus, "000000", _cfg(), _pick(s000000=[1, 4, 7]))
    assert result.info["models"]["wfd"]["action"] == "skipped" and result.info["models"]["wfd"]["subset"] is None
    assert (result.info["models"]["wfd"]["ok"], result.info["models"]["wfd"]["errors"]) == (2, 1)
    assert not corpus.exists(feature_vectors("wfd", "000000", SUBSET))
    as32 = _cfg().model_copy(update={"dtype": "float32"})  # another fingerprint: the selection is embedded
    again = extract_shard(corpus, "000000", as32, _pick(s000000=[1, 4, 7]))
    assert again.info["models"]["wfd"]["action"] == "computed" and again.info["models"]["wfd"]["subset"] == SUBSET
    np.testing.assert_array_equal(read_shard_features(corpus, "wfd", "000000", SUBSET)[0], ["k00001", "k00007"])
