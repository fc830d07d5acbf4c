"""How two feature vectors score in the graph: cosine, or wfd's "colour counts only when both have colour".

Most models' vectors score by their cosine (the dot product of unit rows). The weight-free
descriptor (:mod:`tasks.shared.features.wfd`) stores a layout block ``l`` and a colour block ``c``
(``|l|^2 = 1 - w``, ``|c|^2 = w`` for a coloured image). A greyscale picture has no colour
block, so by cosine it could never score above ``sqrt(1 - w)`` against its own coloured
original. Its fingerprint therefore names a pair rule: when either image is colourless
(colour presence below ``colourless_below``, see :func:`colour_presence`), the pair scores
the cosine of the layout blocks alone; otherwise the plain cosine.

That rule is not an inner product of the stored vectors, so the FAISS index holds a
*candidate form* and queries use a *query form* whose inner product is the rule (``u`` =
the unit layout block, ``a = sqrt(1 - w)``)::

    candidate:  coloured [l, c, 0]        colourless [0, 0, u]
    query:      coloured [l, c, u]        colourless [u / a, 0, u]

coloured·coloured = l·l' + c·c'; anything·colourless = u·u'; colourless·coloured = u·l'/a
= u·u' (exact when the coloured side has its full colour block, an over-estimate when its
colour is partial, which only adds candidates). So range and k-NN searches rank and find
by the rule itself, and a query's result still depends only on the query and the vectors
it finds (incremental reuse holds). Every candidate is then rescored exactly with
:meth:`PairScore.scores` / :meth:`PairScore.scores_vs_forms` (float64, symmetric), so the
stored similarity is the same bytes from either side and in any process. The index holds
``dim + layout dims`` floats per vector: about twice the stored features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def unit_rows(x: np.ndarray) -> np.ndarray:
    """float32 rows of unit L2 norm (float16 storage leaves norms off by ~1e-3)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-d feature array, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12))


@dataclass(frozen=True)
class PairScore:
    """The pair rule of one feature model: plain cosine when ``colour_dims == 0``."""

    colour_dims: int = 0
    colour_weight: float = 0.0
    colourless_below: float = 0.0

    @classmethod
    def from_model(cls, fingerprint: dict[str, Any] | None) -> PairScore:
        """The rule the model's fingerprint names (``pair_rule``), else plain cosine."""
        return cls.from_json((fingerprint or {}).get("pair_rule"))

    @classmethod
    def from_json(cls, rule: dict[str, Any] | None) -> PairScore:
        """The inverse of :meth:`to_json` (None: plain cosine)."""
        if not rule or rule.get("name") == "cosine":
            return cls()
        if rule.get("name") != "layout_when_colourless":
            raise ValueError(f"unknown pair rule {rule!r} in the feature model's fingerprint")
        return cls(int(rule["colour_dims"]), float(rule["colour_weight"]), float(rule["colourless_below"]))

    @property
    def search_slack(self) -> float:
        """How far below a threshold the forms must search: a coloured row's layout block
        weighs ``1 - w`` only up to the stored dtype's rounding (float16: ~1e-3), which the
        colourless query form's ``1 / a`` assumes exactly. Rescoring removes the extras."""
        return 0.005 if self.active else 0.0

    @property
    def active(self) -> bool:
        return self.colour_dims > 0

    def to_json(self) -> dict[str, Any]:
        if not self.active:
            return {"name": "cosine"}
        return {"name": "layout_when_colourless", "colour_dims": self.colour_dims,
                "colour_weight": self.colour_weight, "colourless_below": self.colourless_below}

    def form_dim(self, dim: int) -> int:
        """Width of the index's vectors for stored features of width ``dim``."""
        return dim + (dim - self.colour_dims) if self.active else dim

    # ---- pieces -------------------------------------------------------------------------

    def _split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, dtype=np.float64)
        return x[:, : x.shape[1] - self.colour_dims], x[:, x.shape[1] - self.colour_dims:]

    def colourless(self, x: np.ndarray) -> np.ndarray:
        """Rows whose colour presence is below the rule's level (bool per row)."""
        return colour_presence(*self._split(x), self.colour_weight) < self.colourless_below

    def unit_layout(self, x: np.ndarray) -> np.ndarray:
        """The layout block scaled to unit norm, float64 arithmetic rounded to float32 (a
        flat, blank image keeps zeros). The same bytes whichever side computes it."""
        layout, _ = self._split(x)
        norm = np.sqrt(np.einsum("ij,ij->i", layout, layout))[:, None]
        return np.where(norm > 0, layout / np.where(norm > 0, norm, 1.0), 0.0).astype(np.float32)

    # ---- forms ----------------------------------------------------------------------------

    def candidate_forms(self, x: np.ndarray) -> np.ndarray:
        """What the index stores for stored feature rows ``x``."""
        x = np.asarray(x, dtype=np.float32)
        if not self.active:
            return x
        grey = self.colourless(x)
        u = self.unit_layout(x)
        return np.concatenate([np.where(grey[:, None], 0.0, x), np.where(grey[:, None], u, 0.0)],
                              axis=1).astype(np.float32)

    def query_forms(self, x: np.ndarray) -> np.ndarray:
        """What a query searches with: the inner product with a candidate form is the rule."""
        x = np.asarray(x, dtype=np.float32)
        if not self.active:
            return x
        grey = self.colourless(x)
        u = self.unit_layout(x)
        a = np.sqrt(1.0 - self.colour_weight)
        grey_head = np.concatenate([u / a, np.zeros((len(x), self.colour_dims))], axis=1)
        head = np.where(grey[:, None], grey_head, x)
        return np.concatenate([head, u], axis=1).astype(np.float32)

    def probe_parts(self, forms: np.ndarray) -> tuple[np.ndarray, ...]:
        """Query forms split by what they score: the part that scores coloured candidates
        (the first ``dim`` entries, the rest zero) and the part that scores colourless ones
        (the rest). An IVF centroid mixes both kinds of member, so each part picks its own
        lists to probe (whole-form probing lets one kind crowd out the other). Plain cosine:
        the forms themselves."""
        forms = np.asarray(forms, dtype=np.float32)
        if not self.active:
            return (forms,)
        dim = (forms.shape[1] + self.colour_dims) // 2
        head, tail = forms.copy(), forms.copy()
        head[:, dim:], tail[:, :dim] = 0, 0
        return head, tail

    # ---- exact scores ---------------------------------------------------------------------

    def scores(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The canonical score of row pairs of stored features (float32, symmetric, exact)."""
        if not self.active:
            return canonical_similarity(a, b)
        grey = self.colourless(a) | self.colourless(b)
        layout = canonical_similarity(self.unit_layout(a), self.unit_layout(b))
        return np.where(grey, layout, canonical_similarity(a, b)).astype(np.float32)

    def scores_vs_forms(self, a: np.ndarray, forms: np.ndarray) -> np.ndarray:
        """:meth:`scores` of stored rows ``a`` against rows known only by their candidate
        forms (read back from a flat index): the same bytes as :meth:`scores`."""
        if not self.active:
            return canonical_similarity(a, forms)
        forms = np.asarray(forms, dtype=np.float32)
        width = forms.shape[1] - (forms.shape[1] - self.colour_dims) // 2
        stored, tail = forms[:, :width], forms[:, width:]
        b_grey = ~stored.any(axis=1)
        u_b = np.where(b_grey[:, None], tail, self.unit_layout(stored))
        grey = self.colourless(a) | b_grey
        layout = canonical_similarity(self.unit_layout(a), u_b)
        return np.where(grey, layout, canonical_similarity(a, stored)).astype(np.float32)


def colour_presence(layout: np.ndarray, colour: np.ndarray, colour_weight: float) -> np.ndarray:
    """How much of a full colour block a row holds: 1 for a coloured image (its blocks
    weigh ``colour_weight`` and ``1 - colour_weight``), 0 for a grey one, in between for a
    nearly grey one (its colour histogram below wfd's ``COLOUR_FLOOR``)."""
    lc = np.sqrt(np.einsum("ij,ij->i", colour, colour))
    ll = np.sqrt(np.einsum("ij,ij->i", layout, layout))
    ratio = np.sqrt((1.0 - colour_weight) / colour_weight)
    return np.where(ll > 0, lc / np.where(ll > 0, ll, 1.0) * ratio, np.where(lc > 0, 1.0, 0.0))


def canonical_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dot products row by row in float64, rounded to float32: the same for (a, b) and (b, a)
    and in any process, unlike a BLAS score whose last bits follow its blocking and threads."""
    return np.einsum("ij,ij->i", np.asarray(a, np.float64), np.asarray(b, np.float64)).astype(np.float32)


def united_lists(quantizer: Any, parts: tuple[np.ndarray, ...], nprobe: int) -> np.ndarray:
    """Each probe part's ``nprobe`` nearest IVF lists per query (``quantizer.search``),
    united: ascending, with -1 where a list repeats (or the quantiser had none). The graph's
    and the contamination scan's IVF searches both probe these."""
    lists = np.sort(np.concatenate([quantizer.search(np.ascontiguousarray(p, dtype=np.float32), nprobe)[1]
                                    for p in parts], axis=1), axis=1)
    lists[:, 1:][lists[:, 1:] == lists[:, :-1]] = -1
    return lists


def pair_score_of(markers: list[dict[str, Any]]) -> PairScore:
    """The pair rule the feature model names (above); shards must agree."""
    rules = {repr(PairScore.from_model(m.get("model")).to_json()) for m in markers if int(m.get("count", 0))}
    if len(rules) > 1:
        raise ValueError(f"feature shards disagree on their pair rule: {sorted(rules)}")
    return PairScore.from_model(next((m.get("model") for m in markers if int(m.get("count", 0))), None))
