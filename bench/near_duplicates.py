"""Planted near-duplicates found by the weight-free descriptor vs perceptual hashes.

One run on the sample corpus (``write_sample_corpus(n, seed)``, written to a temporary
folder unless ``--corpus`` points at one), three methods side by side:

* ``wfd``: :mod:`tasks.features.wfd` (decoded as the extraction stage decodes), pairs by
  cosine similarity from a FAISS range search, at GPIC's thresholds 0.90 (candidate
  graph) and 0.9625 (pair removal);
* ``phash`` and ``dhash``: imagededup's ``PHash`` / ``DHash`` with their own image loading
  and default ``find_duplicates`` threshold (Hamming distance <= 10 of 64 bits).

Reported per edit kind: planted pairs found (copy and its original linked directly; burst
shots linked to the first shot); then false pairs (linked images that are not copies of
each other, exact copies and burst shots counted as related) and seconds spent encoding
and searching. imagededup is a benchmark-only dependency::

    pip install --no-deps imagededup scikit-learn PyWavelets joblib threadpoolctl narwhals
    HF_HUB_OFFLINE=1 python bench/near_duplicates.py            # n=2000, ~1-2 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from sample_corpus import write_sample_corpus  # noqa: E402
from sample_corpus.truth import related_groups  # noqa: E402
from tasks.features.decode import DecodeError, decode_rgb  # noqa: E402
from tasks.features.extract import decode_size  # noqa: E402
from tasks.features.wfd import WeightFreeDescriptor  # noqa: E402

GPIC_THRESHOLDS = (0.90, 0.9625)


def planted_pairs(truth: dict) -> list[tuple[str, str, str]]:
    pairs = [(e["key"], e["copy_of"], e["edit"]) for e in truth["near_duplicates"]]
    return pairs + [(k, c["keys"][0], c["edit"]) for c in truth["clusters"] for k in c["keys"][1:]]


def wfd_pairs(root: Path, records: list[dict], threshold: float) -> tuple[dict[str, set[str]], dict, float, float]:
    """Linked keys at ``threshold``, the similarity matrix pieces we report, encode and search seconds."""
    import faiss

    model = WeightFreeDescriptor()
    draft = decode_size([model])
    start = time.perf_counter()
    keys, rows = [], []
    for record in records:
        try:
            image = decode_rgb((root / record["path"]).read_bytes(), draft_size=draft)
        except (DecodeError, FileNotFoundError):
            continue
        keys.append(record["key"])
        rows.append(model.preprocess(image))
    feats = np.concatenate([model.embed(np.stack(rows[i:i + 256])) for i in range(0, len(rows), 256)])
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    index = faiss.IndexFlatIP(feats.shape[1])
    index.add(feats)
    lims, sims, ids = index.range_search(feats, threshold - 1e-6)
    search_s = time.perf_counter() - start
    linked: dict[str, set[str]] = {k: set() for k in keys}
    for i, key in enumerate(keys):
        for j in ids[lims[i]:lims[i + 1]]:
            if j != i:
                linked[key].add(keys[j])
    return linked, {"keys": keys, "feats": feats}, encode_s, search_s


def hash_pairs(root: Path, records: list[dict],
               method: Callable) -> tuple[dict[str, set[str]], dict[str, str], float, float]:
    """imagededup: encode every file with its own loader, then its default duplicate search."""
    import logging

    logging.getLogger("imagededup").setLevel(logging.ERROR)
    hasher = method(verbose=False)
    start = time.perf_counter()
    encodings = {}
    for record in records:
        path = root / record["path"]
        if path.exists():
            code = hasher.encode_image(image_file=str(path))
            if code is not None:
                encodings[record["key"]] = code
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    found = hasher.find_duplicates(encoding_map=encodings)  # default max_distance_threshold=10
    search_s = time.perf_counter() - start
    return {k: set(v) for k, v in found.items()}, encodings, encode_s, search_s


def found_without_false_pairs(score_of: Callable[[str, str], float], keys: list[str], scores: np.ndarray,
                              groups: dict[str, str], pairs: list[tuple[str, str, str]]) -> tuple[dict, float]:
    """The strictest useful operating point: planted pairs scoring above every unrelated pair."""
    g = np.array([groups[k] for k in keys])
    upper = np.triu_indices(len(keys), 1)
    best_unrelated = float(scores[upper][g[upper[0]] != g[upper[1]]].max())
    found: dict[str, int] = {}
    for copy, original, edit in pairs:
        found[edit] = found.get(edit, 0) + int(score_of(copy, original) > best_unrelated)
    return found, best_unrelated


def score(linked: dict[str, set[str]], groups: dict[str, str], pairs: list[tuple[str, str, str]]) -> dict:
    """Planted pairs found per edit kind, and false pairs among every linked pair."""
    found: dict[str, int] = {}
    for copy, original, edit in pairs:
        found[edit] = found.get(edit, 0) + int(original in linked.get(copy, ()) or copy in linked.get(original, ()))
    false = {tuple(sorted((a, b))) for a, bs in linked.items() for b in bs
             if a in groups and b in groups and groups[a] != groups[b]}
    return {"found": found, "false_pairs": len(false)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="sample corpus rows (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", help="an existing sample corpus folder (else one is written to a temp dir)")
    args = parser.parse_args(argv)
    from imagededup.methods import DHash, PHash

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.corpus) if args.corpus else Path(tmp) / "sample"
        if not args.corpus:
            write_sample_corpus(str(root), n=args.n, seed=args.seed)
        truth = json.loads((root / "ground_truth.json").read_text())
        records = pq.read_table(root / "metadata.parquet", columns=["key", "path"]).to_pylist()
        pairs = planted_pairs(truth)

        linked, wfd_data, wfd_enc, wfd_search = wfd_pairs(root, records, min(GPIC_THRESHOLDS))
        keys, feats = wfd_data["keys"], wfd_data["feats"]
        groups = related_groups(keys, truth)
        index = {k: i for i, k in enumerate(keys)}
        results = {}
        for threshold in GPIC_THRESHOLDS:
            at = {k: {b for b in v if float(feats[index[k]] @ feats[index[b]]) >= threshold} for k, v in linked.items()}
            results[f"wfd>={threshold}"] = {**score(at, groups, pairs), "encode_s": wfd_enc, "search_s": wfd_search}
        sims = feats @ feats.T
        zero_fp = {"wfd": found_without_false_pairs(lambda a, b: sims[index[a], index[b]], keys, sims, groups, pairs)}
        for name, method in (("phash", PHash), ("dhash", DHash)):
            hashed, codes, enc, search = hash_pairs(root, records, method)
            results[f"{name}<=10"] = {**score(hashed, groups, pairs), "encode_s": enc, "search_s": search}
            bits = np.array([np.unpackbits(np.frombuffer(bytes.fromhex(codes[k]), np.uint8)) if k in codes
                             else np.full(64, 2, np.uint8) for k in keys], dtype=np.int32)
            hamming = (bits[:, None, :] != bits[None, :, :]).sum(-1)  # a key without a hash matches nothing
            zero_fp[name] = found_without_false_pairs(lambda a, b, h=hamming: -h[index[a], index[b]], keys,
                                                      -hamming, groups, pairs)

    edits = sorted({e for _, _, e in pairs})
    totals = {e: sum(1 for _, _, x in pairs if x == e) for e in edits}
    names = list(results)
    print(f"sample corpus n={args.n} seed={args.seed}: {len(keys)} decodable images, {len(pairs)} planted pairs\n")
    print(f"{'edit':14s} {'pairs':>5s} " + " ".join(f"{n:>12s}" for n in names))
    for e in edits:
        print(f"{e:14s} {totals[e]:5d} " + " ".join(f"{results[n]['found'].get(e, 0):12d}" for n in names))
    print(f"{'ALL found':14s} {len(pairs):5d} " + " ".join(f"{sum(results[n]['found'].values()):12d}" for n in names))
    print(f"{'false pairs':14s} {'':5s} " + " ".join(f"{results[n]['false_pairs']:12d}" for n in names))
    print(f"{'encode s':14s} {'':5s} " + " ".join(f"{results[n]['encode_s']:12.1f}" for n in names))
    print(f"{'search s':14s} {'':5s} " + " ".join(f"{results[n]['search_s']:12.2f}" for n in names))

    print("\nat zero false pairs (threshold just past the closest unrelated pair):")
    for name, (found, best) in zero_fp.items():
        limit = f"similarity > {best:.3f}" if name == "wfd" else f"Hamming distance < {abs(best):.0f}"
        print(f"  {name:6s} {sum(found.values()):4d} of {len(pairs)} found ({limit}); "
              + ", ".join(f"{e} {found.get(e, 0)}/{totals[e]}" for e in edits))
    g = np.array([groups[k] for k in keys])
    upper = np.triu_indices(len(keys), 1)
    unrelated = sims[upper][g[upper[0]] != g[upper[1]]]
    print(f"\nwfd unrelated pairs ({unrelated.size}): median {np.median(unrelated):.3f}, p99 "
          f"{np.percentile(unrelated, 99):.3f}, p99.99 {np.percentile(unrelated, 99.99):.3f}, "
          f"max {unrelated.max():.3f}")
    print("wfd planted pairs: edit, median (min) similarity, recall@1 against all unrelated images")
    unrelated_rows = np.where(g[:, None] == g[None, :], -np.inf, sims)
    for e in edits:
        vals = [(sims[index[a], index[b]], sims[index[a], index[b]] > unrelated_rows[index[a]].max())
                for a, b, x in pairs if x == e and a in index and b in index]
        s = np.array([v for v, _ in vals])
        print(f"  {e:14s} {np.median(s):.3f} ({s.min():.3f})  recall@1 {np.mean([r for _, r in vals]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
