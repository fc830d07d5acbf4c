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
from tasks.contamination.eval_set import plan_eval_set
from tasks.contamination.lsh import band_plan
from tasks.contamination.signatures import text_batch
from tasks.contamination.stage import stage_eval_set, text_canary_stage
from tests.contamination_data import captions, planted_queries

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
        i, s = canary.best_match(item, docs)
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


def test_vectorised_facts_equal_the_reference():
    texts = captions(300, 3) + ["", "two words", "Ünïcödé ＦＵＬＬＷＩＤＴＨ text", "!!!", "a b c d e f g h i j"]
    batch = text_batch(texts)
    for i, t in enumerate(texts):
        ref = canary.TextFacts.of(t)
        assert batch.sha256[i] == ref.sha256 and batch.normalized_sha256[i] == ref.normalized_sha256
        assert batch.n_grams[i] == len(ref.grams)
        assert (batch.signature[i].tolist() if batch.has_signature[i] else None) == \
            (list(ref.signature) if ref.signature else None)
    # Jaccard over 64-bit shingle identities equals Jaccard over the shingle strings
    for i, j in [(0, 1), (5, 5), (10, 200)]:
        a, b = canary.TextFacts.of(texts[i]), canary.TextFacts.of(texts[j])
        inter = len(np.intersect1d(batch.grams_of(i), batch.grams_of(j)))
        assert inter == len(a.grams & b.grams)


def test_signature_bands_catch_every_pair_at_the_signature_threshold():
    plan = band_plan(8, 0.375, 64, 2)
    assert len(plan.signature_subsets) == 56 and plan.lsh_bands == 32
    assert plan.jaccard_candidate_probability(0.4) > 0.996
    # any 3 agreeing positions contain a whole band
    for agree in [(0, 3, 7), (1, 2, 6), (4, 5, 6)]:
        assert tuple(sorted(agree)) in plan.signature_subsets


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
    plan = plan_eval_set(ecfg)
    stage_eval_set(out, out.sub("eval"), plan, ecfg)
    return out, text_canary_stage(out, None, [c.name for c in plan.chunks], ["prompt"], tcfg)


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
