"""Contamination rates: text canaries (seed 003), image-only rates (seed 001), cross-split
leakage, the image–text judges, receipts and benchmark editions, the flow and its CLI.

The seed-003 expectations below were produced by running the seed's own JavaScript
fixture under Node 20 (signature vectors printed per text), so "reproduces exactly"
is checked against the original, not against a re-reading of it.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusforge.storage import Store
from tasks.contamination import canary
from tasks.contamination.config import EvalSetConfig, LshConfig, TextCanaryConfig, TextCorpusConfig
from tasks.contamination.eval_set import cut_eval_set
from tasks.contamination.lsh import choose_bands
from tasks.contamination.signatures import text_batch
from tasks.contamination.stage import stage_eval_set, text_canary_stage
from tasks.shared.pair_score import unit_rows
from tests.contamination_data import captions, noise_png, planted_queries, write_eval_set

pytestmark = pytest.mark.timeout(300)

BENCHMARK = ["Copper moths navigate by a violet harbor light", "A ceramic robot counts rain on the station roof",
             "The quiet river keeps seven paper lanterns"]
CORPUS = ["Copper moths navigate by a violet harbor light", "A CERAMIC robot counts rain upon the station roof",
          "Unrelated public sentence about orchard tools"]
# signature(text, seeds) printed by the seed's script (node fixture.mjs)
SEED_SIGNATURES = {
    BENCHMARK[0]: [157557135, 1195533007, 1485148258, 713375977, 717224655, 680965149, 436244703, 539680841],
    BENCHMARK[1]: [574886296, 610980792, 439816537, 411090993, 60321167, 311289993, 677524834, 96924930],
    BENCHMARK[2]: [72972190, 163154960, 288497971, 1263711346, 820201541, 28495891, 232183424, 830387575],
    CORPUS[1]: [465919116, 484851943, 780878373, 1581749568, 73221418, 226688804, 677524834, 3476980],
    CORPUS[2]: [1207884737, 1388990089, 311480819, 304635835, 53460151, 1213100207, 3175574288, 585579487],
    "Ünïcödé ＦＵＬＬＷＩＤＴＨ text — with_under_scores 12,5 ½ ①":
        [257889503, 8523636, 27923546, 386035799, 487836381, 347750257, 24174293, 66463059],
}
# the script's receipt rows: (benchmarkHash, rawOverlap.sourceHash, exact, normalized, direct, signature, decision)
SEED_ROWS = [
    ("2fb54529579e8fa1fb100fc85ba68ab7552ce18b637e138fe676781344f31ef5",
     "2fb54529579e8fa1fb100fc85ba68ab7552ce18b637e138fe676781344f31ef5", True, True, 1.0, 1.0, "quarantine"),
    ("75e79489890f965665355c048f32c3fe65ee89710278114a1fb4e30ef8e84c9c",
     "3786749cd4678c245b065d7aeb310f346444ad6b845fff4b3b5f67e2340f796c", False, False, 0.4, 0.125, "quarantine"),
    ("e4f0a60d815a63c487af736f5bf7873930211bbaa586cd362cd513e8b68097fa",
     "2fb54529579e8fa1fb100fc85ba68ab7552ce18b637e138fe676781344f31ef5", False, False, 0.0, 0.0, "retain"),
]
def best_match(item: canary.TextFacts, docs: list[canary.TextFacts]) -> tuple[int, canary.PairScores]:
    """The seed's best corpus text: max(direct, signature), then exact, then normalised; the first in
    corpus order on ties (the order tasks/contamination/text_scan.py ranks pairs by)."""
    scores = [canary.compare(item, doc) for doc in docs]
    i = max(range(len(docs)), key=lambda j: (max(scores[j].direct, scores[j].signature), scores[j].exact,
                                            scores[j].normalized, -j))
    return i, scores[i]


SEED_CORPUS_HASH = "655270001c68912b340c4e442e746041f255fecb6a8d84d9cfc2e16c904da262"
SEED_BENCHMARK_HASH = "bca6ce0366f2e401bbe25e8998592d13381b2f6a84f3e58af070af8b1afa580d"


# ---- text canaries: the rules -----------------------------------------------------------
def test_seed_fixture_signatures_scores_and_decisions():
    docs = [canary.TextFacts.of(t) for t in CORPUS]
    for text, expected in SEED_SIGNATURES.items():
        assert canary.signature(canary.shingles(canary.normalize(text))) == expected
    rows = []
    for text in BENCHMARK:
        item = canary.TextFacts.of(text)
        i, s = best_match(item, docs)
        rows.append((item.sha256, docs[i].sha256, s.exact, s.normalized, s.direct, s.signature,
                     canary.decide(s, canary.CanaryThresholds())[0]))
    assert rows == SEED_ROWS
    stringify = lambda xs: json.dumps(xs, separators=(",", ":"), ensure_ascii=False)  # noqa: E731
    assert hashlib.sha256(stringify(CORPUS).encode()).hexdigest() == SEED_CORPUS_HASH
    assert hashlib.sha256(stringify(BENCHMARK).encode()).hexdigest() == SEED_BENCHMARK_HASH


def test_normalisation_class_is_exactly_not_letters_or_digits():
    pattern = re.compile(r"[\W_]")
    assert all((unicodedata.category(chr(c))[0] in "LN") == (pattern.match(chr(c)) is None)
               for c in range(0x110000))
    assert canary.normalize("  Hello,  WORLD!! ＡＢＣ ½ ") == "hello world abc 1 2"


def test_rounding_is_javascript_tofixed_half_up():
    assert canary.round3(1 / 16) == 0.063  # Python's round() would give 0.062
    assert canary.round3(0.4) == 0.4 and canary.round3(2 / 3) == 0.667


def test_short_texts_neither_vanish_nor_all_match():
    a, b = canary.TextFacts.of("dog, grass"), canary.TextFacts.of("red car")
    assert a.signature is not None and canary.compare(a, b).signature == 0.0
    assert canary.decide(canary.compare(a, b), canary.CanaryThresholds())[0] == "retain"
    same = canary.compare(a, canary.TextFacts.of("Dog; GRASS"))
    assert canary.decide(same, canary.CanaryThresholds()) == ("quarantine", "normalized")
    empty = canary.TextFacts.of("!!!")
    assert empty.signature is None and canary.compare(empty, canary.TextFacts.of("...")).normalized is False


def test_review_band_sits_below_quarantine():
    t = canary.CanaryThresholds(review_direct_jaccard=0.2, review_signature=0.25)
    assert canary.decide(canary.PairScores(False, False, 0.25, 0.0, 1, 4), t) == ("review", "direct_jaccard>=0.2")
    assert canary.decide(canary.PairScores(False, False, 0.1, 0.25, 1, 10), t) == ("review", "signature>=0.25")
    assert canary.decide(canary.PairScores(False, False, 0.4, 0.25, 4, 10), t) == ("quarantine", "direct_jaccard>=0.4")
    with pytest.raises(ValueError, match="below its quarantine"):
        TextCanaryConfig(review_signature=0.5)


def test_vectorised_facts_equal_the_reference():
    texts = captions(300, 3) + ["", "two words", "Ünïcödé ＦＵＬＬＷＩＤＴＨ text", "!!!", "a b c d e f g"]
    batch = text_batch(texts)
    for i, t in enumerate(texts):
        ref = canary.TextFacts.of(t)
        assert batch.sha256[i] == ref.sha256 and batch.normalized_sha256[i] == ref.normalized_sha256
        assert batch.n_grams[i] == len(ref.grams)
        assert (batch.signature[i].tolist() if batch.has_signature[i] else None) == \
            (list(ref.signature) if ref.signature else None)
    # Jaccard over 64-bit shingle identities equals Jaccard over the shingle strings
    def grams_of(i: int) -> np.ndarray:
        return batch.gram_ids[batch.gram_offsets[i]:batch.gram_offsets[i + 1]]

    for i, j in [(0, 1), (5, 5), (10, 200)]:
        a, b = canary.TextFacts.of(texts[i]), canary.TextFacts.of(texts[j])
        inter = len(np.intersect1d(grams_of(i), grams_of(j)))
        assert inter == len(a.grams & b.grams)


def test_signature_bands_catch_every_pair_at_the_signature_threshold():
    choice = choose_bands(8, 0.375, 64, 2)
    assert len(choice.signature_subsets) == 56 and choice.lsh_bands == 32
    assert choice.jaccard_candidate_probability(0.4) > 0.996
    # any 3 agreeing positions contain a whole band
    for agree in [(0, 3, 7), (1, 2, 6), (4, 5, 6)]:
        assert tuple(sorted(agree)) in choice.signature_subsets


def test_band_keys_pair_what_datasketch_minhash_lsh_pairs():
    """The signature and LSH bands are MinHash LSH banding as datasketch does it: texts that
    share a band key are exactly the pairs ``MinHashLSH(params=(b, r))`` returns. The stage
    keys the bands itself (64-bit keys joined out of core, by key range, with a per-key cap)
    because MinHashLSH keeps every band table in one process's memory."""
    from datasketch import LeanMinHash, MinHashLSH

    from tasks.contamination.lsh import band_keys

    rng = np.random.default_rng(0)
    words = ["harbor", "violet", "copper", "moth", "light", "robot", "rain", "roof", "river", "lantern", "paper"]
    base = [" ".join(rng.choice(words, 9)) for _ in range(12)]
    texts = base + [" ".join(w if rng.random() > 0.25 else "tide" for w in t.split()) for t in base for _ in range(3)]
    batch = text_batch(texts, num_perm=64)
    choice = choose_bands(8, 0.375, 64, 2)
    rows, bands, keys = band_keys(batch, choice, np.zeros(len(texts), dtype=bool))
    ours = set()
    for band, key in {(int(b), int(k)) for b, k in zip(bands, keys, strict=True) if b >= 2}:
        members = sorted(rows[(bands == band) & (keys == np.uint64(key))].tolist())
        ours |= {(a, b) for i, a in enumerate(members) for b in members[i + 1:]}

    def datasketch_pairs(vectors: np.ndarray, b: int, r: int) -> set[tuple[int, int]]:
        lsh, sketches = MinHashLSH(num_perm=b * r, params=(b, r)), []
        for i, v in enumerate(vectors):
            sketches.append(LeanMinHash(seed=0, hashvalues=v.astype(np.uint64), scheme="legacy"))  # 32-bit values
            lsh.insert(i, sketches[-1])
        return {(min(i, j), max(i, j)) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i}

    m = len(choice.signature_subsets[0])
    subsets = np.concatenate([batch.signature[:, list(s)] for s in choice.signature_subsets], axis=1)
    expected = (datasketch_pairs(subsets, len(choice.signature_subsets), m)
                | datasketch_pairs(batch.lsh, choice.lsh_bands, choice.rows_per_band))
    assert len(ours) > 20 and ours == expected


# ---- text canaries: the stage -------------------------------------------------------------
def _text_run(tmp_path, bench: list[str], corpus: list[str], mode: str, **lsh) -> tuple[Store, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"b{i}" for i in range(len(bench))], "prompt": bench}), tmp_path / "bench.parquet")
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n")
    ecfg = EvalSetConfig(source=str(tmp_path / "bench.parquet"), text_fields=["prompt"], image_column=None,
                         chunk_size=max(1, len(bench) // 3))
    tcfg = TextCanaryConfig(corpus=TextCorpusConfig(kind="table", path=str(tmp_path / "corpus.txt"), part_size=997),
                            lsh=LshConfig(mode=mode, **lsh))
    out = Store(str(tmp_path / "out"))
    cuts = cut_eval_set(ecfg)
    stage_eval_set(out, out.sub("eval"), cuts, ecfg)
    return out, text_canary_stage(out, None, [c.name for c in cuts.chunks], ["prompt"], tcfg)


def _rows(out: Store) -> list[dict]:
    return pa.concat_tables([out.read_parquet(f"contamination/text/{n}") for n in out.listdir("contamination/text")
                             if n.endswith(".parquet")]).to_pylist()


@pytest.mark.parametrize("mode", ["exhaustive", "lsh"])
def test_seed_fixture_through_the_stage(tmp_path, mode):
    out, summary = _text_run(tmp_path, BENCHMARK, CORPUS, mode)
    rows = sorted(_rows(out), key=lambda r: r["item_id"])
    assert [r["decision"] for r in rows] == ["quarantine", "quarantine", "retain"]
    assert [r["rule"] for r in rows] == ["exact", "direct_jaccard>=0.4", ""]
    assert [r["signature"] for r in rows] == [SEED_SIGNATURES[t] for t in BENCHMARK]
    assert rows[1]["match_signature"] == SEED_SIGNATURES[CORPUS[1]]
    got = [(r["text_sha256"], r["match_sha256"], r["exact"], r["normalized"], r["direct_jaccard"],
            r["signature_estimate"], r["decision"]) for r in rows]
    if mode == "exhaustive":  # every pair compared: the seed's evidence, row for row
        assert got == SEED_ROWS
    else:  # LSH proposes no pair for the clean control: no best match at all
        assert got[:2] == SEED_ROWS[:2] and rows[2]["match_sha256"] is None
    assert summary["decisions"] == {"quarantine": 2, "review": 0, "retain": 1, "empty": 0}
    assert summary["recall"]["recall"] == 1.0


def test_lsh_finds_every_rule_pair_that_brute_force_finds(tmp_path):
    corpus = captions(3000, 11)
    queries, kinds = planted_queries(corpus, 50, 12)
    out, summary = _text_run(tmp_path, queries, corpus, "lsh", recall_sample=len(queries), buckets=3)
    recall = summary["recall"]
    # every query compared with every corpus caption: recall of the LSH join, stated
    assert recall["sampled_queries"] == len(queries) and recall["rule_pairs"] > 100
    assert recall["recall"] == 1.0, recall
    assert summary["pairs_compared"] < summary["all_pairs"] / 10  # template captions share many shingles
    by_id = {r["item_id"]: r for r in _rows(out)}
    decided = {k: [by_id[f"b{i}"]["decision"] for i, kk in enumerate(kinds) if kk == k] for k in set(kinds)}
    assert set(decided["exact"]) == {"quarantine"} and set(decided["variant"]) == {"quarantine"}
    assert decided["light_edit"].count("quarantine") >= 40, decided["light_edit"]  # 8 % of words replaced
    assert set(decided["unrelated"]) == {"retain"}
    # the seed's warning, measured: formulaic captions cross its teaching thresholds
    assert decided["formulaic"].count("quarantine") > 25
    assert all(by_id[f"b{i}"]["rule"] == "exact" for i, k in enumerate(kinds) if k == "exact")
    # the same run, exhaustively: identical decisions
    out2, _ = _text_run(tmp_path / "x", queries, corpus, "exhaustive", exhaustive_max_pairs=10**9)
    assert {r["item_id"]: r["decision"] for r in _rows(out2)} == {k: r["decision"] for k, r in by_id.items()}


# ---- image-only rate, leakage, editions, receipts: on a real built corpus ----------------
def _tree_hashes(root) -> dict[str, str]:
    from pathlib import Path

    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(built_sample, sample_corpus):
    """The session's built sample corpus (wfd features, GPIC thresholds; tests/conftest.py),
    and its captions. The scans only read it."""
    captions = {r["key"]: r["caption"] for r in pq.read_table(sample_corpus / "metadata.parquet").to_pylist()}
    return built_sample[0], captions


def _config(corpus, bench, out, **over):
    from flows.contamination import ContaminationConfig

    data = {"corpus": str(corpus), "out": str(out),
            "eval_set": {"source": str(bench / "bench.parquet"), "text_fields": ["question", "answer"],
                         "answer_field": "answer", "category_field": "category", "chunk_size": 8},
            "judge": {}}
    for k, v in over.items():
        if v is None:
            data[k] = None
        elif isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return ContaminationConfig.model_validate(data)


@pytest.fixture(scope="module")
def scanned(built, tmp_path_factory):
    """One full run: 6 byte-identical and 6 edited training images, 2 held-out copies, 10 unrelated,
    1 undecodable."""
    from flows.contamination import contamination

    corpus, captions = built
    root = tmp_path_factory.mktemp("scan")
    planted = write_eval_set(root / "bench", corpus, captions, 6, 6, 10, held_out_copies=2, n_corrupt=1)
    before = {"bench": _tree_hashes(root / "bench"), "corpus": _tree_hashes(corpus)}
    result = contamination(_config(corpus, root / "bench", root / "out"))
    return root, planted, before, result


def test_image_rate_equals_the_planted_fraction(scanned):
    root, planted, _, result = scanned
    images = result["results"]["images"]
    assert (images["flagged"], images["embedded"]) == (12, 24) and images["rate"] == pytest.approx(12 / 24)
    assert images["image_errors"] == 1 and images["items"] == 25  # not in the denominator
    rows = pa.concat_tables([pq.read_table(p) for p in sorted((root / "out/contamination/images").glob("*.parquet"))])
    by_id = {r["item_id"]: r for r in rows.to_pylist()}
    assert {i for i, r in by_id.items() if r["flagged"]} == set(planted)
    assert all(by_id[i]["match_key"] == k for i, k in planted.items())
    assert {i for i, r in by_id.items() if r["exact_copy"]} == {f"copy{i}" for i in range(6)}
    assert all(by_id[f"held{i}"]["max_similarity"] < 0.9 for i in range(2))  # test split is not training data
    assert images["scan"]["search"] == "exact"
    curve = {c["threshold"]: c["flagged"] for c in images["curve"]}
    assert sorted(curve) == [round(0.8 + 0.01 * i, 2) for i in range(20)] and curve[0.99] <= curve[0.8]


def test_text_canaries_and_judge_find_copied_captions(scanned):
    root, planted, _, result = scanned
    text = result["results"]["text"]
    assert text["source"]["kind"] == "corpus_captions" and text["decisions"]["quarantine"] >= 6
    judge = result["results"]["image_text"]
    assert judge["judge"]["judge"] == "canary_overlap" and judge["inferable"] >= 6
    assert judge["judged"] == 24 and judge["rate"] == pytest.approx(judge["inferable"] / 24)
    assert judge["no_image"] == 1  # the undecodable image: nothing retrieved, not judged


def test_leakage_is_zero_at_the_build_threshold(scanned):
    leak = scanned[3]["results"]["leakage"]
    assert leak["build_thresholds"] == [0.9, 0.9625]
    at = {r["threshold"]: r for r in leak["rates"]}
    assert at[0.9]["leaking"] == 0 and at[0.9]["held_out"] > 0 and at[0.9625]["leaking"] == 0


def test_edition_is_new_files_and_inputs_are_untouched(built, scanned):
    root, planted, before, result = scanned
    assert _tree_hashes(root / "bench") == before["bench"]
    assert _tree_hashes(built[0]) == before["corpus"]
    edition = result["edition"]
    assert edition["denominators"] == {"original": 25, "revised": 13, "quarantined": 12}
    lost = {c["category"]: c["lost"] for c in edition["coverage"]}
    assert lost == {"broken": 0, "clean": 0, "copies": 6, "edits": 6, "held_out": 0}
    mapping = pq.read_table(root / "out/edition/mapping.parquet").to_pylist()
    assert {m["previous_id"] for m in mapping if m["status"] == "quarantined"} == set(planted)
    new = pq.read_table(root / "out/edition/items.parquet").to_pylist()
    assert [n["new_id"] for n in new] == [f"{edition['edition']}-{i:06d}" for i in range(13)]
    assert not {n["new_id"] for n in new} & {m["previous_id"] for m in mapping}
    receipt = json.loads((root / "out/contamination/receipt.json").read_text())
    bench = receipt["benchmark"]
    assert bench["input_files_sha256"] == {str(root / "bench/bench.parquet"): before["bench"]["bench.parquet"]}
    assert len(bench["item_sha256"]) == 25 and receipt["corpus"]["receipt_sha256"] == before["corpus"]["receipt.json"]
    report = (root / "out/contamination/report.md").read_text()
    assert "Overlap found for **12 of 24**" in report and "slice quarantined" in report
    assert "contaminated model" not in report.lower() and "contaminated" not in report.lower()
    assert (root / "out/contamination/report.html").read_text().count("data:image/jpeg;base64") >= 24


def test_rerun_reuses_every_unit_and_writes_the_same_receipt(built, scanned):
    from flows.contamination import contamination

    root = scanned[0]
    receipt = (root / "out/contamination/receipt.json").read_bytes()
    again = contamination(_config(built[0], root / "bench", root / "out"))
    assert again["results"]["images"]["scan"]["search"] == "exact"
    assert (root / "out/contamination/receipt.json").read_bytes() == receipt


def test_ivf_search_finds_the_same_overlap_and_reports_recall(built, scanned, tmp_path):
    from flows.contamination import contamination

    root = scanned[0]
    result = contamination(_config(built[0], root / "bench", tmp_path / "ivf", judge=None, text=None, leakage=None,
                                   image={"search": "ivf", "ivf": {"nlist": 2, "nprobe": 1}}))
    images = result["results"]["images"]
    assert images["scan"]["search"] == "ivf" and images["scan"]["index"]["plan"]["nlist"] == 2
    assert (images["flagged"], images["embedded"]) == (12, 24)
    assert images["scan"]["recall"]["recall_flagged"] == 1.0


def test_random_init_clip_flags_byte_identical_copies(built, tmp_path):
    """Random weights mean nothing, except that identical bytes give identical features."""
    import shutil

    from flows.contamination import contamination
    from tasks.shared.features.config import FeaturesConfig
    from tasks.shared.features.extract import extract_features
    from corpusforge.contract import completed_units

    corpus = tmp_path / "corpus"
    shutil.copytree(built[0], corpus)
    features = {"models": [{"name": "clip", "arch": "ViT-S-32", "random_init": True, "image_size": 32}],
                "runtime": {"batch_size": 64}}
    store = Store(str(corpus))
    extract_features(store, completed_units(store, "staging/tars", ".tar"), FeaturesConfig.model_validate(features))
    planted = write_eval_set(tmp_path / "bench", corpus, built[1], 5, 0, 5, seed=3)
    result = contamination(_config(corpus, tmp_path / "bench", tmp_path / "out", judge=None, text=None, leakage=None,
                                   features=features, image={"model_id": "clip_vit_s_32_s32"}))
    images = result["results"]["images"]
    assert (images["flagged"], images["embedded"]) == (len(planted), 10) and images["exact_copies"] == 5
    assert images["feature_identity"]["random_init"] and any("RANDOM-INIT" in w for w in result["warnings"])


def test_evaluation_set_is_embedded_only_for_the_scan_model_at_the_corpus_decode_size(built, tmp_path):
    """The corpus's features were made by two models together (their decode size is the
    larger input's); the evaluation set is embedded for the scan's model alone, decoded at
    that same size, so the scan accepts it, and a rerun embeds nothing."""
    import shutil

    from flows.contamination import contamination
    from corpusforge.contract import completed_units
    from corpusforge.feature_files import feature_marker
    from tasks.shared.features.config import FeaturesConfig
    from tasks.shared.features.extract import decode_size, extract_features, load_models

    corpus = tmp_path / "corpus"
    shutil.copytree(built[0], corpus)
    features = {"models": [{"name": "wfd"}, {"name": "clip", "arch": "ViT-S-32", "random_init": True,
                                             "image_size": 64}], "runtime": {"batch_size": 64}}
    fcfg = FeaturesConfig.model_validate(features)
    both = decode_size(load_models(fcfg))
    assert both != decode_size(load_models(fcfg.model_copy(update={"models": fcfg.models[:1]})))
    store = Store(str(corpus))
    extract_features(store, completed_units(store, "staging/tars", ".tar"), fcfg)
    planted = write_eval_set(tmp_path / "bench", corpus, built[1], 4, 0, 4, seed=5)
    config = _config(corpus, tmp_path / "bench", tmp_path / "out", judge=None, text=None, leakage=None,
                     features=features, image={"model_id": "wfd"})
    result = contamination(config)
    images = result["results"]["images"]
    assert (images["flagged"], images["embedded"]) == (len(planted), 8)
    assert sorted(p.name for p in (tmp_path / "out/eval/features").iterdir()) == ["wfd"]
    eval_store = Store(str(tmp_path / "out/eval"))
    chunk = completed_units(eval_store, "staging/tars", ".tar")[0]
    assert feature_marker(eval_store, "wfd", chunk).info["decode_size"] == both
    receipt = (tmp_path / "out/contamination/receipt.json").read_bytes()
    vectors = tmp_path / "out/eval/features/wfd/vectors" / f"{chunk}.npy"
    written = vectors.stat().st_mtime_ns
    contamination(config)  # rerun: the chunk's features are skipped, the receipt is the same bytes
    assert (tmp_path / "out/contamination/receipt.json").read_bytes() == receipt
    assert vectors.stat().st_mtime_ns == written


def test_evaluation_features_with_other_settings_are_refused(built, scanned, tmp_path):
    from flows.contamination import contamination
    from tasks.contamination.image_scan import FeatureMismatch

    with pytest.raises(FeatureMismatch, match="dtype"):
        contamination(_config(built[0], scanned[0] / "bench", tmp_path / "o", judge=None, text=None, leakage=None,
                              features={"models": [{"name": "wfd"}], "dtype": "float32"}))


def test_leakage_between_two_corpora(built, tmp_path):
    """A second 'corpus' whose training split holds the first one's test images."""
    import shutil

    from flows.contamination import contamination

    other = tmp_path / "other"
    shutil.copytree(built[0], other)
    for p in sorted((other / "manifest").glob("*.parquet")):
        t = pq.read_table(p).to_pylist()
        for r in t:
            r["split"] = {"test": "train", "train": "test"}.get(r["split"], r["split"])
        pq.write_table(pa.Table.from_pylist(t, schema=pq.read_schema(p)), p)
    result = contamination(_config(built[0], tmp_path, tmp_path / "out", eval_set=None, judge=None, text=None,
                                   image=None, leakage={"against": str(other), "held_out": ["test"]}))
    at = {r["threshold"]: r for r in result["results"]["leakage"]["rates"]}
    assert at[0.9]["leaking"] == at[0.9]["held_out"] > 0  # every test image is in the other corpus's train split
    pairs = pa.concat_tables([pq.read_table(p) for p in (tmp_path / "out/contamination/leakage").glob("*.parquet")])
    assert min(pairs.filter(pa.compute.equal(pairs["rank"], 0))["similarity"].to_pylist()) > 0.999


# ---- the image–text judges ----------------------------------------------------------------
def _judge_input(answer="a red car", captions=(("k1", "A red car parks by the river.", 0.95),)):
    from tasks.contamination.judge import JudgeInput

    return JudgeInput("item", "What is in the picture?", answer, tuple(captions))


def test_canary_overlap_judge():
    from tasks.contamination.config import JudgeConfig
    from tasks.contamination.judge import CanaryOverlapJudge

    judge = CanaryOverlapJudge(JudgeConfig())
    assert judge.judge(_judge_input()).verdict == "inferable"
    assert judge.judge(_judge_input("a blue boat")).verdict == "not_inferable"
    assert judge.judge(_judge_input("yes")).verdict == "unresolved"  # too short for overlap to tell
    assert judge.judge(_judge_input(captions=())).verdict == "not_inferable"


@pytest.mark.parametrize("script, retries, verdict, attempts, error", [
    (["true"], 2, "inferable", 1, None),
    (["fenced"], 0, "inferable", 1, None),
    (["slow", "false"], 2, "not_inferable", 2, None),
    (["500", "429", "true"], 2, "inferable", 3, None),
    (["500", "500", "500"], 2, "unresolved", 3, "gave up after 3 attempts: HTTP 500"),
    (["slow", "slow"], 1, "unresolved", 2, "timeout"),
    (["garbage"], 2, "unresolved", 1, "malformed response"),
    (["nochoices"], 2, "unresolved", 1, "malformed response"),
    (["prose"], 2, "unresolved", 1, "no boolean 'inferable'"),
    (["400"], 2, "unresolved", 1, "HTTP 400"),
])
def test_chat_judge_survives_slow_failing_and_malformed_endpoints(monkeypatch, script, retries, verdict, attempts,
                                                                   error):
    from tasks.contamination.config import ChatJudgeConfig
    from tasks.contamination.judge import ChatJudge
    from tests.chat_stub import chat_stub

    monkeypatch.setenv("STUB_KEY", "sk-test-secret")
    with chat_stub(script=script, slow_s=1.0) as stub:
        cfg = ChatJudgeConfig(base_url=stub.base_url, model="stub-1", api_key_env="STUB_KEY", timeout_s=0.3,
                              retries=retries, backoff_s=0)
        judge = ChatJudge(cfg)
        v = judge.judge(_judge_input())
    assert (v.verdict, v.attempts) == (verdict, attempts)
    assert (v.error is None) if error is None else (error in v.error)
    sent = stub.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == "stub-1"
    assert sent["body"]["temperature"] == 0 and "A red car parks" in sent["body"]["messages"][1]["content"]
    assert sent["headers"]["Authorization"] == "Bearer sk-test-secret"
    assert "sk-test-secret" not in json.dumps(judge.identity())


def test_chat_judge_without_a_server_is_unresolved():
    from tasks.contamination.config import ChatJudgeConfig
    from tasks.contamination.judge import ChatJudge
    from tests.chat_stub import chat_stub

    with chat_stub() as stub:
        url = stub.base_url
    v = ChatJudge(ChatJudgeConfig(base_url=url, model="m", timeout_s=0.5, retries=1, backoff_s=0)).judge(_judge_input())
    assert v.verdict == "unresolved" and "connection error" in v.error and v.attempts == 2


def test_flow_with_the_chat_judge_names_it_and_counts_unresolved(built, scanned, tmp_path):
    from flows.contamination import contamination
    from tests.chat_stub import chat_stub

    def reply(body: dict) -> str:  # copies are inferable; every item asking about fractals gets prose
        user = body["messages"][1]["content"]
        return "prose" if "fractal" in user else ("true" if "What does the picture show?" in user else "false")

    with chat_stub(default=reply) as stub:
        result = contamination(_config(built[0], scanned[0] / "bench", tmp_path / "out", text=None, leakage=None,
                                       judge={"kind": "chat", "chat": {"base_url": stub.base_url, "model": "stub-1",
                                                                       "timeout_s": 2, "backoff_s": 0}}))
    j = result["results"]["image_text"]
    assert j["judge"]["judge"] == "chat" and j["judge"]["model"] == "stub-1"
    assert (j["judged"], j["inferable"], j["unresolved"]) == (24, 6, 10)
    assert j["not_inferable"] == 8 and len(stub.requests) == 24
    report = (tmp_path / "out/contamination/report.md").read_text()
    assert "Judge: `chat`" in report and "exposure unresolved: **10**" in report


# ---- receipts, inputs, the CLI and the Dask flow ----------------------------------------
def _text_only(built, tmp_path, out="out", **text):
    bench, corpus = tmp_path / "bench.parquet", tmp_path / "corpus.txt"
    if not bench.exists():
        pq.write_table(pa.table({"id": ["b1", "b2", "b3"], "prompt": BENCHMARK}), bench)
        corpus.write_text("\n".join(CORPUS) + "\n")
    return _config(built[0], tmp_path, tmp_path / out, judge=None, image=None, leakage=None,
                   eval_set={"source": str(bench), "text_fields": ["prompt"], "answer_field": None,
                             "category_field": None, "image_column": None},
                   text={"corpus": {"kind": "table", "path": str(corpus)}, **text})


def test_receipt_changes_with_any_input_byte_seed_or_threshold_and_not_otherwise(built, tmp_path):
    from flows.contamination import contamination

    def receipt(config) -> bytes:
        contamination(config)
        return (tmp_path / "out/contamination/receipt.json").read_bytes()

    base = receipt(_text_only(built, tmp_path))
    assert receipt(_text_only(built, tmp_path)) == base
    assert receipt(_text_only(built, tmp_path).model_copy(update={"dask": {"n_workers": 7}})) == base
    seeds = list(canary.SEED_SIGNATURE_SEEDS[:-1]) + [212]
    assert receipt(_text_only(built, tmp_path, seeds=seeds)) != base
    assert receipt(_text_only(built, tmp_path, direct_jaccard=0.5)) != base
    assert receipt(_text_only(built, tmp_path, lsh={"seed": 1})) != base
    assert receipt(_text_only(built, tmp_path)) == base
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus.read_text().replace("orchard", "Orchard"))
    changed = receipt(_text_only(built, tmp_path))
    assert changed != base
    bench = tmp_path / "bench.parquet"
    pq.write_table(pa.table({"id": ["b1", "b2", "b3"], "prompt": [BENCHMARK[0], BENCHMARK[1], BENCHMARK[2] + "."]}),
                   bench)
    assert receipt(_text_only(built, tmp_path)) not in (base, changed)
    data = json.loads(base)
    assert data["seeds"]["signature"] == list(canary.SEED_SIGNATURE_SEEDS)
    assert data["thresholds"]["text"]["signature"] == 0.375 and data["normalization_profile"]["unicode"] == "NFKC"
    assert data["benchmark"]["item_sha256"]["b1"] and data["code_version"].startswith("0.")


def test_evaluation_folders_and_tars_with_sidecars_and_bad_items(tmp_path):
    import io
    import tarfile

    from tasks.contamination.eval_set import stage_chunk

    rng = np.random.default_rng(0)
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub/a.png").write_bytes(noise_png(rng))
    (folder / "sub/a.txt").write_text("a caption for a")
    (folder / "sub/a.json").write_text(json.dumps({"answer": "forty two", "ignored": 1}))
    (folder / "b.png").write_bytes(b"")
    cfg = EvalSetConfig(source=str(folder), text_fields=["caption"], answer_field="answer")
    plan = cut_eval_set(cfg)
    out = Store(str(tmp_path / "out"))
    stage_chunk(out, out.sub("eval"), plan.chunks[0], cfg)
    rows = {r["item_id"]: r for r in out.read_parquet("eval/items/000000.parquet").to_pylist()}
    assert rows["sub/a.png"]["answer"] == "forty two" and json.loads(rows["sub/a.png"]["texts"]) == {
        "caption": "a caption for a"}
    assert rows["b.png"]["image_error"] == "empty_file" and rows["sub/a.png"]["image_sha256"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [("x1.png", noise_png(rng)), ("x1.txt", b"tar caption"), ("x2.txt", b"no image")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "set.tar").write_bytes(buf.getvalue())
    cfg = EvalSetConfig(source=str(tmp_path / "set.tar"), text_fields=["caption"])
    stage_chunk(out, out.sub("eval"), cut_eval_set(cfg).chunks[0], cfg)
    rows = {r["item_id"]: r for r in out.read_parquet("eval/items/000000.parquet").to_pylist()}
    assert set(rows) == {"set/x1", "set/x2"} and rows["set/x2"]["image_error"] == "no_image_member"
    table = tmp_path / "t.jsonl"
    table.write_text("\n".join(json.dumps(r) for r in [{"id": "p", "path": "../escape.png"},
                                                      {"id": "q", "path": "missing.png"}]))
    cfg = EvalSetConfig(source=str(table))
    stage_chunk(out, out.sub("eval"), cut_eval_set(cfg).chunks[0], cfg)
    rows = {r["item_id"]: r for r in out.read_parquet("eval/items/000000.parquet").to_pylist()}
    assert rows["p"]["image_error"] == "unsafe_path: '../escape.png': path escapes the source folder"
    assert rows["q"]["image_error"] == "missing_file: missing.png"  # the build's reasons
    table.write_text("\n".join(json.dumps({"id": "same", "path": None}) for _ in range(2)))
    with pytest.raises(ValueError, match="unique"):
        cut_eval_set(EvalSetConfig(source=str(table)))


@pytest.mark.parametrize("where", ["corpus", "corpus/inside", "bench", "."])
def test_output_overlapping_anything_read_is_refused(built, tmp_path, where):
    from flows.contamination import contamination

    targets = {"corpus": built[0], "corpus/inside": built[0] / "inside", "bench": tmp_path, ".": tmp_path.parent}
    config = _text_only(built, tmp_path).model_copy(update={"out": str(targets[where])})
    with pytest.raises(ValueError, match="overlaps"):
        contamination(config)
    assert not (built[0] / "contamination").exists()


def test_cli_subcommand(built, tmp_path, capsys, monkeypatch):
    """The subcommand's wiring (YAML → config → runner → JSON); the runner runs in-process here
    (the Dask flow itself is the next test)."""
    import yaml

    import flows.contamination as module
    from flows.cli import main

    monkeypatch.setattr(module, "run_contamination", module.contamination)
    config = _text_only(built, tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    assert main(["contamination", "--config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["results"]["text"]["decisions"]["quarantine"] == 2
    assert (tmp_path / "out/contamination/report.md").exists()


def test_flow_on_two_dask_workers_equals_the_in_process_run(built, tmp_path, prefect_server):
    from corpusforge.cluster import DaskConfig
    from flows.contamination import contamination, contamination_flow

    corpus = captions(400, 5)
    queries, _ = planted_queries(corpus, 4, 6)
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(len(queries))], "prompt": queries}), tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text("\n".join(corpus) + "\n")

    def config(out: str, dask: DaskConfig):
        return _config(built[0], tmp_path, tmp_path / out, judge=None, image=None, leakage=None, dask=dask,
                       eval_set={"source": str(tmp_path / "b.parquet"), "text_fields": ["prompt"],
                                 "answer_field": None, "category_field": None, "image_column": None,
                                 "chunk_size": 10},
                       text={"corpus": {"kind": "table", "path": str(tmp_path / "c.txt"), "part_size": 150},
                             "lsh": {"mode": "lsh", "buckets": 2}})

    contamination_flow(config("dask", DaskConfig(n_workers=2, threads_per_worker=1, processes=True)))
    contamination(config("local", DaskConfig()))
    for folder in ("contamination/text", "contamination/items", "edition"):
        assert _tree_hashes(tmp_path / "dask" / folder) == _tree_hashes(tmp_path / "local" / folder), folder
    assert (tmp_path / "dask/contamination/summary.json").read_bytes() == \
        (tmp_path / "local/contamination/summary.json").read_bytes()


# ---- the pair rule: wfd greyscale copies count as contamination --------------------------
def _rule_reference(q: np.ndarray, t: np.ndarray, rule: dict | None) -> np.ndarray:
    """Every query × target score by the pair rule, written out directly in float64: the
    cosine, or the layout blocks' cosine when either image's colour presence is below the
    rule's level (``rule`` None: plain cosine)."""
    q = q.astype(np.float64) / np.linalg.norm(q.astype(np.float64), axis=1, keepdims=True)
    t = t.astype(np.float64) / np.linalg.norm(t.astype(np.float64), axis=1, keepdims=True)
    cosine = q @ t.T
    if rule is None:
        return cosine
    n_layout, w = q.shape[1] - rule["colour_dims"], rule["colour_weight"]

    def split(x):
        layout, colour = x[:, :n_layout], x[:, n_layout:]
        presence = np.linalg.norm(colour, axis=1) / np.linalg.norm(layout, axis=1) * np.sqrt((1 - w) / w)
        return layout / np.linalg.norm(layout, axis=1, keepdims=True), presence < rule["colourless_below"]

    (uq, grey_q), (ut, grey_t) = split(q), split(t)
    return np.where(grey_q[:, None] | grey_t[None, :], uq @ ut.T, cosine)


def _reference_topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Target ids by score, best first, ties to the smaller id."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


LAYOUT, COLOUR, WEIGHT = 24, 8, 0.25
WFD_RULE = {"name": "layout_when_colourless", "colour_dims": COLOUR, "colour_weight": WEIGHT, "colourless_below": 0.5}


def _wfd_like(layout: np.ndarray, colour: np.ndarray, presence: float) -> np.ndarray:
    """A wfd-shaped unit row: layout block weighing 1 - w, colour block ``presence`` of a full one."""
    u = layout / np.linalg.norm(layout)
    c = np.abs(colour) / np.linalg.norm(colour) * np.sqrt(WEIGHT) * presence
    row = np.concatenate([np.sqrt(1 - WEIGHT) * u, c])
    return row / np.linalg.norm(row)


def _near(u: np.ndarray, cosine: float, rng) -> np.ndarray:
    """A direction at the given cosine from unit ``u``."""
    v = rng.standard_normal(len(u))
    v -= (v @ u) * u
    return cosine * u + np.sqrt(1 - cosine**2) * v / np.linalg.norm(v)


def test_plain_cosine_models_are_unchanged():
    """A model without a pair rule (SSCD, CLIP, ...) scores by the plain cosine: the block
    scores are ``q @ t.T`` exactly as before, and the top-k equals the float64 reference."""
    from tasks.contamination import similarity as sim
    from tasks.shared.pair_score import PairScore

    rule = PairScore.from_model({"arch": "sscd", "dim": 32})
    assert not rule.active and rule.to_json() == {"name": "cosine"}
    rng = np.random.default_rng(5)
    q, t = unit_rows(rng.standard_normal((60, 32))), unit_rows(rng.standard_normal((700, 32)))
    assert np.array_equal(sim.rule_matrix(rule, q, t), q @ t.T)
    ref = _rule_reference(q, t, None)
    for r in (None, rule):
        s, i = sim.exact_topk(q, t, 5, 100, r)
        assert np.array_equal(i - 100, _reference_topk(ref, 5))
        np.testing.assert_allclose(s, np.take_along_axis(ref, i - 100, axis=1), atol=1e-6)


def test_a_greyscale_copy_is_ranked_by_the_rule_not_by_the_index_forms():
    """Greyscale queries of coloured originals, among nearly grey coloured decoys (colour
    presence 0.55, layout cosine 0.90 to the copy against the original's 0.95) whose index
    forms over-estimate them by ~10 %: the exact top-k follows
    the rule's exact scores, equal to the float64 reference, while a top-(k+4) by the forms
    would lose the true best (so this test can fail)."""
    from tasks.contamination import similarity as sim
    from tasks.shared.pair_score import PairScore

    rule = PairScore.from_json(WFD_RULE)
    rng = np.random.default_rng(7)
    targets, queries = [], []
    for _ in range(12):
        layout, colour = rng.standard_normal(LAYOUT), rng.standard_normal(COLOUR)
        u = layout / np.linalg.norm(layout)
        grey = _near(u, 0.95, rng)
        targets.append(_wfd_like(u, colour, 1.0))                                        # the original
        targets += [_wfd_like(_near(grey, 0.9, rng), colour, 0.55) for _ in range(6)]  # decoys
        queries.append(_wfd_like(grey, colour, 0.0))                                     # its greyscale copy
    targets += [_wfd_like(rng.standard_normal(LAYOUT), rng.standard_normal(COLOUR), 1.0) for _ in range(200)]
    q = unit_rows(np.asarray(queries, np.float16))
    t = unit_rows(np.asarray(targets, np.float16))
    ref = _rule_reference(q, t, WFD_RULE)
    s, i = sim.exact_topk(q, t, 1, 0, rule)
    originals = np.arange(12) * 7
    assert np.array_equal(i[:, 0], originals) and np.array_equal(_reference_topk(ref, 1)[:, 0], originals)
    np.testing.assert_allclose(s[:, 0], ref[np.arange(12), originals], atol=1e-6)
    assert (s[:, 0] > 0.93).all() and (_rule_reference(q, t, None)[np.arange(12), originals] < 0.87).all()
    forms = rule.query_forms(q) @ rule.candidate_forms(t).T
    by_forms = np.argsort(-forms, axis=1, kind="stable")[:, :1 + sim.RESCORE_EXTRA]
    assert not (by_forms == originals[:, None]).any()


def _grey_run(built, root, out, image):
    from flows.contamination import contamination

    return contamination(_config(built[0], root / "bench", out, judge=None, text=None, leakage=None, image=image))


@pytest.fixture(scope="module")
def grey_scanned(built, tmp_path_factory):
    """An evaluation set of 4 greyscale copies of training images and 4 unrelated pictures."""
    root = tmp_path_factory.mktemp("grey")
    planted = write_eval_set(root / "bench", built[0], built[1], 0, 0, 4, seed=4, n_grey=4)
    return root, planted, _grey_run(built, root, root / "exact", {"search": "exact"})


def _scan_reference(corpus, out) -> dict[str, tuple[float, str, float]]:
    """Evaluation key → (best rule score, its training key, that pair's plain cosine), from
    the feature files, over the corpus's training split."""
    import pyarrow.dataset as ds

    from corpusforge.feature_files import list_feature_shards, read_shard_features, require_features
    from tasks.contamination.files import CONTAMINATION_EVAL

    corpus, evals = Store(str(corpus)), Store(str(out)).sub(CONTAMINATION_EVAL)
    train = {r["key"] for r in ds.dataset(f"{corpus.root}/manifest").to_table().to_pylist() if r["split"] == "train"}
    tk, tx = [], []
    for shard in list_feature_shards(corpus, "wfd"):
        keys, x = read_shard_features(corpus, "wfd", shard)
        tk += [k for k in keys if k in train]
        tx.append(x[[j for j, k in enumerate(keys) if k in train]])
        rule = require_features(corpus, "wfd", shard).info["model"]["pair_rule"]
    qk, qx = [], []
    for chunk in list_feature_shards(evals, "wfd"):
        keys, x = read_shard_features(evals, "wfd", chunk)
        qk += keys
        qx.append(x)
    q, t = np.concatenate(qx), np.concatenate(tx)
    scores, cosine = _rule_reference(q, t, rule), _rule_reference(q, t, None)
    best = scores.argmax(axis=1)
    return {key: (scores[j, best[j]], tk[best[j]], cosine[j, best[j]]) for j, key in enumerate(qk)}


@pytest.mark.parametrize("search", ["exact", "ivf"])
def test_a_greyscale_copy_of_an_evaluation_image_in_the_corpus_is_counted_as_contaminated(
        built, grey_scanned, search, tmp_path):
    """wfd: a greyscale copy scores the layout cosine against its original (by plain cosine it
    stays below 0.866 and would go unflagged); the exact scan and the IVF index over the
    rule's forms (rescored exactly) both flag it, with the reference's scores."""
    root, planted, result = grey_scanned
    out = root / "exact"
    if search == "ivf":
        out = tmp_path / "ivf"
        result = _grey_run(built, root, out, {"search": "ivf", "ivf": {"nlist": 2, "nprobe": 2}})
    images = result["results"]["images"]
    assert images["scan"]["search"] == search
    assert images["scan"]["pair_score"] == WFD_RULE | {"colour_dims": images["scan"]["pair_score"]["colour_dims"]}
    assert (images["flagged"], images["embedded"]) == (4, 8)
    rows = pa.concat_tables([pq.read_table(p) for p in sorted((out / "contamination/images").glob("*.parquet"))])
    by_id = {r["item_id"]: r for r in rows.to_pylist()}
    assert {i for i, r in by_id.items() if r["flagged"]} == set(planted)
    reference = _scan_reference(built[0], out)
    missed_by_cosine = 0
    for item_id, row in by_id.items():
        best, key, cosine = reference[row["key"]]
        assert row["max_similarity"] == pytest.approx(best, abs=1e-5) and row["match_key"] == key
        if item_id in planted:
            assert key == planted[item_id] and best > 0.9
            missed_by_cosine += cosine < 0.867  # sqrt(0.75) + float16: a coloured original
    assert missed_by_cosine >= 3  # of 4 (0.8655-0.8661, now 0.9994-1.0); the 4th original is nearly grey
    if search == "ivf":
        assert images["scan"]["recall"]["recall_flagged"] == 1.0
        assert images["scan"]["recall"]["pair_score"]["name"] == "layout_when_colourless"


def test_grey_rerun_equals_the_first_run_byte_for_byte(built, grey_scanned):
    root = grey_scanned[0]
    receipt = (root / "exact/contamination/receipt.json").read_bytes()
    files = _tree_hashes(root / "exact/contamination")
    again = _grey_run(built, root, root / "exact", {"search": "exact"})
    assert again["results"]["images"]["flagged"] == 4
    assert (root / "exact/contamination/receipt.json").read_bytes() == receipt
    assert _tree_hashes(root / "exact/contamination") == files


def test_ivf_probes_lists_for_coloured_and_colourless_members_alike():
    """wfd rows with a shared layout component, 10 % greyscale: choosing lists by the whole
    query form (the mean rule score to a list) loses coloured queries' greyscale copies;
    the scan's choice (each part of the form picks its own lists) finds copies of every kind."""
    from tasks.contamination import similarity as sim
    from tasks.shared.pair_score import PairScore

    rule = PairScore.from_json(WFD_RULE)
    rng = np.random.default_rng(11)
    common, n, m = rng.standard_normal(LAYOUT), 3000, 60
    layouts = common * 0.8 + rng.standard_normal((n, LAYOUT))
    colours = [rng.standard_normal(COLOUR) + 1.0 for _ in range(n)]
    t = np.stack([_wfd_like(layouts[j], colours[j], 1.0 if j < 0.9 * n else 0.0) for j in range(n)])
    picks = np.concatenate([np.arange(m), n - 1 - np.arange(m)])   # coloured originals, greyscale ones
    q = np.stack([_wfd_like(_near(layouts[j] / np.linalg.norm(layouts[j]), 0.97, rng), colours[j],
                            0.0 if j < 0.9 * n else 1.0) for j in picks])  # the other kind of copy
    t, q = unit_rows(t.astype(np.float16)), unit_rows(q.astype(np.float16))
    assert (rule.scores(q, t[picks]) > 0.95).all()
    index = sim.new_ivf(rule.form_dim(t.shape[1]), 32, "flat", 1, 0)
    index.train(rule.candidate_forms(t))
    index.add(rule.candidate_forms(t))
    qf = rule.query_forms(q)
    recall = {name: (sim.ivf_search_by_list(index, qf, 5, 4, probes)[1] == picks[:, None]).any(axis=1)
              for name, probes in (("whole", (qf,)), ("parts", rule.probe_parts(qf)))}
    assert recall["parts"].mean() >= 0.95, recall["parts"].mean()
    assert recall["whole"][m:].mean() < 0.5  # coloured queries, greyscale copies: lost by the whole form
