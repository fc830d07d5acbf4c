"""Two-tier rule and union-find against plain reference implementations (BFS over dicts)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import connected_components

from tasks.graph.components import UnionFind, component_sizes
from tasks.graph.two_tier import COMPONENT, KEPT, TIER1, TierOnePartners, decide, keys_as_bytes, priority_rank

CT, PT, MIN = 0.90, 0.9625, 5
F32 = np.float32


def reference(n, edges, res, keys, ct=CT, pt=PT, min_size=MIN):
    """The rule written plainly: dict graph, BFS components, pairwise loops."""
    def better(a, b):
        return res[a] > res[b] or (res[a] == res[b] and keys[a] < keys[b])

    adj = {i: set() for i in range(n)}
    max_sim = [0.0] * n
    for a, b, s in edges:
        max_sim[a] = max(max_sim[a], float(F32(s)))
        max_sim[b] = max(max_sim[b], float(F32(s)))
        if F32(s) > F32(ct):
            adj[a].add(b)
            adj[b].add(a)
    comp = [-1] * n
    members = {}
    for start in range(n):
        if comp[start] != -1:
            continue
        seen, queue = {start}, deque([start])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    queue.append(v)
        cid = min(seen)
        for u in seen:
            comp[u] = cid
        members[cid] = seen
    partner = {}
    for a, b, s in edges:
        if F32(s) > F32(pt):
            win, lose = (a, b) if better(a, b) else (b, a)
            cur = partner.get(lose)
            if cur is None or F32(s) > cur[1] or (F32(s) == cur[1] and better(win, cur[0])):
                partner[lose] = (win, F32(s))
    code, dup = [KEPT] * n, [-1] * n
    for x in partner:
        y = partner[x][0]
        while y in partner:
            y = partner[y][0]
        code[x], dup[x] = TIER1, y
    for cid, mem in members.items():
        if len(mem) >= min_size:
            best = next(iter(mem))
            for u in mem:
                if better(u, best):
                    best = u
            for u in mem:
                if u != best:
                    dup[u] = best
                    if code[u] == KEPT:
                        code[u] = COMPONENT
    sizes = [len(members[comp[i]]) for i in range(n)]
    return code, dup, comp, sizes, max_sim


def rule_on_arrays(n, src, dst, sim, res, keys, candidate_threshold=CT, pair_threshold=PT, min_component_size=MIN):
    """The rule on an in-memory graph from the stage's own steps, as tasks/graph/decisions.py
    streams them per edge file: (code, duplicate_of, component root, component size,
    max similarity) per node."""
    max_sim = np.zeros(n, dtype=np.float32)
    np.maximum.at(max_sim, src, sim)
    np.maximum.at(max_sim, dst, sim)
    cand = sim > np.float32(candidate_threshold)
    uf = UnionFind(n)
    uf.union(src[cand], dst[cand])
    roots = uf.roots()
    rank = priority_rank(np.asarray(res), keys_as_bytes(keys))
    t1 = TierOnePartners(n, pair_threshold)
    t1.add(src[cand], dst[cand], sim[cand], rank)
    d = decide(roots, component_sizes(roots), rank, t1.partner, min_component_size)
    return d.code, d.duplicate_of, roots, component_sizes(roots), max_sim


def run(n, edges, res, keys, **kw):
    src = np.array([e[0] for e in edges], dtype=np.int64)
    dst = np.array([e[1] for e in edges], dtype=np.int64)
    sim = np.array([e[2] for e in edges], dtype=np.float32)
    return tuple(a.tolist() for a in rule_on_arrays(n, src, dst, sim, res, keys, **kw))


SIMS = [0.85, 0.90, 0.9001, 0.93, 0.95, 0.9625, 0.9626, 0.99, 1.0]


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 14))
    res = draw(st.lists(st.sampled_from([100, 200, 400]), min_size=n, max_size=n))
    keys = draw(st.lists(st.text("ab0_-", min_size=1, max_size=4), min_size=n, max_size=n, unique=True))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=3 * n)) if pairs else []
    edges = []
    for a, b in chosen:
        s = draw(st.sampled_from(SIMS))
        edges.append((b, a, s) if draw(st.booleans()) else (a, b, s))
    return n, edges, res, keys


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_two_tier_matches_reference(g):
    n, edges, res, keys = g
    assert run(n, edges, res, keys) == reference(n, edges, res, keys)


@settings(max_examples=100, deadline=None)
@given(graphs(), st.sampled_from([(0.90, 0.95, 3), (0.92, 0.99, 2), (0.85, 0.9001, 4)]))
def test_two_tier_other_thresholds(g, params):
    n, edges, res, keys = g
    ct, pt, m = params
    got = run(n, edges, res, keys, candidate_threshold=ct, pair_threshold=pt, min_component_size=m)
    assert got == reference(n, edges, res, keys, ct, pt, m)


def _path(n, sim):
    return [(i, i + 1, sim) for i in range(n - 1)]


def test_component_of_four_keeps_all_and_five_keeps_one():
    keys = [f"k{i}" for i in range(5)]
    res = [10, 50, 30, 20, 40]
    code4, *_ = run(4, _path(4, 0.95), res[:4], keys[:4])
    assert code4 == [KEPT] * 4
    code5, dup5, comp5, size5, _ = run(5, _path(5, 0.95), res, keys)
    assert code5 == [COMPONENT, KEPT, COMPONENT, COMPONENT, COMPONENT]
    assert dup5 == [1, -1, 1, 1, 1] and comp5 == [0] * 5 and size5 == [5] * 5


def test_equal_resolution_removes_larger_key():
    code, dup, *_ = run(2, [(0, 1, 0.97)], [100, 100], ["b", "a"])
    assert code == [TIER1, KEPT] and dup == [1, -1]
    code, dup, *_ = run(2, [(0, 1, 0.97)], [100, 100], ["a", "b"])
    assert code == [KEPT, TIER1] and dup == [-1, 0]


def test_thresholds_are_strict():
    code, _, comp, _, mx = run(2, [(0, 1, 0.9625)], [1, 2], ["a", "b"])
    assert code == [KEPT, KEPT] and comp == [0, 0] and mx == pytest.approx([0.9625, 0.9625])
    _, _, comp, _, _ = run(2, [(0, 1, 0.90)], [1, 2], ["a", "b"])
    assert comp == [0, 1]


def test_tier1_chain_points_to_kept_image():
    # resolutions 3 > 2 > 1, pairs (1,2) and (0,1) > 0.9625: 1 and 2 lose, both point at 0
    code, dup, *_ = run(3, [(1, 2, 0.98), (0, 1, 0.97)], [300, 200, 100], ["a", "b", "c"])
    assert code == [KEPT, TIER1, TIER1] and dup == [-1, 0, 0]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59)), max_size=120),
       st.integers(1, 7))
def test_union_find_matches_scipy(n, pairs, chunks):
    pairs = [(a % n, b % n) for a, b in pairs]
    uf = UnionFind(n)
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    for part in np.array_split(np.arange(len(pairs)), chunks):
        uf.union(a[part], b[part])
    roots = uf.roots()
    graph = sp.coo_matrix((np.ones(len(pairs)), (a, b)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    smallest = {}
    for i, lab in enumerate(labels):
        smallest.setdefault(lab, i)
    assert roots.tolist() == [smallest[lab] for lab in labels]
    assert component_sizes(roots).tolist() == [int(np.sum(labels == lab)) for lab in labels]
