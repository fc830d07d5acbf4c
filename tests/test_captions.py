"""The captioning and VLM-filter stage against a loopback chat-completions stub.

The stub (tests/chat_stub.py) answers per image and prompt as each test scripts it —
slowly, 429 with Retry-After, 503, dropped connections, malformed bodies — counts the
requests per image and measures how many were in flight at once.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from corpusforge.contract import read_marker
from tasks.captions.files import captions_path
from corpusforge.storage import Store
from corpusforge.tarshard import Sample
from tasks.captions.client import encode_image
from tasks.captions.config import CaptioningConfig
from tasks.captions.mix import assign_types, quotas
from tasks.captions.prompts import caption_prompts, load_prompt, question_prompts
from tasks.captions.stage import INCOMPLETE, caption_shard, assign_captions
from tests.chat_stub import chat_stub, image_digest, system_prompt
from tests.staging_files import write_staging_shard

ROOT = Path(__file__).resolve().parents[1]


# ---- the caption-type mix -----------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 100, 1001, 5000])
def test_mix_is_met_within_integer_rounding(n):
    mix = {"tag": 0.01, "short": 0.45, "medium": 0.45, "long": 0.09}
    keys = [f"k{i:05d}" for i in range(n)]
    types = assign_types(keys, mix, seed=3)
    counts = Counter(types.values())
    assert sum(counts.values()) == n
    for t, share in mix.items():
        assert abs(counts.get(t, 0) - n * share) < 1, (t, counts)
    assert counts == Counter({t: c for t, c in quotas(n, mix).items() if c})
    # order and duplicates of the input do not matter; another seed gives another assignment
    assert assign_types(list(reversed(keys)) + keys[:5], mix, seed=3) == types
    if n >= 100:
        assert assign_types(keys, mix, seed=4) != types


def test_mix_is_stable_when_the_corpus_grows():
    mix = {"tag": 0.01, "short": 0.45, "medium": 0.45, "long": 0.09}
    keys = [f"k{i:05d}" for i in range(5000)]
    before = assign_types(keys, mix, seed=0)
    after = assign_types(keys + [f"n{i:05d}" for i in range(500)], mix, seed=0)
    changed = sum(before[k] != after[k] for k in keys)
    assert changed < 0.02 * len(keys), changed  # only images near a quantile boundary move


# ---- prompts and config ----------------------------------------------------------------------
def test_gpic_prompts_are_files_and_replaceable(tmp_path):
    cfg = CaptioningConfig(endpoint={"base_url": "http://x/v1", "model": "m"})
    prompts = caption_prompts(cfg)
    assert set(prompts) == {"tag", "short", "medium", "long"}
    for p in prompts.values():
        assert '"NOT VISIBLE."' in p.system and p.user
    assert "unordered" in prompts["tag"].system and "5–7 sentences" in prompts["long"].user
    mine = tmp_path / "short.txt"
    mine.write_text("Describe briefly.\nUSER MESSAGE\nCaption it.\n")
    replaced = caption_prompts(CaptioningConfig(endpoint=cfg.endpoint, prompts={"short": str(mine)}))
    assert replaced["short"].system == "Describe briefly." and replaced["short"].sha256 != prompts["short"].sha256
    assert set(question_prompts(cfg)) == {"low_quality", "unsafe"}
    bad = tmp_path / "bad.txt"
    bad.write_text("no user message here")
    with pytest.raises(ValueError, match="USER MESSAGE"):
        load_prompt("x", str(bad))
    with pytest.raises(ValidationError):
        CaptioningConfig(endpoint=cfg.endpoint, mix={"tag": 1, "poem": 1})


def test_images_are_sent_small_enough_and_upright():
    def encoded(data: bytes) -> tuple[str, Image.Image, bytes]:
        url = encode_image(data, 768, 90)
        raw = base64.b64decode(url.split(",", 1)[1])
        return url.split(";", 1)[0], Image.open(io.BytesIO(raw)), raw

    def make(size, fmt, exif=None) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", size, (10, 120, 30)).save(buf, fmt, **({"exif": exif} if exif else {}))
        return buf.getvalue()

    small = make((300, 200), "PNG")
    assert encoded(small)[0] == "data:image/png" and encoded(small)[2] == small  # as stored
    mime, img, _ = encoded(make((2000, 1000), "JPEG"))
    assert mime == "data:image/jpeg" and img.size == (768, 384)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90°: displayed 200×300
    mime, img, _ = encoded(make((300, 200), "JPEG", exif.tobytes()))
    assert mime == "data:image/jpeg" and img.size == (200, 300)


# ---- a staging shard to caption ------------------------------------------------------------
def image(seed: int, size=(320, 240)) -> bytes:
    arr = (np.random.default_rng(seed).random((size[1], size[0], 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def staged(store: Store, shard: str, seeds: list[int], captions: dict[int, str] | None = None) -> dict[int, bytes]:
    images = {s: image(s) for s in seeds}
    records, samples = [], []
    for s, data in images.items():
        key = f"i{s:03d}"
        sha = hashlib.sha256(data).hexdigest()
        records.append({"key": key, "sha256": sha, "ext": "png", "width": 320, "height": 240, "source": "x",
                        "caption_type": "short", "part": 0, "row": s, "bytes": len(data)})
        text = (captions or {}).get(s, "")
        samples.append(Sample(key, {"png": data, "txt": text.encode(), "json": b"{}"}))
    write_staging_shard(store, shard, records, samples)
    return images


def sent_digest(data: bytes, cfg: CaptioningConfig) -> str:
    """The digest the stub sees for an image: of the JPEG the stage sends."""
    return hashlib.sha256(base64.b64decode(encode_image(data, cfg.max_side, cfg.jpeg_quality).split(",", 1)[1])
                          ).hexdigest()


def config(stub, **overrides) -> CaptioningConfig:
    data = {"endpoint": {"base_url": stub.base_url, "model": "stub-vl", "concurrency": 3, "backoff_s": 0.05,
                         "max_attempts": 4, "timeout_s": 5},
            "recaption": False, "journal_every": 1}
    data.update(overrides)
    return CaptioningConfig.model_validate(data)


class Script:
    """Per (image digest, kind) step lists, consumed in order; then a good answer."""

    def __init__(self):
        self.steps: dict[tuple[str, str], list] = {}

    def __call__(self, body):
        digest, system = image_digest(body), system_prompt(body)
        kind = "question" if system.startswith("You check images") else "caption"
        steps = self.steps.get((digest, kind)) or self.steps.get((digest, "unsafe" if "unsafe" in system else ""))
        if steps:
            return steps.pop(0)
        if kind == "question":
            return ("text", "No.")
        return ("text", "A small square of coloured noise lies on a plain background.")


def test_statuses_retries_and_concurrency(tmp_path):
    store = Store(str(tmp_path / "out"))
    images = staged(store, "s1", list(range(13)), captions={12: "an input caption"})
    script = Script()
    with chat_stub(default=script, latency_s=0.05) as stub:
        cfg = config(stub)
        d = {s: sent_digest(data, cfg) for s, data in images.items()}
        script.steps = {
            (d[1], "caption"): [("text", "NOT VISIBLE.")],
            (d[2], "caption"): [("text", "   ")],
            (d[3], "caption"): [("text", "word " * 500)],
            (d[4], "caption"): [("text", "A cut", "length")],
            (d[5], "caption"): [("429", 1)],
            (d[6], "caption"): ["503", "503"],
            (d[7], "caption"): ["drop"],
            (d[8], "caption"): ["400"],
            (d[9], "caption"): ["garbage"],
            (d[10], "unsafe"): [("text", "Yes.")],
            (d[11], "question"): [("text", "maybe"), ("text", "No")],
        }
        digests = assign_captions(store, ["s1"], cfg, near_dedup=False)
        result = caption_shard(store, "s1", cfg, digests["s1"])
        rows = {r["key"]: r for r in store.read_parquet(captions_path("s1")).to_pylist()}
        counts = stub.image_counts()
        requests = list(stub.requests)

    got = {int(k[1:]): (r["status"], r["reason"].split(":")[0], r["reason"]) for k, r in rows.items()}
    assert {s: g[:2] for s, g in got.items()} == {
        0: ("kept", ""), 1: ("filtered", "not_visible"), 2: ("error", "caption_error"), 3: ("error", "caption_error"),
        4: ("error", "caption_error"), 5: ("kept", ""), 6: ("kept", ""), 7: ("kept", ""), 8: ("error", "caption_error"),
        9: ("error", "caption_error"), 10: ("filtered", "unsafe"), 11: ("error", "question_error"), 12: ("kept", "")}
    assert "empty" in got[2][2] and "over-long" in got[3][2] and "over-long" in got[4][2]
    assert "HTTP 400" in got[8][2] and "malformed" in got[9][2] and "not yes/no" in got[11][2]
    # retries only on transient errors: 429 once, 503 twice, one drop; 400 and garbage asked once
    prompts = caption_prompts(cfg)
    caption_requests = {s: sum(n for (dig, sysp), n in counts.items() if dig == d[s]
                               and not sysp.startswith("You check images")) for s in images}
    assert caption_requests == {**{s: 1 for s in images}, 5: 2, 6: 3, 7: 2, 12: 0}
    assert all(n == 1 for (dig, sysp), n in counts.items() if sysp.startswith("You check images"))
    # the 429's Retry-After (1 s) was waited before asking again
    asked_at = [r["at"] for r in requests if image_digest(r["body"]) == d[5]
                and not system_prompt(r["body"]).startswith("You check images")]
    assert len(asked_at) == 2 and asked_at[1] - asked_at[0] >= 0.95
    assert stub.max_in_flight <= 3 and stub.max_in_flight == 3
    # captions, types, origins, answers
    kept = rows["i000"]
    assert kept["caption"].startswith("A small square") and kept["caption_origin"].startswith("model:stub-vl@")
    assert kept["caption_origin"].endswith(prompts[kept["caption_type"]].sha256[:12])
    assert json.loads(kept["vlm_answers"])["unsafe"]["answer"] == "no" and kept["vlm_model"] == "stub-vl"
    assert rows["i012"]["caption"] is None and rows["i012"]["caption_origin"] == "input"
    assert result.action == "computed"


def test_rerun_never_asks_twice_and_equals_a_fresh_run(tmp_path):
    store = Store(str(tmp_path / "out"))
    staged(store, "s1", list(range(6)))
    with chat_stub(default=Script()) as stub:
        cfg = config(stub, journal_every=4)
        digests = assign_captions(store, ["s1"], cfg, near_dedup=False)
        caption_shard(store, "s1", cfg, digests["s1"])
        first = len(stub.requests)
        assert first == 6 * 3
        again = caption_shard(store, "s1", cfg, digests["s1"])
        assert again.action == "skipped" and len(stub.requests) == first
        # the unit's output lost (or its code changed): recomputed from the journal, no request
        before = (tmp_path / "out" / captions_path("s1")).read_bytes()
        os.remove(tmp_path / "out" / "_markers" / f"{captions_path('s1')}.json")
        redo = caption_shard(store, "s1", cfg, digests["s1"])
        assert redo.action == "computed" and redo.requests_asked == 0 and len(stub.requests) == first
        assert (tmp_path / "out" / captions_path("s1")).read_bytes() == before
        # another prompt for one question: only that question is asked again, once per image
        mine = tmp_path / "unsafe.txt"
        mine.write_text("You check images, strictly.\nUSER MESSAGE\nUnsafe? yes or no.\n")
        other = config(stub, journal_every=4, questions=[{"name": "low_quality", "prompt": "low_quality"},
                                                         {"name": "unsafe", "prompt": str(mine)}])
        caption_shard(store, "s1", other, assign_captions(store, ["s1"], other, near_dedup=False)["s1"])
        assert len(stub.requests) == first + 6


def test_given_up_requests_are_asked_again_next_run(tmp_path):
    store = Store(str(tmp_path / "out"))
    images = staged(store, "s1", [0, 1])
    script = Script()
    with chat_stub(default=script) as stub:
        cfg = config(stub, endpoint={"base_url": stub.base_url, "model": "stub-vl", "max_attempts": 2,
                                     "backoff_s": 0.01})
        d1 = sent_digest(images[1], cfg)
        script.steps = {(d1, "caption"): ["503", "503"]}
        digest = assign_captions(store, ["s1"], cfg, near_dedup=False)["s1"]
        caption_shard(store, "s1", cfg, digest)
        row = next(r for r in store.read_parquet(captions_path("s1")).to_pylist() if r["key"] == "i001")
        assert row["status"] == "error" and "gave up after 2 attempts: HTTP 503" in row["reason"]
        assert read_marker(store, captions_path("s1")).fingerprint.endswith(INCOMPLETE)
        n = len(stub.requests)
        redo = caption_shard(store, "s1", cfg, digest)  # the endpoint is healthy again
        assert redo.action == "computed" and len(stub.requests) == n + 1
        row = next(r for r in store.read_parquet(captions_path("s1")).to_pylist() if r["key"] == "i001")
        assert row["status"] == "kept"
        assert caption_shard(store, "s1", cfg, digest).action == "skipped"


KILLED_RUN = """
import sys
from corpusforge.storage import Store
from tasks.captions.config import CaptioningConfig
from tasks.captions.stage import caption_shard
cfg = CaptioningConfig.model_validate_json(sys.argv[2])
caption_shard(Store(sys.argv[1]), "s1", cfg, sys.argv[3])
"""


def test_a_killed_run_loses_only_requests_in_flight(tmp_path):
    store = Store(str(tmp_path / "out"))
    staged(store, "s1", list(range(24)))
    with chat_stub(default=Script(), latency_s=0.3) as stub:  # 24 requests, 3 at a time: ≥ 2.4 s
        cfg = config(stub, questions=[], recaption=True)
        digest = assign_captions(store, ["s1"], cfg, near_dedup=False)["s1"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(tmp_path / "out"), cfg.model_dump_json(),
                                 digest], env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while len(stub.requests) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        asked_before = len(stub.requests)
        assert 10 <= asked_before < 24, "killed mid-way"
        caption_shard(store, "s1", cfg, digest)
        counts = stub.image_counts()
    repeated = sum(n - 1 for n in counts.values())
    assert set(counts.values()) <= {1, 2} and len(counts) == 24
    assert repeated <= cfg.endpoint.concurrency, "only the requests in flight at the kill are asked again"
    # and the result equals a run that was never killed
    fresh = Store(str(tmp_path / "fresh"))
    staged(fresh, "s1", list(range(24)))
    with chat_stub(default=Script()) as stub2:
        cfg2 = config(stub2, questions=[], recaption=True)
        caption_shard(fresh, "s1", cfg2, assign_captions(fresh, ["s1"], cfg2, near_dedup=False)["s1"])
    assert (tmp_path / "out" / captions_path("s1")).read_bytes() == (tmp_path / "fresh" / captions_path("s1")
                                                                      ).read_bytes()


# ---- in a build ---------------------------------------------------------------------------------
def caption_reply(body):
    system = system_prompt(body)
    if system.startswith("You check images"):
        return ("text", "no")
    digest = image_digest(body)
    kind = next(t for t in ("tag", "short", "medium", "long") if f"{t}" in system.split("\n", 2)[1].lower()
                or t == "long")
    return ("text", f"{kind} caption of {digest[:10]}, a scene.")


def build_config(source, out, stub, **endpoint) -> dict:
    return {"source": str(source), "out": str(out), "input": {"partition_size": 20},
            "staging": {"shard_size": 20}, "splits": {"shard_size": 6, "val": 0.1, "test": 0.3},
            "eval_captions": {"size": 5},
            "captioning": {"endpoint": {"base_url": stub.base_url, "model": "stub-vl", "concurrency": 4,
                                        **endpoint},
                           "recaption": True, "mix": {"tag": 0.1, "short": 0.4, "medium": 0.4, "long": 0.1}}}


def tree(root: Path) -> dict[str, bytes]:
    """Outputs and markers, less the work area, the account of changes since the version the
    root held (a rerun writes one) and the receipt and reports, which name the root."""
    skip = ("work/", "CHANGES.md", "changes.parquet", "receipt.json", "report.")
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith(skip)}


@pytest.mark.slow
def test_build_captions_identically_on_any_cluster_and_never_writes_the_key(tmp_path, monkeypatch):
    import pyarrow.dataset as ds
    import webdataset as wds

    from corpusforge.secrets import split_secrets
    from flows.build_corpus import BuildConfig, build
    from sample_corpus import write_sample_corpus
    from tasks.shared.sampling import SmallestKeys

    write_sample_corpus(str(tmp_path / "source"), n=40, seed=0)
    secret = "sk-never-write-me-1234567890"
    monkeypatch.setenv("STUB_VL_KEY", secret)
    with chat_stub(default=caption_reply) as stub:
        inline = BuildConfig.model_validate({**build_config(tmp_path / "source", tmp_path / "a", stub,
                                                            api_key=secret),
                                             "dask": {"n_workers": 2, "processes": True}})
        # a key in the config is taken out before a flow is called (corpusforge.secrets)
        public, held = split_secrets(inline)
        assert public.captioning.endpoint.api_key is None and list(held.values()) == [secret]
        build(inline)
        asked = len(stub.requests)
        build(BuildConfig.model_validate({**build_config(tmp_path / "source", tmp_path / "b", stub,
                                                         api_key_env="STUB_VL_KEY"),
                                          "dask": {"n_workers": 1, "processes": False}}))
        assert all(r["headers"].get("Authorization") == f"Bearer {secret}" for r in stub.requests)
        assert stub.max_in_flight <= 4 * 2  # per task; at most two tasks at once
        # a rerun asks nothing (on another cluster, too)
        build(BuildConfig.model_validate({**build_config(tmp_path / "source", tmp_path / "a", stub,
                                                         api_key=secret),
                                          "dask": {"n_workers": 1, "processes": False}}))
        assert len(stub.requests) == 2 * asked
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert a == b, sorted(k for k in a if a.get(k) != b.get(k))
    for root in (tmp_path / "a", tmp_path / "b"):
        for p in root.rglob("*"):
            assert not p.is_file() or secret.encode() not in p.read_bytes(), p
    rows = ds.dataset(tmp_path / "a" / "manifest", format="parquet").to_table().to_pylist()
    kept = {r["key"]: r for r in rows if r["status"] == "kept"}
    assert kept and all(r["caption_origin"].startswith("model:stub-vl@") for r in kept.values())
    assert all(json.loads(r["vlm_answers"])["unsafe"]["answer"] == "no" for r in kept.values())
    # the mix over the captioned images, within rounding; each split keeps it per stratum
    counts = Counter(r["caption_type"] for r in kept.values())
    receipt = json.loads((tmp_path / "a" / "receipt.json").read_text())
    planned = receipt["captioning"]["records"]
    assert planned == len(kept)
    for t, share in {"tag": 0.1, "short": 0.4, "medium": 0.4, "long": 0.1}.items():
        assert abs(counts[t] - share * planned) < 1
    # release shards carry the model's caption and its origin
    for tar in sorted((tmp_path / "a" / "shards").rglob("*.tar")):
        for sample in wds.WebDataset(str(tar), shardshuffle=False):
            meta = json.loads(sample["json"])
            assert sample["txt"].decode().startswith(f"{meta['caption_type']} caption of ")
            assert meta["caption_origin"] == kept[sample["__key__"]]["caption_origin"]
    # the evaluation caption set: test only, deterministic, named in the receipt and the stats
    test_keys = [k for k, r in kept.items() if r["split"] == "test"]
    import pyarrow.parquet as pq
    evals = pq.read_table(tmp_path / "a" / "eval_captions.parquet").to_pylist()
    chosen = SmallestKeys(5, 1)
    chosen.add(test_keys)
    assert {e["key"] for e in evals} == chosen.keys() and len(evals) == min(5, len(test_keys))
    assert all(kept[e["key"]]["split"] == "test" and e["caption"].startswith(e["caption_type"]) for e in evals)
    assert receipt["eval_captions"]["sha256"] == hashlib.sha256(
        (tmp_path / "a" / "eval_captions.parquet").read_bytes()).hexdigest()
    report = (tmp_path / "a" / "report.md").read_text()
    assert "## Captions" in report and "Caption-type mix per split" in report and "Evaluation caption set" in report
    assert 'id="chart-words"' in (tmp_path / "a" / "report.html").read_text()


def test_word_statistics_match_numpy():
    from tasks.shared.caption_summary import word_stats

    rng = np.random.default_rng(0)
    values = {"short": rng.integers(5, 40, 501), "long": rng.integers(60, 200, 77)}
    words = {t: {str(n): int(c) for n, c in zip(*np.unique(v, return_counts=True), strict=True)}
             for t, v in values.items()}
    stats = word_stats(words)
    for t, v in values.items():
        assert stats[t]["captions"] == v.size and stats[t]["max"] == v.max()
        assert stats[t]["mean"] == round(float(v.mean()), 2)
        for q, name in ((0.1, "p10"), (0.5, "median"), (0.9, "p90")):
            assert stats[t][name] == np.quantile(v, q, method="lower")


def test_evaluate_records_the_caption_set_and_flags_another(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.stats.caption_set import caption_set_claim

    path = tmp_path / "eval_captions.parquet"
    pq.write_table(pa.table({"key": ["a", "b"], "caption": ["x", "y"]}), path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert caption_set_claim(None, {}, {"sha256": sha}) is None
    same = caption_set_claim(str(path), {}, {"sha256": sha})
    assert same == {"path": str(path), "sha256": sha, "captions": 2, "reference_names": sha}
    other = caption_set_claim(str(path), {}, {"sha256": "0" * 64})
    assert other["deviation"].startswith("generated from caption set") and other["reference_names"] == "0" * 64
