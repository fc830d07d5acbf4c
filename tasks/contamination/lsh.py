"""MinHash LSH banding over canary signatures: which (item, corpus text) pairs get compared.

Two texts are a candidate pair when they agree on every value of at least one band. The bands
(:class:`tasks.contamination.config.LshConfig`): the raw and the normalised SHA-256; every
m-subset of the seed's signature positions, m = equal positions the signature threshold needs,
so a pair at or above it is *always* a candidate; and ``b`` bands of ``r`` rows over the
independent LSH signature, P(candidate | J) = 1 − (1 − J^r)^b. Each band value becomes one
64-bit key (SplitMix64 chain over band id and values), which the join splits into equal ranges.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from tasks.contamination.canary import signature_bands_needed
from tasks.contamination.signatures import TextBatch

RAW_BAND, NORMALIZED_BAND = 0, 1
_C1, _C2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class BandChoice:
    """The bands every text of one run is keyed on."""

    signature_subsets: tuple[tuple[int, ...], ...]
    rows_per_band: int
    lsh_bands: int

    def to_json(self) -> dict:
        return {"exact_bands": ["raw_sha256", "normalized_sha256"],
                "signature_subset_size": len(self.signature_subsets[0]) if self.signature_subsets else 0,
                "signature_bands": len(self.signature_subsets), "lsh_rows_per_band": self.rows_per_band,
                "lsh_bands": self.lsh_bands}

    def jaccard_candidate_probability(self, j: float) -> float:
        """Probability that a pair at Jaccard ``j`` shares an LSH band (signature bands aside)."""
        return 1.0 - (1.0 - j ** self.rows_per_band) ** self.lsh_bands


def choose_bands(n_seeds: int, signature_threshold: float, num_perm: int, rows_per_band: int) -> BandChoice:
    m = signature_bands_needed(signature_threshold, n_seeds)
    subsets = tuple(itertools.combinations(range(n_seeds), m)) if m <= n_seeds else ()
    return BandChoice(subsets, rows_per_band, num_perm // rows_per_band)


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _C1
        x = (x ^ (x >> np.uint64(27))) * _C2
        return x ^ (x >> np.uint64(31))


def _chain(band: int, values: np.ndarray) -> np.ndarray:
    """One 64-bit key per row of ``values`` [n, w] for band id ``band``."""
    with np.errstate(over="ignore"):
        key = np.full(values.shape[0], _mix(np.array([np.uint64(band + 1) * _GOLD], dtype=np.uint64))[0],
                      dtype=np.uint64)
    for col in range(values.shape[1]):
        key = _mix(key ^ values[:, col].astype(np.uint64))
    return key


def _sha_prefix(hexes: list[str]) -> np.ndarray:
    return np.fromiter((int(h[:16], 16) for h in hexes), dtype=np.uint64, count=len(hexes))


def band_keys(batch: TextBatch, choice: BandChoice, empty: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row, band, key)`` arrays: every band key of every text of ``batch``. A text empty as
    given (``empty``) gets no key at all, one whose normalised form is empty only its raw key, one
    without shingles no signature keys."""
    rows, bands, keys = [], [], []

    def add(which: np.ndarray, band: int, band_keys: np.ndarray) -> None:
        rows.append(which)
        bands.append(np.full(len(which), band, np.int16))
        keys.append(band_keys)

    idx = np.arange(len(batch), dtype=np.int32)
    live = ~empty
    add(idx[live], RAW_BAND, _sha_prefix([h for h, e in zip(batch.sha256, empty, strict=True) if not e]))
    norm = live & ~batch.normalized_empty
    add(idx[norm], NORMALIZED_BAND, _sha_prefix([h for h, ok in zip(batch.normalized_sha256, norm, strict=True) if ok]))
    has = live & batch.has_signature
    sig, lsh, sub = batch.signature[has], batch.lsh[has], idx[has]
    for band, subset in enumerate(choice.signature_subsets, 2):
        add(sub, band, _chain(band, sig[:, list(subset)]))
    first, r = 2 + len(choice.signature_subsets), choice.rows_per_band
    for b in range(choice.lsh_bands):
        add(sub, first + b, _chain(first + b, lsh[:, b * r:(b + 1) * r]))
    return np.concatenate(rows), np.concatenate(bands), np.concatenate(keys)

