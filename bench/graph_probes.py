"""Which IVF lists the near-duplicate graph probes under wfd's pair rule: whole form vs parts.

Synthetic wfd-shaped rows as in ``bench/contamination_probes.py`` (layout block weighing
0.75 with a common component, non-negative colour block weighing 0.25, float16 as
stored; N rows of which 10 % greyscale) plus three kinds of planted copies (layout cosine
0.97, so each pair scores >= 0.9 by the rule): coloured → coloured, grey copy of a
coloured row, coloured copy of a grey row. The graph's index (``IVF{nlist},Flat`` over the
candidate forms) is searched with :func:`tasks.graph.index.search_pairs` (range search at
the graph threshold less the rule's slack) by the planted copies' query forms, in one run:

* ``whole p`` / ``whole 2p``: FAISS's own probing, lists by the whole query form;
* ``parts p``: the graph's probing (``rule=``): each part of the form picks p lists.

Recall = planted pairs found (before exact rescoring, which only drops pairs < 0.9).

    python bench/graph_probes.py [--n 20000] [--nlist 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tasks.graph import index as fx
from tasks.graph.config import IndexConfig
from tasks.shared.pair_score import PairScore

LAYOUT, COLOUR, WEIGHT, THRESHOLD = 96, 48, 0.25, 0.90


def planted(n: int, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(corpus rows, query rows, each query's corpus copy): m queries of each of 3 kinds."""
    base_l, base_c = rng.standard_normal(LAYOUT), np.abs(rng.standard_normal(COLOUR))

    def unit(a: np.ndarray) -> np.ndarray:
        return a / np.linalg.norm(a, axis=1, keepdims=True)

    def rows(layout: np.ndarray, colour: np.ndarray | None) -> np.ndarray:
        c = np.zeros((len(layout), COLOUR)) if colour is None else unit(colour)
        return np.concatenate([np.sqrt(1 - WEIGHT) * unit(layout), np.sqrt(WEIGHT) * c], 1).astype(np.float16)

    def near(layout: np.ndarray) -> np.ndarray:
        u, v = unit(layout), rng.standard_normal(layout.shape)
        v -= (v * u).sum(1, keepdims=True) * u
        return 0.97 * u + np.sqrt(1 - 0.97**2) * unit(v)

    n_col = int(n * 0.9)
    lc, lg = base_l * 0.8 + rng.standard_normal((n_col, LAYOUT)), base_l * 0.8 + rng.standard_normal((n - n_col, LAYOUT))
    cc = np.abs(base_c + rng.standard_normal((n_col + m, COLOUR)))
    t = np.concatenate([rows(lc, cc[:n_col]), rows(lg, None)]).astype(np.float32)
    q = np.concatenate([rows(near(lc[:m]), cc[:m]), rows(near(lc[m:2 * m]), None),
                        rows(near(lg[:m]), cc[n_col:])]).astype(np.float32)
    return t, q, np.concatenate([np.arange(2 * m), n_col + np.arange(m)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--nlist", type=int, default=128)
    p.add_argument("--per-kind", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    rule = PairScore(COLOUR, WEIGHT, 0.5)
    t, q, truth = planted(a.n, a.per_kind, np.random.default_rng(0))
    assert np.all(rule.scores(q, t[truth]) >= THRESHOLD)
    choice = fx.choose_index(IndexConfig(kind="ivf", nlist=a.nlist, storage="flat"), len(t), rule.form_dim(t.shape[1]))
    index = fx.new_index(choice, seed=0)
    fx.train_index(index, rule.candidate_forms(t))
    index.add_with_ids(rule.candidate_forms(t), np.arange(len(t), dtype=np.int64))
    ivf = fx.faiss.extract_index_ivf(index)
    q_ids = len(t) + np.arange(len(q))  # not in the index: no self-pairs to drop
    forms, m = rule.query_forms(q), a.per_kind
    print(f"N = {a.n} rows (10 % greyscale), IVF{a.nlist},Flat over candidate forms, {3 * m} planted copies; "
          f"recall coloured→coloured | grey→coloured | coloured→grey | all; median wall s (min-max) "
          f"of {a.repeats} alternated runs")
    for nprobe in (2, 8):
        ways = (("whole p", None, nprobe), ("whole 2p", None, 2 * nprobe), ("parts p", rule, nprobe))
        times: dict[str, list[float]] = {w[0]: [] for w in ways}
        hits = {}
        for _ in range(a.repeats):
            for name, r, probes in ways:
                ivf.nprobe = probes
                t0 = time.perf_counter()
                src, dst, _ = fx.search_pairs(index, q_ids, forms, THRESHOLD - rule.search_slack, "range", 10, rule=r)
                times[name].append(time.perf_counter() - t0)
                found = set(zip(src.tolist(), dst.tolist(), strict=True))
                hits[name] = np.array([(int(s), int(d)) in found for s, d in zip(q_ids, truth, strict=True)])
        for name, _, _ in ways:
            h, ts = hits[name], times[name]
            per = " | ".join(f"{h[j * m:(j + 1) * m].mean():.3f}" for j in range(3))
            print(f"  p = {nprobe:2d} {name:8s} {per} | {h.mean():.3f}   {np.median(ts):.3f} s "
                  f"({min(ts):.3f}-{max(ts):.3f})")


if __name__ == "__main__":
    main()
