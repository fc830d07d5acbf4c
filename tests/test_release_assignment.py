"""The columnar release assignment and the span-reading writers against the old code.

Synthetic staging shards (real tars, indexes, records; near-duplicate decisions with
components across shards) under several split configs: the assignment files, late facts, release
tars and summary equal the old implementation's byte for byte (tests/old_release.py),
and a release writer opens its assignment file and the staging tars it copies from, nothing else.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from PIL import Image

from corpusforge.contract import finish_unit
from corpusforge.key_ranges import key_ranges
from corpusforge.layout import staging_tar
from tasks.release.files import LATE_DIR, RELEASE_ASSIGNMENT_DIR, release_assignment_path
from tasks.graph.files import GRAPH_DECISIONS, NEAR_DECISION_SCHEMA, decisions_path
from corpusforge.storage import Store
from corpusforge.tarshard import Sample
from tasks.release.shards import assign_release_files, write_release_shard, write_staged_list
from tasks.release.splits import SplitConfig
from tests.old_release import assert_release_equals_old
from tests.staging_files import write_staging_shard


def _image(fmt: str, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4 + seed % 3, 4), (seed % 255, 7, 9)).save(buf, format=fmt)
    return buf.getvalue()


def synthetic_corpus(root: Path, n_shards: int = 4, per_shard: int = 60, seed: int = 0) -> tuple[Store, list[str]]:
    """Staging shards whose records mix sources, caption types and formats, with
    near-duplicate decisions: components spanning shards, a fifth of their members removed."""
    rng = random.Random(seed)
    store = Store(str(root), fsync=False)
    formats = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
    shards = [f"{s:06d}" for s in range(n_shards)]
    for s, shard in enumerate(shards):
        records, samples, decisions = [], [], []
        for i in range(per_shard):
            n = s * per_shard + i
            key = f"{rng.getrandbits(32):08x}{n:05d}"
            ext = rng.choice(list(formats))
            data = _image(formats[ext], n)
            meta = {"key": key, "width": 4 + n % 3, "height": 4, "source": rng.choice(["web", "books", "art"]),
                    "caption_type": rng.choice(["short", "long"]), "license": "cc-by"}
            records.append({**meta, "part": n // 50, "row": n % 50, "sha256": hashlib.sha256(data).hexdigest(),
                            "ext": ext, "bytes": len(data)})
            samples.append(Sample(key, {ext: data, "txt": f"caption {n}".encode(), "json": json.dumps(meta).encode()}))
            component = rng.randrange(25) if rng.random() < 0.4 else None
            removed = component is not None and rng.random() < 0.2
            decisions.append({"key": key, "status": "near_duplicate" if removed else "kept",
                              "reason": "pair" if removed else None, "duplicate_of": None,
                              "component_id": component, "component_size": None if component is None else 3,
                              "max_similarity": 0.5 if component is not None else None})
        write_staging_shard(store, shard, records, samples)
        store.write_parquet(decisions_path(shard), pa.Table.from_pylist(decisions, schema=NEAR_DECISION_SCHEMA))
    return store, shards


CONFIGS = {
    "fractions": dict(val=0.1, test=0.15, shard_size=20),
    "counts": dict(val=7, test=11, shard_size=33, seed=3),
    "one_stratum": dict(val=0.2, test=0.2, shard_size=25, stratify_by=[]),
    "three_strata_fields": dict(val=0.05, test=0.3, shard_size=16, stratify_by=["source", "caption_type", "ext"]),
    "gpic": dict(preset="gpic", shard_size=30, layout="gpic", tiers={"nano": 1, "lite": 2, "full": 8}),
    "auto_images": dict(val=0.1, test=0.1, shard_size=40, image_format="auto"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("near_dedup", [True, False])
def test_assignment_and_shards_equal_the_old_implementation(tmp_path, name, near_dedup):
    store, shards = synthetic_corpus(tmp_path / "corpus")
    cfg = SplitConfig.model_validate(CONFIGS[name])
    summary = assign_release_files(store, write_staged_list(store, shards), cfg, near_dedup)
    for shard_name, s in summary["shards"].items():
        write_release_shard(store, s["split"], s["index"], cfg, summary["plans"][shard_name]["sha256"])
    assert {s["split"] for s in summary["shards"].values()} == {"train", "val", "test"}
    assert_release_equals_old(tmp_path / "corpus", shards, cfg, near_dedup, tmp_path)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_an_assignment_made_in_many_ranges_is_the_one_made_in_one(tmp_path, monkeypatch, name):
    """The assignment's passes by key range carry their running sums and shard counters from one
    range to the next: ranges of 16 rows (every pass cut into several) give the assignment files,
    late files and summary that one range holding every record gives, byte for byte."""
    from tasks.release import shards as release_shards

    cfg = SplitConfig.model_validate(CONFIGS[name])
    ranges: Counter[str] = Counter()

    def counted(tables, key, **kwargs):
        for ranged in key_ranges(tables, key=key, **kwargs):
            ranges[key] += 1
            yield ranged

    monkeypatch.setattr(release_shards, "key_ranges", counted)
    made = {}
    for label, rows in (("one", 10**9), ("many", 16)):
        store, shards = synthetic_corpus(tmp_path / label)
        summary = assign_release_files(store, write_staged_list(store, shards), cfg, near_dedup=True,
                                       rows_per_range=rows)
        files = sorted(p for folder in (RELEASE_ASSIGNMENT_DIR,
                                        LATE_DIR) for p in (tmp_path / label / folder).iterdir())
        made[label] = (json.dumps(summary), [(p.name, p.read_bytes()) for p in files])
        if label == "one":  # one range per pass (by shard: one per split)
            assert ranges == Counter(grp=1, gu=1, u1=1, shard=3, part=1), ranges
            ranges.clear()
    assert set(ranges) == {"grp", "gu", "u1", "shard", "part"} and min(ranges.values()) > 3, ranges
    assert made["many"] == made["one"]


def test_a_release_writer_opens_only_its_assignment_and_the_staging_tars_it_copies(tmp_path, opened_files):
    store, shards = synthetic_corpus(tmp_path / "corpus", n_shards=6, per_shard=30)
    cfg = SplitConfig(val=0.1, test=0.1, shard_size=4)
    summary = assign_release_files(store, write_staged_list(store, shards), cfg, near_dedup=True)
    name, shard = next((n, s) for n, s in summary["shards"].items() if s["split"] == "train")
    assignment = store.read_parquet(release_assignment_path(name)).to_pylist()
    opened_files.clear()
    write_release_shard(store, "train", shard["index"], cfg, summary["plans"][name]["sha256"])
    opened = list(opened_files)
    copied_from = {staging_tar(e["staging_shard"]) for e in assignment}
    assert len(copied_from) < len(shards)  # a small shard: the test tells reading its spans from reading all
    assert set(opened) == {release_assignment_path(name)} | copied_from
    assert opened.count(release_assignment_path(name)) == 1
    assert len(opened) == 1 + len(assignment)  # one ranged read per sample


def test_a_release_writer_holds_a_batch_of_its_assignment_rows_not_all_of_them(tmp_path, monkeypatch):
    """The assignment file's rows alive as Python objects while the last sample is made are one batch's
    (the old writer held every row of its file to the end: a shard's size is a config field)."""
    import gc

    from bench.scale import Scale, write_staging
    from tasks.release import shards as release_shards

    store = Store(str(tmp_path / "corpus"), fsync=False)
    write_staging(store, Scale(3000, 1, 2, 1))
    cfg = SplitConfig(val=0.05, test=0.05, shard_size=10_000)
    summary = assign_release_files(store, write_staged_list(store, ["000000", "000001"]), cfg, near_dedup=False)
    name, shard = next((n, s) for n, s in summary["shards"].items() if s["split"] == "train")
    made, alive = [], []
    real_sample = release_shards.release_sample

    def counting_sample(key, *args, **kwargs):
        made.append(key)
        if len(made) == shard["count"]:
            alive.append(sum(1 for o in gc.get_objects() if type(o) is dict and "members" in o and "tier" in o))
        return real_sample(key, *args, **kwargs)

    monkeypatch.setattr(release_shards, "release_sample", counting_sample)
    write_release_shard(store, "train", shard["index"], cfg, summary["plans"][name]["sha256"])
    assert shard["count"] > 2 * 1024 and 0 < alive[0] <= 1024, (shard["count"], alive)


class _Submitted(Exception):
    """Raised by the recording fan-out once publish has built the assignment call."""


def test_the_assignment_task_gets_a_digest_not_the_shard_list(tmp_path):
    """publish hands the assignment task the staging-shard list's SHA-256 (issue 22: the list itself
    was 134 KB per task projected at 10⁸ images): its pickled parameters are the same size
    for 10 and 1000 staging shards, and the assignment task reads the list back."""
    import cloudpickle

    from tasks.release.publish import publish
    from tasks.release.shards import read_staged_list

    submitted = []

    def first_call(unit, calls):
        submitted.append(calls)
        raise _Submitted
    sizes = []
    for n in (10, 1000):
        store = Store(str(tmp_path / f"{n:06d}"), fsync=False)  # equal root lengths: equal pickles
        shards = [f"{i:06d}" for i in range(n)]
        for rel in [*(staging_tar(s) for s in shards), GRAPH_DECISIONS]:  # the step's key reads their digests
            finish_unit(store, rel, "fp", {}, {})
        with pytest.raises(_Submitted):
            publish(store, shards, 1, SplitConfig(), near_dedup=True, fan_out=first_call)
        (call,) = submitted.pop()
        kwargs = call["kwargs"]  # the assignment task's own, inside its keyed step (contract.step_call)
        assert read_staged_list(store, kwargs["staged"]) == shards
        sizes.append(len(cloudpickle.dumps(call)))
    assert sizes[1] == sizes[0] <= 4 << 10


def test_the_assignment_refuses_a_shard_list_it_was_not_given(tmp_path):
    store, shards = synthetic_corpus(tmp_path / "corpus", n_shards=2, per_shard=10)
    staged = write_staged_list(store, shards)
    write_staged_list(store, shards[:1])
    with pytest.raises(ValueError, match="changed while release assignment ran"):
        assign_release_files(store, staged, SplitConfig(), near_dedup=True)
