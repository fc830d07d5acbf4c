"""Best training matches of query images: exact chunked scans or an IVF index, as units of work.

A scan has a *query side* (the evaluation set's chunks, or a corpus's held-out images) and a
*target side* (a corpus's training images), each a set of feature shards of one model,
optionally narrowed to a split selection (:mod:`tasks.contamination.selection`). Per query
shard it writes the top-k targets of every query to ``found_matches_path`` (MATCH_SCHEMA).
Exact: one unit per query shard streams every target shard; its fingerprint holds the digest
of the whole target side, so a changed training shard rescans every query shard. IVF: one
unit builds the index, one unit per query shard searches it and rescores exactly, a recall
unit rescans a seeded sample exactly. The pair rule, the feature-identity check
(:class:`FeatureMismatch`) and the memory bounds: docs/contamination.md, "How it runs".
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, TypedDict

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.contract import UnitResult, read_pinned, run_unit, unit_fingerprint
from corpusforge.feature_files import read_shard_features, require_features
from corpusforge.hashing import canonical_json, fingerprint, stable_uniform
from corpusforge.layout import feature_keys
from tasks.contamination.files import (CONTAMINATION_FOUND, MATCH_SCHEMA, contamination_index,
                                       contamination_index_offsets, found_matches_path, select_path)
from corpusforge.storage import Store
from corpusforge.tarshard import HashingWriter
from corpusforge.version import code_version
from tasks.contamination import similarity as sim
from tasks.contamination.config import IvfConfig
from tasks.contamination.selection import read_selection
from tasks.shared.ivf import IVF_TRAIN_PER_LIST, auto_nlist
from tasks.shared.pair_score import PairScore, pair_score_of, unit_rows


class FeatureMismatch(ValueError):
    """Query and target features were not made by the same model, weights, preprocessing and dtype."""


SIDES = "work/contamination/sides"  # each scan side's shard list (a task reads it by its SHA-256)
SIDE_SCHEMA = pa.schema([("shard", pa.string()), ("selection_digest", pa.string())])
# A scan task holds the whole IVF index in its memory (read whole, not mapped) and so does
# the task that builds it: above this an index is refused before anything is built, with
# the alternatives named (the per-task bound; the near-duplicate graph's index refuses likewise).
INDEX_TASK_BYTES = 16 << 30


def side_list_path(name: str) -> str:
    return f"{SIDES}/{name}.parquet"


@dataclass(frozen=True)
class ScanSide:
    """Feature shards of one model in one store, optionally narrowed to a split selection. Its shard
    list is a file in ``work`` (beside the selection files) pinned by its SHA-256 (:func:`write_side`):
    a few hundred bytes of task parameters at any shard count (every name: ~1.8 MB at 10⁵ shards)."""

    store: Store
    model_id: str
    work: Store
    listing: str
    listing_sha256: str
    selection: str | None = None

    @property
    def shards(self) -> tuple[str, ...]:
        return _side_rows(self)[0]

    @property
    def selection_digests(self) -> dict[str, str]:
        return _side_rows(self)[1]

    def shard_digest(self, shard: str) -> list[str | None]:
        return [require_features(self.store, self.model_id, shard).digest, self.selection_digests.get(shard)]

    def digest(self) -> str:
        """Content of the whole side: every shard's feature digest and selection digest."""
        return fingerprint([self.model_id, self.selection, [[s, *self.shard_digest(s)] for s in self.shards]])


def write_side(work: Store, listing: str, store: Store, model_id: str, shards: list[str],
               selection: str | None = None, selection_digests: dict[str, str] | None = None) -> ScanSide:
    """Write a side's shard list (in order, with each shard's selection digest) under
    ``work/contamination/sides/`` and return the side that names it by its SHA-256."""
    digests = selection_digests or {}
    table = pa.table({"shard": list(shards), "selection_digest": [digests.get(s) for s in shards]},
                     schema=SIDE_SCHEMA)
    return ScanSide(store, model_id, work, listing, work.write_parquet(side_list_path(listing), table), selection)


def remove_sides(work: Store, scan: str) -> None:
    """Remove a switched-off scan's side lists (``{scan}-*``), as its found matches go."""
    for name in work.listdir(SIDES):
        if name.startswith(f"{scan}-"):
            work.remove(f"{SIDES}/{name}")


_SIDE_CACHE: dict[tuple[str, str], tuple[tuple[str, ...], dict[str, str]]] = {}


def _side_rows(side: ScanSide) -> tuple[tuple[str, ...], dict[str, str]]:
    """The side's shard list, read once per process (a few sides are kept: a scan's two)."""
    rel = side_list_path(side.listing)
    key = (side.work.path(rel), side.listing_sha256)
    if key not in _SIDE_CACHE:
        if len(_SIDE_CACHE) >= 4:
            _SIDE_CACHE.pop(next(iter(_SIDE_CACHE)))
        t = pq.read_table(io.BytesIO(read_pinned(side.work, rel, side.listing_sha256, "a contamination scan")))
        shards = t["shard"].to_pylist()
        _SIDE_CACHE[key] = (tuple(shards), {s: d for s, d in zip(shards, t["selection_digest"].to_pylist(),
                                                                 strict=True) if d is not None})
    return _SIDE_CACHE[key]


@dataclass
class ShardVectors:
    keys: list[str]
    shas: list[str]
    x: np.ndarray              # unit float32 rows


def feature_identity(side: ScanSide) -> dict[str, Any]:
    """The one (model fingerprint, dtype, decode size) every shard of ``side`` was made with."""
    seen: dict[str, dict[str, Any]] = {}
    for shard in side.shards:
        info = require_features(side.store, side.model_id, shard).info
        ident = {"model": info.get("model"), "dtype": info.get("dtype"), "decode_size": info.get("decode_size"),
                 "random_init": bool(info.get("random_init"))}
        seen.setdefault(canonical_json(ident), ident)
    if len(seen) > 1:
        raise FeatureMismatch(f"features/{side.model_id} of {side.store.root} were made with "
                              f"{len(seen)} different settings; re-extract them")
    return next(iter(seen.values())) if seen else {}


def check_same_features(query: ScanSide, target: ScanSide) -> dict[str, Any]:
    """Refuse a scan whose two sides differ in model, weights, preprocessing, dtype or decode size."""
    a, b = feature_identity(query), feature_identity(target)
    if a and b and a != b:
        fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if "model" in fields:
            ma, mb = a["model"] or {}, b["model"] or {}
            fields += [f"model.{k}" for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)]
        raise FeatureMismatch(
            f"evaluation features differ from the corpus's in {', '.join(fields)}: refused. Extract the "
            f"evaluation set with the corpus's feature settings (model, weights, preprocessing, dtype and the "
            f"same set of models, which fixes the decode size).")
    return b


def pair_rule(query: ScanSide, target: ScanSide) -> PairScore:
    """The pair rule both sides' feature models name (they must agree; plain cosine when none)."""
    return pair_score_of([require_features(side.store, side.model_id, shard).info
                          for side in (query, target) for shard in side.shards])


def load_shard(side: ScanSide, shard: str) -> ShardVectors:
    """One shard's embedded images, narrowed to the selection, as unit vectors."""
    keys, feats = read_shard_features(side.store, side.model_id, shard)
    t = side.store.read_parquet(feature_keys(side.model_id, shard), columns=["key", "sha256", "ok"])
    sha_of = {k: s for k, s, ok in zip(t["key"].to_pylist(), t["sha256"].to_pylist(), t["ok"].to_pylist(),
                                       strict=True) if ok}
    if side.selection is not None:
        chosen = read_selection(side.work, side.selection, shard)
        pick = [i for i, k in enumerate(keys) if k in chosen]
        keys, feats = [keys[i] for i in pick], feats[pick]
    x = unit_rows(feats) if len(keys) else np.zeros((0, feats.shape[-1] if feats.ndim == 2 else 1), np.float32)
    return ShardVectors(keys, [sha_of[k] for k in keys], x)


def _resolve(side: ScanSide, offsets: np.ndarray, ids: np.ndarray
             ) -> tuple[dict[int, tuple[str, str, str]], dict[int, np.ndarray]]:
    """Target id → (shard, key, sha256) and id → unit row, reading only the shards the ids fall in,
    one at a time: the rows are copied out of each shard's vectors (a row view kept every shard
    the ids touch alive, ~2 MB each: 465 MB at 1M targets, bench/scale.py contamination_scan_exact)."""
    out: dict[int, tuple[str, str, str]] = {}
    vectors: dict[int, np.ndarray] = {}
    flat = np.unique(ids[ids >= 0])
    owner = np.searchsorted(offsets, flat, side="right") - 1
    for s in np.unique(owner):
        shard = side.shards[int(s)]
        v = load_shard(side, shard)
        mine = flat[owner == s]
        rows = (mine - offsets[s]).astype(np.int64)
        for i, row, x in zip(mine.tolist(), rows.tolist(), v.x[rows], strict=True):  # fancy index: a copy
            out[i] = (shard, v.keys[row], v.shas[row])
            vectors[i] = x
    return out, vectors


def match_table(query_keys: list[str], sims: np.ndarray, ids: np.ndarray,
                lookup: dict[int, tuple[str, str, str]]) -> pa.Table:
    rows = {n: [] for n in MATCH_SCHEMA.names}
    for qi, key in enumerate(query_keys):
        for rank in range(ids.shape[1]):
            i = int(ids[qi, rank])
            if i < 0:
                break
            shard, tkey, tsha = lookup[i]
            for n, v in zip(MATCH_SCHEMA.names, (key, rank, shard, tkey, tsha, float(sims[qi, rank])), strict=True):
                rows[n].append(v)
    return pa.table(rows, schema=MATCH_SCHEMA)


def scan_exact_topk(q: np.ndarray, target: ScanSide, k: int, rule: PairScore
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact top-k of ``q`` by ``rule`` over every target shard, streamed; also the target id offsets."""
    sims, ids = sim.empty_topk(len(q), k)
    offsets = [0]
    for shard in target.shards:
        v = load_shard(target, shard)
        s, i = sim.exact_topk(q, v.x, k, offsets[-1], rule)
        sims, ids = sim.merge_topk(sims, ids, s, i, k)
        offsets.append(offsets[-1] + len(v.keys))
    return sims, ids, np.asarray(offsets, dtype=np.int64)


def scan_shard_exact(out: Store, scan: str, query: ScanSide, shard: str, target: ScanSide, target_digest: str,
                     k: int, rule: PairScore) -> UnitResult:
    """Exact top-k targets of one query shard (skipped when query and target content are unchanged)."""
    fp = unit_fingerprint("contamination-scan", code_version(__name__), ["exact", k, rule.to_json()],
                          [query.shard_digest(shard), target_digest])

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        v = load_shard(query, shard)
        sims, ids, offsets = scan_exact_topk(v.x, target, k, rule)
        table = match_table(v.keys, sims, ids, _resolve(target, offsets, ids)[0])
        rel = found_matches_path(scan, shard)
        return {rel: out.write_parquet(rel, table)}, {"queries": len(v.keys), "search": "exact",
                                                      "pair_score": rule.to_json()}

    return run_unit(out, found_matches_path(scan, shard), fp, compute)


def n_selected(side: ScanSide, shard: str) -> int:
    if side.selection is None:
        return int(require_features(side.store, side.model_id, shard).info["count"])
    return side.work.read_parquet(select_path(side.selection, shard), columns=["key"]).num_rows


def index_bytes(n_vectors: int, form_dim: int, storage: str) -> int:
    """Codes and ids of every vector of an ``IVF{nlist},{Flat|SQfp16}`` scan index."""
    return n_vectors * ((4 if storage == "flat" else 2) * form_dim + 8)


def check_index_size(scan: str, n_vectors: int, form_dim: int, storage: str, limit: int = INDEX_TASK_BYTES) -> None:
    """Refuse, before anything is built, an index that one task could not hold (``limit``
    bytes), naming the alternatives: the exact scan streams the training shards through a
    bounded block (no index at all; its cost is queries × targets), or fewer targets."""
    need = index_bytes(n_vectors, form_dim, storage)
    if need > limit:
        raise ValueError(
            f"contamination scan '{scan}': an IVF index of {n_vectors:,} training vectors x {form_dim} dims "
            f"(IVF,{'Flat' if storage == 'flat' else 'SQfp16'}) needs {need / 2**30:.1f} GiB in the task that "
            f"builds it and in every scan task, above the {limit / 2**30:.1f} GiB one task may hold: refused. "
            f"Use search: exact (streams the training shards, no index; cost queries x targets, fine for an "
            f"evaluation set of thousands of images), or scan fewer training images (corpus_splits, "
            f"leakage.train, or a smaller corpus). Contamination has no on-disk IVF-PQ index like the "
            f"near-duplicate graph's")


class ScanIndexInfo(TypedDict):
    """A built scan index's marker info (:func:`build_scan_index`); each target shard's first id
    is a file beside the index (:func:`contamination_index_offsets`), not info: the result is
    every scan task's parameter."""

    plan: dict[str, Any]
    dim: int
    n_vectors: int
    pair_score: dict[str, Any]


class ScanRecall(TypedDict):
    """The index's recall on a sample of queries (:func:`scan_recall`), as the receipt keeps it."""

    sampled_queries: int
    flagged_exact: int
    flagged_found: int
    recall_flagged: float | None
    top1_agreement: float | None
    threshold: float
    pair_score: dict[str, Any]


def build_scan_index(out: Store, name: str, target: ScanSide, target_digest: str, cfg: IvfConfig,
                     rule: PairScore) -> UnitResult[ScanIndexInfo]:
    """An IVF index over every target vector's candidate form under ``rule`` (ids: position
    in target-shard order)."""
    n_est = sum(n_selected(target, s) for s in target.shards)
    nlist = cfg.nlist or auto_nlist(n_est, per_root=1)
    n_train = min(n_est, cfg.max_train, nlist * IVF_TRAIN_PER_LIST)
    choice = {"nlist": nlist, "nprobe": min(cfg.nprobe, nlist), "storage": cfg.storage, "n_train": n_train,
              "seed": cfg.seed}
    fp = unit_fingerprint("contamination-index", code_version(__name__), [choice, rule.to_json()], target_digest)
    rel = contamination_index(name)

    def compute() -> tuple[dict[str, str], ScanIndexInfo]:
        if cfg.faiss_threads:
            faiss.omp_set_num_threads(cfg.faiss_threads)
        rate = n_train / max(n_est, 1)
        sample, order, dim = [], [], None
        for shard in target.shards:
            v = load_shard(target, shard)
            dim = v.x.shape[1] if len(v.keys) else dim
            u = np.fromiter((stable_uniform(cfg.seed, k) for k in v.keys), dtype=np.float64, count=len(v.keys))
            pick = np.flatnonzero(u < rate)
            sample.append(rule.candidate_forms(v.x[pick]))
            order.append(u[pick])
        if dim is None:
            raise ValueError(f"scan {name}: the target side has no vectors")
        train = np.concatenate(sample)[np.argsort(np.concatenate(order), kind="stable")]
        if len(train) < choice["nlist"]:
            raise ValueError(f"scan {name}: {len(train)} training vectors for {choice['nlist']} IVF lists")
        index = sim.new_ivf(rule.form_dim(dim), choice["nlist"], cfg.storage, choice["nprobe"], cfg.seed)
        index.train(train)
        del train, sample
        offsets = [0]
        for shard in target.shards:
            v = load_shard(target, shard)
            if len(v.keys):
                index.add(rule.candidate_forms(v.x))
            offsets.append(offsets[-1] + len(v.keys))
        with out.atomic_write(rel) as f:
            sink = HashingWriter(f)
            faiss.write_index(index, faiss.PyCallbackIOWriter(sink.write))
        first = contamination_index_offsets(name)
        first_sha = out.write_parquet(first, pa.table({"first_id": pa.array(offsets, pa.int64())}))
        return {rel: sink.sha256, first: first_sha}, {"plan": choice, "dim": int(dim), "n_vectors": int(offsets[-1]),
                                                      "pair_score": rule.to_json()}

    return run_unit(out, rel, fp, compute)


_INDEX_CACHE: dict[tuple[str, str], tuple[faiss.Index, np.ndarray]] = {}


def load_scan_index(out: Store, name: str, built: UnitResult[ScanIndexInfo]) -> tuple[faiss.Index, np.ndarray]:
    """The saved index and each target shard's first id in it, read once per process (keyed
    by the index's fingerprint; the ids pinned by their SHA-256)."""
    key = (out.path(contamination_index(name)), built.fingerprint)
    if key not in _INDEX_CACHE:
        _INDEX_CACHE.clear()
        with out.open(contamination_index(name)) as f:  # streamed: never the file's bytes and the index at once
            index = faiss.read_index(faiss.PyCallbackIOReader(f.read))
        faiss.extract_index_ivf(index).nprobe = built.info["plan"]["nprobe"]
        first = contamination_index_offsets(name)
        data = read_pinned(out, first, built.outputs[first], f"the contamination scan '{name}'")
        offsets = pq.read_table(io.BytesIO(data))["first_id"].to_numpy()
        _INDEX_CACHE[key] = index, offsets
    return _INDEX_CACHE[key]


def scan_shard_ivf(out: Store, scan: str, query: ScanSide, shard: str, target: ScanSide, index_name: str,
                   built: UnitResult[ScanIndexInfo], k: int, rule: PairScore) -> UnitResult:
    """Top-k targets of one query shard from the IVF index, by their exact scores under ``rule``.

    The index ranks by the forms' inner product, which over-estimates a nearly grey coloured
    target for a colourless query (up to 1/sqrt(1-w)), so ``k + RESCORE_EXTRA`` candidates are
    rescored exactly from their stored rows and the best ``k`` kept. Each part of the query form
    (coloured, colourless) chooses its own ``nprobe`` lists: chosen by the whole form, lists of
    one kind crowded out the other's (``bench/contamination_probes.py``)."""
    fp = unit_fingerprint("contamination-scan", code_version(__name__), ["ivf", k, rule.to_json()],
                          [query.shard_digest(shard), built.fingerprint])

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        v = load_shard(query, shard)
        index, offsets = load_scan_index(out, index_name, built)
        depth = k + sim.RESCORE_EXTRA
        forms = rule.query_forms(v.x)
        _, found = (sim.ivf_search_by_list(index, forms, depth, probes=rule.probe_parts(forms))
                    if len(v.keys) else sim.empty_topk(0, depth))
        lookup, vectors = _resolve(target, offsets, found)
        sims, ids = sim.rescore_topk(v.x, found, vectors, k, rule)
        table = match_table(v.keys, sims, ids, lookup)
        rel = found_matches_path(scan, shard)
        return {rel: out.write_parquet(rel, table)}, {"queries": len(v.keys), "search": "ivf",
                                                      "pair_score": rule.to_json()}

    return run_unit(out, found_matches_path(scan, shard), fp, compute)


def recall_path(scan: str) -> str:
    return f"{CONTAMINATION_FOUND}/{scan}-recall.json"


def scan_recall(out: Store, scan: str, query: ScanSide, target: ScanSide, target_digest: str, k: int,
                threshold: float, n_sample: int, seed: int, found_digests: list[str], rule: PairScore
                ) -> UnitResult[ScanRecall]:
    """Recall of the index on a seeded sample of queries, against an exact scan of every target:
    ``recall_flagged``, the share of the exact scan's flagged queries (best > threshold) the index
    also flagged; ``top1_agreement``, the share whose best target is the same."""
    fp = unit_fingerprint("contamination-recall", code_version(__name__),
                          [k, threshold, n_sample, seed, rule.to_json()],
                          [[query.shard_digest(s) for s in query.shards], target_digest, found_digests])
    rel = recall_path(scan)

    def compute() -> tuple[dict[str, str], ScanRecall]:
        n_total = sum(n_selected(query, s) for s in query.shards)
        rate = n_sample / max(n_total, 1)
        keys, xs = [], []
        for shard in query.shards:
            v = load_shard(query, shard)
            pick = [i for i, key in enumerate(v.keys) if stable_uniform(seed, f"recall:{key}") < rate]
            keys += [v.keys[i] for i in pick]
            xs.append(v.x[pick])
        q = np.concatenate(xs) if xs else np.zeros((0, 1), np.float32)
        sims, ids, offsets = scan_exact_topk(q, target, k, rule) if len(keys) else (*sim.empty_topk(0, k), None)
        exact = {key: (float(sims[i, 0]), int(ids[i, 0])) for i, key in enumerate(keys)}
        lookup = _resolve(target, offsets, ids[:, :1])[0] if len(keys) else {}
        approx: dict[str, tuple[float, str]] = {}
        for shard in query.shards:
            t = out.read_parquet(found_matches_path(scan, shard))
            for key, rank, tkey, s in zip(t["query_key"].to_pylist(), t["rank"].to_pylist(),
                                          t["target_key"].to_pylist(), t["similarity"].to_pylist(), strict=True):
                if rank == 0 and key in exact:
                    approx[key] = (s, tkey)
        flagged = [key for key, (s, _) in exact.items() if s > threshold]
        found = [key for key in flagged if approx.get(key, (-np.inf, None))[0] > threshold]
        same = sum(1 for key, (_, i) in exact.items() if i >= 0 and approx.get(key, (0, None))[1] == lookup[i][1])
        result: ScanRecall = {"sampled_queries": len(keys), "flagged_exact": len(flagged), "flagged_found": len(found),
                  "recall_flagged": (len(found) / len(flagged)) if flagged else None,
                  "top1_agreement": (same / len(keys)) if keys else None, "threshold": threshold,
                  "pair_score": rule.to_json()}
        return {rel: out.write_json(rel, result)}, result

    return run_unit(out, rel, fp, compute)


def choose_search(mode: str, n_queries: int, n_targets: int, exact_max_pairs: float) -> str:
    """exact or ivf: ``auto`` is exact while queries × targets stays within ``exact_max_pairs``
    (and whenever the targets are too few to train an index)."""
    if mode != "auto":
        return mode
    return "exact" if n_targets < 39 * 16 or n_queries * n_targets <= exact_max_pairs else "ivf"
