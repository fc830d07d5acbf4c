"""The graph scores wfd pairs by its rule: colour counts only when both images have colour.

Synthetic wfd-shaped vectors (a layout block and a non-negative colour block weighing
0.75 and 0.25) stand for coloured originals and their greyscale copies (the same layout,
no colour block). The reference is a straightforward re-implementation of the rule on
the float16 rows the feature files hold; the graph must equal it for range and k-NN
search, and an incremental rerun must equal a fresh build byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest

from corpusforge.layout import staging_records
from tasks.graph.config import IndexConfig, NearDedupConfig, VerificationConfig
from tasks.graph.edges import build_index, feature_digests, query_shard
from tasks.graph.nodes import plan_nodes
from tasks.graph.pair_score import PairScore
from tests.graph_corpus import at_similarity, unit, write_corpus
from tests.test_graph_index import compare, run_graph
from tests.test_graph_stage import tree_bytes

pytestmark = pytest.mark.timeout(180)

LAYOUT, COLOUR, WEIGHT = 20, 8, 0.25
RULE = {"name": "layout_when_colourless", "colour_dims": COLOUR, "colour_weight": WEIGHT, "colourless_below": 0.5}
MODEL = {"arch": "wfd", "pair_rule": RULE}
GRAPH = NearDedupConfig(verification=VerificationConfig(mode="gpic_exact"))  # the graph alone: threshold 0.90


def coloured(layout: np.ndarray, colour: np.ndarray) -> np.ndarray:
    return np.concatenate([np.sqrt(1 - WEIGHT) * unit(layout), np.sqrt(WEIGHT) * unit(np.abs(colour))])


def grey(layout: np.ndarray) -> np.ndarray:
    return np.concatenate([unit(layout), np.zeros(COLOUR)])


def planted(n: int, seed: int) -> np.ndarray:
    """Coloured originals, each followed by a greyscale copy, a coloured copy or nothing."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        layout, colour = rng.standard_normal(LAYOUT), rng.standard_normal(COLOUR)
        out.append(coloured(layout, colour))
        kind = int(rng.integers(0, 3))
        if kind == 0:  # greyscale copy: layout cosine 0.93-0.99, no colour; cosine <= 0.866
            out.append(grey(at_similarity(unit(layout), float(rng.uniform(0.93, 0.99)), rng)))
        elif kind == 1:
            out.append(coloured(at_similarity(unit(layout), 0.97, rng), colour + 0.1 * rng.standard_normal(COLOUR)))
    return np.stack(out[:n]).astype(np.float32)


def reference_edges(store, shards, by_key, threshold):
    """Every pair >= threshold by the rule written out directly (float64, all pairs)."""
    ids, vecs, offset = [], [], 0
    for shard in sorted(shards):
        keys = store.read_parquet(staging_records(shard))["key"].to_pylist()
        for r, k in enumerate(keys):
            if k in by_key:
                ids.append(offset + r)
                vecs.append(by_key[k])
        offset += len(keys)
    x = np.asarray(vecs, dtype=np.float16).astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    layout, colour = x[:, :LAYOUT], x[:, LAYOUT:]
    greyish = np.linalg.norm(colour, axis=1) < 0.5 * np.sqrt(WEIGHT)  # no colour to speak of
    u = layout / np.linalg.norm(layout, axis=1, keepdims=True)
    s = np.where(greyish[:, None] | greyish[None, :], u @ u.T, x @ x.T)
    i, j = np.nonzero(np.triu(s >= threshold, k=1))
    ids = np.asarray(ids)
    return {(min(ids[a], ids[b]), max(ids[a], ids[b])): s[a, b] for a, b in zip(i, j, strict=True)}, greyish


@pytest.mark.parametrize("search", ["range", "knn"])
def test_a_greyscale_copy_scores_like_its_original_in_the_graph(tmp_path, search):
    x = planted(150, seed=2)
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=50, dim=LAYOUT + COLOUR,
                                         vectors=x, model=MODEL)
    cfg = GRAPH.model_copy(update={"index": IndexConfig(kind="flat", search=search, k=160)})
    _, info, got = run_graph(store, shards, cfg)
    want, greyish = reference_edges(store, shards, by_key, 0.90)
    assert info["pair_score"] == RULE and info["plan"]["dim"] == 2 * LAYOUT + COLOUR
    grey_pairs = {p for p, s in want.items() if s >= 0.93}
    assert greyish.sum() >= 20 and len(grey_pairs) >= 40  # greyscale copies are in the graph ...
    cosine_max = np.sqrt(1 - WEIGHT)  # ... although their cosine is at most 0.866
    assert any(s > cosine_max + 0.05 for s in want.values())
    compare(got, want, 0.90)


@pytest.mark.parametrize("storage", ["flat", "sqfp16"])
def test_ivf_index_scores_by_the_rule_too(tmp_path, storage):
    """IVF over the candidate forms, every list probed: the reference's edges, rescored exactly."""
    x = planted(1200, seed=6)
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=4, per_shard=300, dim=LAYOUT + COLOUR,
                                         vectors=x, model=MODEL)
    cfg = GRAPH.model_copy(update={"index": IndexConfig(kind="ivf", nlist=16, nprobe=16, storage=storage)})
    _, info, got = run_graph(store, shards, cfg)
    want, _ = reference_edges(store, shards, by_key, 0.90)
    assert info["plan"]["factory"].startswith("IVF16,") and sum(1 for s in want.values() if s > 0.93) >= 100
    compare(got, want, 0.90)


def test_rule_scores_match_the_forms_and_are_symmetric():
    rule = PairScore.from_model(MODEL)
    x = planted(200, seed=4)
    x[::7, LAYOUT:] *= 0.3  # partial colour: over-estimated by the forms, never under
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, len(x), (2, 2000))
    exact = rule.scores(x[a], x[b])
    assert np.array_equal(exact, rule.scores(x[b], x[a]))
    assert np.array_equal(exact, rule.scores_vs_forms(x[a], rule.candidate_forms(x[b])))
    forms = np.einsum("ij,ij->i", rule.query_forms(x[a]).astype(np.float64), rule.candidate_forms(x[b]))
    assert np.all(forms >= exact - 1e-5)
    full = np.abs(np.linalg.norm(x[:, LAYOUT:], axis=1) - np.sqrt(WEIGHT)) < 1e-6
    both = full[a] & full[b] | rule.colourless(x[a]) | rule.colourless(x[b])
    assert both.sum() > 1000 and np.allclose(forms[both], exact[both], atol=1e-5)
    assert PairScore.from_model({"arch": "sscd"}).scores(x[a], x[b]).tolist() == \
        np.einsum("ij,ij->i", x[a].astype(np.float64), x[b]).astype(np.float32).tolist()


def test_a_new_coloured_original_links_to_an_unchanged_greyscale_copy_on_rerun(tmp_path):
    """Only the changed shard queries again; its coloured original must find the greyscale
    copy in an unchanged shard from its own side, and the graph equals a fresh build's."""
    n_shards, per_shard = 3, 40
    rng = np.random.default_rng(9)
    x = np.stack([coloured(rng.standard_normal(LAYOUT), rng.standard_normal(COLOUR))
                  for _ in range(n_shards * per_shard)]).astype(np.float32)
    order = np.random.default_rng(0 + 1).permutation(len(x))  # write_corpus's placement (seed 0)
    first, second = order[:per_shard], order[per_shard:2 * per_shard]
    changed = x.copy()
    for g_new, g_grey in zip(first[:10], second[:10], strict=True):  # shard 0's images become originals
        layout = rng.standard_normal(LAYOUT)                          # of greyscale copies in shard 1
        x[g_grey] = changed[g_grey] = grey(layout)
        changed[g_new] = coloured(at_similarity(unit(layout), 0.97, rng), rng.standard_normal(COLOUR))
    cfg = GRAPH.model_copy(update={"index": IndexConfig(kind="flat", search="range")})
    store, shards, _ = write_corpus(str(tmp_path / "a"), n_shards, per_shard, LAYOUT + COLOUR, vectors=x, model=MODEL)
    run_graph(store, shards, cfg)
    _, _, by_key = write_corpus(str(tmp_path / "a"), n_shards, per_shard, LAYOUT + COLOUR, vectors=changed,
                                model=MODEL)
    nodes = plan_nodes(store, shards)
    digests = feature_digests(store, cfg, nodes)
    info = build_index(store, store, cfg, nodes, digests)
    queried = {s: query_shard(store, store, cfg, nodes, s, info, digests)["action"] for s in nodes.shards}
    assert sorted(queried.values()) == ["computed", "skipped", "skipped"] and queried[shards[0]] == "computed"
    _, _, got = run_graph(store, shards, cfg)
    want, _ = reference_edges(store, shards, by_key, 0.90)
    assert sum(1 for s in want.values() if s >= 0.95) >= 10
    compare(got, want, 0.90)
    fresh, _, _ = write_corpus(str(tmp_path / "b"), n_shards, per_shard, LAYOUT + COLOUR, vectors=changed, model=MODEL)
    run_graph(fresh, shards, cfg)
    assert tree_bytes(tmp_path / "a" / "graph" / "edges") == tree_bytes(tmp_path / "b" / "graph" / "edges")
