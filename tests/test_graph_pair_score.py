"""The graph scores wfd pairs by its rule: colour counts only when both images have colour.

Synthetic wfd-shaped vectors (a layout block and a non-negative colour block weighing
0.75 and 0.25) stand for coloured originals and their greyscale copies (the same layout,
no colour block). The reference is a straightforward re-implementation of the rule on
the float16 rows the feature files hold; the graph must equal it for range and k-NN
search, and an incremental rerun must equal a fresh build byte for byte.
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from tasks.graph import index as fx
from tasks.graph.build import build_index
from tasks.graph.config import IndexConfig, NearDedupConfig, VerificationConfig
from tasks.graph.edges import feature_digests, query_shard
from tasks.graph.nodes import number_nodes, write_shard_table
from tasks.shared.pair_score import PairScore
from tests.graph_corpus import at_similarity, node_vectors, unit, write_corpus
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
    ids, x = node_vectors(store, shards, by_key)
    layout, colour = x[:, :LAYOUT], x[:, LAYOUT:]
    greyish = np.linalg.norm(colour, axis=1) < 0.5 * np.sqrt(WEIGHT)  # no colour to speak of
    u = layout / np.linalg.norm(layout, axis=1, keepdims=True)
    s = np.where(greyish[:, None] | greyish[None, :], u @ u.T, x @ x.T)
    i, j = np.nonzero(np.triu(s >= threshold, k=1))
    return {(min(ids[a], ids[b]), max(ids[a], ids[b])): s[a, b] for a, b in zip(i, j, strict=True)}, greyish


@pytest.mark.parametrize("search", ["range", "knn"])
def test_a_greyscale_copy_scores_like_its_original_in_the_graph(tmp_path, search):
    x = planted(150, seed=2)
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=50, dim=LAYOUT + COLOUR,
                                         vectors=x, model=MODEL)
    cfg = GRAPH.model_copy(update={"index": IndexConfig(kind="flat", search=search, k=160)})
    _, info, got = run_graph(store, shards, cfg)
    want, greyish = reference_edges(store, shards, by_key, 0.90)
    assert info.info["pair_score"] == RULE and info.info["plan"]["dim"] == 2 * LAYOUT + COLOUR
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
    assert info.info["plan"]["factory"].startswith("IVF16,") and sum(1 for s in want.values() if s > 0.93) >= 100
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
    nodes = number_nodes(store, shards)
    digests = feature_digests(store, cfg, nodes)
    table = write_shard_table(store, nodes, digests)
    info, _ = build_index(store, store, cfg, table)
    queried = {s: query_shard(store, store, cfg, table, s, digests[s], info).action for s in nodes.shards}
    assert sorted(queried.values()) == ["computed", "skipped", "skipped"] and queried[shards[0]] == "computed"
    _, _, got = run_graph(store, shards, cfg)
    want, _ = reference_edges(store, shards, by_key, 0.90)
    assert sum(1 for s in want.values() if s >= 0.95) >= 10
    compare(got, want, 0.90)
    fresh, _, _ = write_corpus(str(tmp_path / "b"), n_shards, per_shard, LAYOUT + COLOUR, vectors=changed, model=MODEL)
    run_graph(fresh, shards, cfg)
    assert tree_bytes(tmp_path / "a" / "graph" / "edges") == tree_bytes(tmp_path / "b" / "graph" / "edges")


# ---- which IVF lists a query probes ---------------------------------------------------------

def crowded(n: int, n_grey: int, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose IVF lists split by kind: coloured rows (layouts and colours sharing a common
    component, so unrelated rows score ~0.4), ``n_grey`` greyscale rows, then ``n_queries``
    coloured copies (layout cosine 0.97) of the first greyscale rows. Returns (rows, the
    index of each query's greyscale copy)."""
    rng = np.random.default_rng(seed)
    base_l, base_c = rng.standard_normal(LAYOUT), np.abs(rng.standard_normal(COLOUR))
    layout = base_l * 0.8 + rng.standard_normal((n, LAYOUT))
    colour = np.abs(base_c + rng.standard_normal((n, COLOUR)))
    n_col = n - n_grey
    rows = [coloured(layout[i], colour[i]) for i in range(n_col)] + [grey(layout[i]) for i in range(n_col, n)]
    rows += [coloured(at_similarity(unit(layout[n_col + i]), 0.97, rng), colour[i]) for i in range(n_queries)]
    return np.stack(rows).astype(np.float16).astype(np.float32), n_col + np.arange(n_queries)


def ivf_over(x: np.ndarray, rule: PairScore, nlist: int, nprobe: int, storage: str = "flat"):
    choice = fx.choose_index(IndexConfig(kind="ivf", nlist=nlist, nprobe=nprobe, storage=storage, pq_m=4),
                             len(x), rule.form_dim(x.shape[1]))
    index = fx.new_index(choice, seed=0)
    fx.train_index(index, rule.candidate_forms(x))
    index.add_with_ids(rule.candidate_forms(x), np.arange(len(x), dtype=np.int64))
    return index


@pytest.mark.parametrize("search", ["range", "knn"])
def test_ivf_probes_lists_by_each_part_of_the_query_form(search):
    """Whole-form probing loses coloured queries' greyscale copies (their lists hold grey rows,
    whose centroids score low against the form's coloured part); each part probing its own
    lists finds them. Both ways measured on the same index, the old one through the plain
    FAISS call that search_pairs made before."""
    rule = PairScore.from_json(RULE)
    x, copy = crowded(4000, 400, 200, seed=8)
    index = ivf_over(x, rule, nlist=32, nprobe=2)
    ids = np.arange(len(x) - len(copy), len(x))
    q = rule.query_forms(x[ids])

    def recall(found_src, found_dst):
        found = set(zip(found_src.tolist(), found_dst.tolist(), strict=True))
        return np.mean([(int(a), int(b)) in found for a, b in zip(ids, copy, strict=True)])

    whole = fx.search_pairs(index, ids, q, 0.895, search, 10)  # no rule: FAISS's own probing
    parts = fx.search_pairs(index, ids, q, 0.895, search, 10, rule=rule)
    assert np.all(rule.scores(x[ids], x[copy]) >= 0.95)
    assert recall(*whole[:2]) <= 0.3 and recall(*parts[:2]) >= 0.95
    # what the parts way finds scores as the forms' inner product (checked in float64)
    src, dst, sim = parts
    want = np.einsum("ij,ij->i", rule.query_forms(x[src]).astype(np.float64), rule.candidate_forms(x[dst]))
    assert np.allclose(sim, want, atol=1e-5)


@pytest.mark.parametrize("storage", ["flat", "sqfp16", "pq"])
@pytest.mark.parametrize("wrap", ["", "IDMap,", "PCA16,"])
def test_preassigned_search_of_the_whole_form_is_faiss_search(storage, wrap):
    """The parts way's FAISS calls (lists chosen outside, scores from the centroid inner
    products it passes) give FAISS's own results when the only part is the whole form."""
    rng = np.random.default_rng(4)
    x = unit(rng.standard_normal((3000, 16))).astype(np.float32)
    codes = {"flat": "Flat", "sqfp16": "SQfp16", "pq": "PQ4x4"}[storage]
    index = faiss.index_factory(16, f"{wrap}IVF32,{codes}", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add_with_ids(x, np.arange(len(x), dtype=np.int64) + 7) if wrap == "IDMap," else index.add(x)
    faiss.extract_index_ivf(index).nprobe = 3
    q = unit(x[:300] + 0.3 * rng.standard_normal((300, 16))).astype(np.float32)
    d0, i0 = index.search(q, 10)
    _, d1, i1 = fx.search_parts_ivf(index, q, (q,), None, 10)
    assert np.array_equal(i0, i1) and np.allclose(d0, d1, atol=1e-6)
    lims0, d0, i0 = index.range_search(q, 0.6)
    lims1, d1, i1 = fx.search_parts_ivf(index, q, (q,), 0.6, 10)
    assert np.array_equal(lims0, lims1) and int(lims0[-1]) > 300
    for a, b in zip(np.split(i0, lims0[1:-1].astype(np.int64)), np.split(i1, lims1[1:-1].astype(np.int64)),
                    strict=True):
        assert sorted(a.tolist()) == sorted(b.tolist())


def test_cosine_models_and_flat_indexes_keep_faiss_own_search():
    """Only an active rule over an IVF index changes how lists are chosen."""
    x, _ = crowded(2000, 200, 100, seed=9)
    ids = np.arange(len(x))
    cosine = PairScore()
    index = ivf_over(x, cosine, nlist=16, nprobe=2)
    for search in ("range", "knn"):
        base = fx.search_pairs(index, ids, x, 0.8, search, 10)
        with_rule = fx.search_pairs(index, ids, x, 0.8, search, 10, rule=cosine)
        assert all(np.array_equal(a, b) for a, b in zip(base, with_rule, strict=True)) and len(base[0]) > 100
    rule = PairScore.from_json(RULE)
    flat = fx.new_index(fx.choose_index(IndexConfig(kind="flat"), len(x), rule.form_dim(x.shape[1])), seed=0)
    flat.add_with_ids(rule.candidate_forms(x), ids)
    q = rule.query_forms(x)
    base = fx.search_pairs(flat, ids, q, 0.9, "range", 10)
    assert all(np.array_equal(a, b) for a, b in
               zip(base, fx.search_pairs(flat, ids, q, 0.9, "range", 10, rule=rule), strict=True))


def test_graph_over_ivf_finds_greyscale_copies_with_few_probes(tmp_path):
    """The whole stage, IVF with 2 of 32 lists probed: the rule's edges, copies included."""
    x, _ = crowded(2600, 300, 100, seed=10)
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=900, dim=LAYOUT + COLOUR,
                                         vectors=x, model=MODEL)
    cfg = GRAPH.model_copy(update={"index": IndexConfig(kind="ivf", nlist=32, nprobe=2)})
    _, info, got = run_graph(store, shards, cfg)
    want, greyish = reference_edges(store, shards, by_key, 0.90)
    assert info.info["plan"]["factory"].startswith("IVF32,") and len(greyish) == len(x)  # node id = row
    grey_pairs = {p for p in want if greyish[p[0]] or greyish[p[1]]}
    assert len(grey_pairs) >= 90 and len(want) >= 100
    assert len(grey_pairs & set(got)) >= 0.95 * len(grey_pairs) and len(set(want) & set(got)) >= 0.95 * len(want)
    assert set(got) <= set(want) | {p for p, s in got.items() if s < 0.90 + 1e-5}
    for p in set(got) & set(want):
        assert got[p] == pytest.approx(want[p], abs=1e-5)
