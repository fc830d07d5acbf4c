"""Chaining guard: component metrics against a BFS written plainly."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.graph.chaining import component_metrics, components_report
from tests.test_graph_two_tier import rule_on_arrays


def _run(n, edges, res, min_size=5, hop1=0.5, max_hops=3):
    src = np.array([e[0] for e in edges], dtype=np.int64)
    dst = np.array([e[1] for e in edges], dtype=np.int64)
    sim = np.array([e[2] for e in edges], dtype=np.float32)
    keys = [f"k{i:03d}" for i in range(n)]
    code, _, roots, sizes, _ = rule_on_arrays(n, src, dst, sim, res, keys, min_component_size=min_size)
    kept = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        if sizes[i] >= min_size and code[i] == 0:
            kept[roots[i]] = i
    return component_metrics(roots, sizes.astype(np.int64), kept, src, dst, sim, min_size, hop1, max_hops), kept


def test_chain_is_flagged_and_star_is_not():
    chain = [(i, i + 1, 0.93) for i in range(6)]             # 0-1-2-3-4-5-6, best image at the end
    star = [(7, j, 0.92 + 0.001 * j) for j in range(8, 13)]  # 7 in the middle, best
    res = [10, 10, 10, 10, 10, 10, 99] + [99, 1, 1, 1, 1, 1]
    m, _ = _run(13, chain + star, res)
    by_id = {int(c): i for i, c in enumerate(m.component_id)}
    c, s = by_id[0], by_id[7]
    assert m.size[c] == 7 and m.kept[c] == 6 and m.eccentricity[c] == 6
    assert m.hop1_fraction[c] == pytest.approx(2 / 7) and m.flagged[c]
    assert m.weakest_edge[c] == pytest.approx(0.93)
    assert m.size[s] == 6 and m.kept[s] == 7 and m.eccentricity[s] == 1
    assert m.hop1_fraction[s] == 1.0 and not m.flagged[s]
    assert m.weakest_edge[s] == pytest.approx(0.928)
    assert list(m.component_id) == [0, 7]  # size desc
    report = components_report(m, {6: "k006", 7: "k007"}, top=1, limits={})
    assert report["flagged_components"] == 1 and report["images_in_flagged_components"] == 7
    assert report["largest"][0]["kept_key"] == "k006" and len(report["largest"]) == 1


@settings(max_examples=60, deadline=None)
@given(st.integers(5, 25), st.data())
def test_metrics_match_plain_bfs(n, data):
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    edges = [(a, b, 0.91 + 0.0001 * ((a * 7 + b) % 50)) for a, b in pairs if a != b]
    res = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    m, kept = _run(n, edges, res, min_size=3)
    adj = {i: set() for i in range(n)}
    for a, b, _ in edges:
        adj[a].add(b)
        adj[b].add(a)
    for i, cid in enumerate(m.component_id.tolist()):
        start = int(m.kept[i])
        dist, queue = {start: 0}, deque([start])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        assert min(dist) == cid and len(dist) == m.size[i]
        assert m.eccentricity[i] == max(dist.values())
        assert m.hop1_fraction[i] == pytest.approx(sum(d <= 1 for d in dist.values()) / len(dist))
        inner = [s for a, b, s in edges if a in dist]
        assert m.weakest_edge[i] == pytest.approx(min(inner), abs=1e-6)
        assert m.flagged[i] == (m.hop1_fraction[i] < 0.5 or m.eccentricity[i] > 3)
