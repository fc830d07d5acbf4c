"""Which IVF lists a wfd contamination scan probes: the query form's parts vs the whole, side by side.

Synthetic wfd-shaped rows (a layout block weighing 0.75 with a common component, so
unrelated layouts share a cosine of about 0.4, and a non-negative colour block weighing
0.25; float16 as stored), N corpus rows of which 10 % greyscale (no colour block), and
three kinds of planted queries, each a copy at layout cosine 0.97 of one corpus row:

* coloured → coloured: a coloured copy of a coloured row (same colour block);
* grey → coloured: a greyscale copy of a coloured row (a B&W repost of a training image);
* coloured → grey: a coloured query whose corpus copy is greyscale.

Every planted pair scores >= 0.97 by the pair rule (checked by the exact scan). The index
is the scan's (``IVF{nlist},Flat`` over the rule's candidate forms); every probed list is
scored with the whole query form. Compared at each nprobe p, in one run:

* ``whole p`` / ``whole 2p``: lists chosen by the whole query form (p and 2p lists);
* ``parts p``: the scan's choice (``PairScore.probe_parts``): the form's coloured part
  and its colourless part each choose p lists (at most 2p lists).

Recall = planted copies among the top 5. Also printed: the planted pairs' plain cosine
(what the scan scored before the pair rule) against the 0.9 threshold.

    python bench/contamination_probes.py [--n 20000] [--nlist 128]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tasks.contamination import similarity as sim
from tasks.shared.pair_score import PairScore, unit_rows

LAYOUT, COLOUR, WEIGHT = 96, 48, 0.25


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--nlist", type=int, default=128)
    p.add_argument("--per-kind", type=int, default=300)
    a = p.parse_args()
    rule = PairScore(COLOUR, WEIGHT, 0.5)
    rng = np.random.default_rng(0)
    base_l, base_c = rng.standard_normal(LAYOUT), np.abs(rng.standard_normal(COLOUR))

    def rows(layout: np.ndarray, colour: np.ndarray | None) -> np.ndarray:
        layout = layout / np.linalg.norm(layout, axis=1, keepdims=True)
        c = np.zeros((len(layout), COLOUR)) if colour is None else colour
        x = np.concatenate([np.sqrt(1 - WEIGHT) * layout, np.sqrt(WEIGHT) * c], axis=1)
        return unit_rows(x.astype(np.float16))

    def layouts(n: int) -> np.ndarray:
        return base_l * 0.8 + rng.standard_normal((n, LAYOUT))

    def colours(n: int) -> np.ndarray:
        c = np.abs(base_c + rng.standard_normal((n, COLOUR)))
        return c / np.linalg.norm(c, axis=1, keepdims=True)

    def near(layout: np.ndarray, cos: float) -> np.ndarray:
        u = layout / np.linalg.norm(layout, axis=1, keepdims=True)
        v = rng.standard_normal(u.shape)
        v -= (v * u).sum(1, keepdims=True) * u
        return cos * u + np.sqrt(1 - cos**2) * v / np.linalg.norm(v, axis=1, keepdims=True)

    n_col, m = int(a.n * 0.9), a.per_kind
    lc, cc, lg = layouts(n_col), colours(n_col), layouts(a.n - n_col)
    t = np.concatenate([rows(lc, cc), rows(lg, None)])
    q = np.concatenate([rows(near(lc[:m], 0.97), cc[:m]), rows(near(lc[m:2 * m], 0.97), None),
                        rows(near(lg[:m], 0.97), colours(m))])
    truth = np.concatenate([np.arange(m), np.arange(m, 2 * m), n_col + np.arange(m)])
    kinds = ["coloured → coloured", "grey → coloured", "coloured → grey"]

    rule_s = rule.scores(q, t[truth])
    cos_s = PairScore().scores(q, t[truth])
    _, i = sim.exact_topk(q, t, 1, 0, rule)
    print(f"N = {a.n} corpus rows (10 % greyscale), {3 * m} planted queries; exact scan's best = the "
          f"planted copy: {np.mean(i[:, 0] == truth):.3f}")
    for j, kind in enumerate(kinds):
        sl = slice(j * m, (j + 1) * m)
        print(f"  {kind:20s} rule score {rule_s[sl].min():.3f}-{rule_s[sl].max():.3f}; plain cosine "
              f"{cos_s[sl].min():.3f}-{cos_s[sl].max():.3f} (> 0.9: {np.mean(cos_s[sl] > 0.9):.2f})")

    dim = LAYOUT + COLOUR
    index = sim.new_ivf(rule.form_dim(dim), a.nlist, "flat", 1, 0)
    forms = rule.candidate_forms(t)
    index.train(forms)
    index.add(forms)
    qf = rule.query_forms(q)
    print(f"IVF{a.nlist},Flat over the candidate forms; recall of planted copies in the top 5 "
          f"({' | '.join(kinds)} | all), CPU s")
    for nprobe in (1, 2, 4, 8, 16):
        for name, probes, pp in (("whole p", (qf,), nprobe), ("whole 2p", (qf,), 2 * nprobe),
                                 ("parts p", rule.probe_parts(qf), nprobe)):
            t0 = time.process_time()
            _, found = sim.ivf_search_by_list(index, qf, 5, pp, probes)
            cpu = time.process_time() - t0
            hit = (found == truth[:, None]).any(axis=1)
            per = " | ".join(f"{hit[j * m:(j + 1) * m].mean():.3f}" for j in range(3))
            print(f"  p = {nprobe:2d}  {name:8s}  {per} | {hit.mean():.3f}   {cpu:.2f}")


if __name__ == "__main__":
    main()
