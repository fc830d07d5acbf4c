"""Text canaries at corpus scale: per-text facts, an LSH join in buckets, verification, decisions.

Units, each under the stage contract (files under ``work/contamination/text/``): *texts*, one
per corpus part and per evaluation chunk (hashes, shingle identities, signatures →
``{docs|queries}/{unit}``; band keys sorted by key → ``{doc|query}_bands/{unit}``); *join*, one
per key-range bucket (pairs sharing a (band, key) → ``candidates/{bucket}``, by doc unit);
*verify*, one per group of doc units (every candidate pair, or in exhaustive mode every pair,
scored exactly; the best per query → ``scores/{group}``); *decide*, one per evaluation chunk
(→ ``contamination/text/{chunk}.parquet``); *recall*, a seeded sample of queries compared with
every corpus text (→ ``brute/{unit}``) against what the join proposed.

Nothing ever holds all pairs: a join task holds one key range of band rows, a verify task one
group's docs plus the queries it needs. A band value shared by more than ``max_docs_per_key``
corpus texts keeps the first ones (counted; recall shows it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp

from corpusforge.contract import UnitResult, require_marker, run_unit, unit_fingerprint
from corpusforge.hashing import stable_uniform
from tasks.contamination.files import TEXT_ROW_SCHEMA, text_rows_path, text_work_path
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.contamination.canary import CanaryThresholds, PairScores, decide, round3
from tasks.contamination.config import TextCanaryConfig
from tasks.contamination.lsh import BandChoice, band_keys, choose_bands
from tasks.contamination.signatures import TextBatch, text_batch

DOCS, QUERIES, DOC_BANDS, QUERY_BANDS = "docs", "queries", "doc_bands", "query_bands"
CANDIDATES, SCORES, BRUTE, SAMPLE = "candidates", "scores", "brute", "sample"

PAYLOAD_SCHEMA = pa.schema([
    ("row", pa.int32()), ("doc_id", pa.string()), ("field", pa.string()), ("text", pa.string()),
    ("sha256", pa.string()), ("normalized_sha256", pa.string()), ("normalized_empty", pa.bool_()),
    ("n_grams", pa.int32()), ("signature", pa.list_(pa.uint32())), ("grams", pa.list_(pa.uint64())),
])
BAND_SCHEMA = pa.schema([("key", pa.uint64()), ("band", pa.int16()), ("row", pa.int32())])
PAIR_SCHEMA = pa.schema([("d_unit", pa.string()), ("d_row", pa.int32()), ("q_unit", pa.string()),
                         ("q_row", pa.int32())])
SCORE_SCHEMA = pa.schema([
    ("q_unit", pa.string()), ("q_row", pa.int32()), ("d_unit", pa.string()), ("d_row", pa.int32()),
    ("exact", pa.bool_()), ("normalized", pa.bool_()), ("direct", pa.float64()), ("signature", pa.float64()),
    ("intersection", pa.int32()), ("union", pa.int32()), ("compared", pa.int64()),
])
BRUTE_SCHEMA = PAIR_SCHEMA.append(pa.field("rule", pa.string()))


def thresholds_of(cfg: TextCanaryConfig) -> CanaryThresholds:
    return CanaryThresholds(cfg.exact, cfg.normalized, cfg.direct_jaccard, cfg.signature, cfg.review_direct_jaccard,
                            cfg.review_signature)


def choose_text_bands(cfg: TextCanaryConfig) -> BandChoice:
    return choose_bands(len(cfg.seeds), cfg.signature, cfg.lsh.num_perm, cfg.lsh.rows_per_band)


# ---- payloads: the facts of a unit's texts, as stored --------------------------------
@dataclass
class Payload:
    ids: list[str]
    fields: list[str | None]
    texts: list[str]
    sha256: list[str]
    normalized_sha256: list[str]
    n_grams: np.ndarray
    signature: np.ndarray          # uint32 [n, seeds]
    gram_offsets: np.ndarray
    gram_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def _payload_table(ids: Sequence[str], fields: Sequence[str | None], texts: Sequence[str], b: TextBatch) -> pa.Table:
    sig = pa.ListArray.from_arrays(pa.array(np.arange(0, b.signature.size + 1, b.signature.shape[1] or 1,
                                                      dtype=np.int32)), pa.array(b.signature.ravel()))
    grams = pa.ListArray.from_arrays(pa.array(b.gram_offsets.astype(np.int32)), pa.array(b.gram_ids))
    return pa.table({"row": np.arange(len(ids), dtype=np.int32), "doc_id": list(ids), "field": list(fields),
                     "text": list(texts), "sha256": b.sha256, "normalized_sha256": b.normalized_sha256,
                     "normalized_empty": b.normalized_empty, "n_grams": b.n_grams, "signature": sig,
                     "grams": grams}, schema=PAYLOAD_SCHEMA)


def _list_parts(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy()
    return offsets - offsets[0], values[offsets[0]:offsets[-1]]


def payload_from_table(t: pa.Table) -> Payload:
    so, sv = _list_parts(t["signature"])
    go, gv = _list_parts(t["grams"])
    n = t.num_rows
    width = int(so[1] - so[0]) if n else 0
    return Payload(t["doc_id"].to_pylist(), t["field"].to_pylist(), t["text"].to_pylist(), t["sha256"].to_pylist(),
                   t["normalized_sha256"].to_pylist(), t["n_grams"].to_numpy(),
                   sv.reshape(n, width) if n else np.zeros((0, 0), np.uint32), go, gv)


def read_payload(store: Store, kind: str, unit: str) -> Payload:
    return payload_from_table(store.read_parquet(text_work_path(kind, unit)))


def text_unit(out: Store, kind: str, unit: str, read: Callable[[], tuple[list[str], list[str | None], list[str]]],
              inputs: Any, cfg: TextCanaryConfig) -> UnitResult:
    """Facts and band keys of one unit's texts (``kind``: docs or queries)."""
    choice = choose_text_bands(cfg)
    fp = unit_fingerprint(f"contamination-text-{kind}", code_version(__name__),
                          [cfg.seeds, cfg.lsh.num_perm, cfg.lsh.seed, choice.to_json()], inputs)
    bands_kind = DOC_BANDS if kind == DOCS else QUERY_BANDS

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        ids, fields, texts = read()
        batch = text_batch(texts, cfg.seeds, cfg.lsh.num_perm, cfg.lsh.seed)
        empty = np.array([not t for t in texts], dtype=bool)
        rows, bands, keys = band_keys(batch, choice, empty)
        order = np.argsort(keys, kind="stable")  # ties keep (band, row) order: deterministic
        band_table = pa.table({"key": keys[order], "band": bands[order], "row": rows[order]}, schema=BAND_SCHEMA)
        p_rel, b_rel = text_work_path(kind, unit), text_work_path(bands_kind, unit)
        outputs = {p_rel: out.write_parquet(p_rel, _payload_table(ids, fields, texts, batch)),
                   b_rel: out.write_parquet(b_rel, band_table)}
        return outputs, {"texts": len(texts), "empty": int(empty.sum()), "band_rows": int(len(keys))}

    return run_unit(out, text_work_path(kind, unit), fp, compute)


# ---- reading row ranges of sorted files ---------------------------------------------
def read_range(store: Store, rel: str, column: str, lo: Any, hi: Any) -> pa.Table:
    """Rows with ``lo <= column <= hi`` of a file sorted by ``column``, reading only the row
    groups whose statistics overlap the range."""
    with store.open(rel) as f:
        pf = pq.ParquetFile(f)
        j = pf.schema_arrow.get_field_index(column)
        groups = []
        for g in range(pf.num_row_groups):
            stats = pf.metadata.row_group(g).column(j).statistics
            if stats is None or not stats.has_min_max or not (stats.max < lo or stats.min > hi):
                groups.append(g)
        table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
    mask = pc.and_(pc.greater_equal(table[column], pa.scalar(lo, table.schema.field(column).type)),
                   pc.less_equal(table[column], pa.scalar(hi, table.schema.field(column).type)))
    return table.filter(mask)


def bucket_range(bucket: int, buckets: int) -> tuple[int, int]:
    """The key range [lo, hi] of ``bucket`` out of ``buckets`` equal ranges of uint64."""
    span = (1 << 64) // buckets
    lo = bucket * span
    hi = (1 << 64) - 1 if bucket == buckets - 1 else lo + span - 1
    return lo, hi


def _band_rows(out: Store, kind: str, units: Sequence[str], lo: int, hi: int) -> tuple[np.ndarray, ...]:
    keys, bands, rows, owner = [], [], [], []
    for u, unit in enumerate(units):
        t = read_range(out, text_work_path(kind, unit), "key", lo, hi)
        keys.append(t["key"].to_numpy())
        bands.append(t["band"].to_numpy())
        rows.append(t["row"].to_numpy())
        owner.append(np.full(t.num_rows, u, dtype=np.int32))
    cat = (lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt))
    return (cat(keys, np.uint64), cat(bands, np.int16), cat(rows, np.int32), cat(owner, np.int32))


def join_bucket(out: Store, bucket: int, buckets: int, doc_units: dict[str, str], query_units: dict[str, str],
                max_docs_per_key: int) -> UnitResult:
    """Candidate pairs of one key range: texts sharing a band value (``*_units``: unit → band digest)."""
    fp = unit_fingerprint("contamination-text-join", code_version(__name__), [bucket, buckets, max_docs_per_key],
                          [sorted(doc_units.items()), sorted(query_units.items())])
    rel = text_work_path(CANDIDATES, f"{bucket:05d}")

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        lo, hi = bucket_range(bucket, buckets)
        d_names, q_names = sorted(doc_units), sorted(query_units)
        dk, db, dr, du = _band_rows(out, DOC_BANDS, d_names, lo, hi)
        qk, qb, qr, qu = _band_rows(out, QUERY_BANDS, q_names, lo, hi)
        band_rows = int(len(dk) + len(qk))
        # only corpus rows whose key some query has can pair (whole key groups survive, so the cap below
        # sees every corpus text of each surviving band value)
        live = np.isin(dk, qk)
        dk, db, dr, du = dk[live], db[live], dr[live], du[live]
        # cap the corpus texts per band value: the first ones in (unit, row) order
        order = np.lexsort((dr, du, dk, db))
        dk, db, dr, du = dk[order], db[order], dr[order], du[order]
        new = np.ones(len(dk), dtype=bool)
        new[1:] = (dk[1:] != dk[:-1]) | (db[1:] != db[:-1])
        start = np.maximum.accumulate(np.where(new, np.arange(len(dk)), 0))
        rank = np.arange(len(dk)) - start
        keep = rank < max_docs_per_key
        truncated_keys = set(zip(db[rank == max_docs_per_key].tolist(), dk[rank == max_docs_per_key].tolist(),
                                 strict=True))
        d = pa.table({"band": db[keep], "key": dk[keep], "d_unit": du[keep], "d_row": dr[keep]})
        q = pa.table({"band": qb, "key": qk, "q_unit": qu, "q_row": qr})
        j = q.join(d, keys=["band", "key"], join_type="inner")
        truncated = len(truncated_keys & set(zip(qb.tolist(), qk.tolist(), strict=True)))
        pairs = j.select(["d_unit", "d_row", "q_unit", "q_row"]).group_by(
            ["d_unit", "d_row", "q_unit", "q_row"], use_threads=False).aggregate([])
        pairs = pairs.sort_by([("d_unit", "ascending"), ("d_row", "ascending"), ("q_unit", "ascending"),
                               ("q_row", "ascending")])
        names_d, names_q = np.array(d_names, dtype=object), np.array(q_names, dtype=object)
        table = pa.table({"d_unit": names_d[pairs["d_unit"].to_numpy()].tolist() if pairs.num_rows else [],
                          "d_row": pairs["d_row"], "q_unit": names_q[pairs["q_unit"].to_numpy()].tolist()
                          if pairs.num_rows else [], "q_row": pairs["q_row"]}, schema=PAIR_SCHEMA)
        return {rel: out.write_parquet(rel, table)}, {"pairs": table.num_rows, "band_rows": band_rows,
                                                      "truncated_keys": truncated}

    return run_unit(out, rel, fp, compute)


# ---- verification ---------------------------------------------------------------------
_round3 = functools.lru_cache(maxsize=1 << 16)(round3)


def _codes(*columns: Sequence[str]) -> list[np.ndarray]:
    """Integer codes of strings shared across columns (equal strings, equal codes)."""
    table: dict[str, int] = {}
    return [np.fromiter((table.setdefault(v, len(table)) for v in col), dtype=np.int64, count=len(col))
            for col in columns]


def gram_matrix(p: Payload, vocab: np.ndarray) -> sp.csr_matrix:
    """Texts × shingle identities (0/1), columns indexed in ``vocab`` (sorted)."""
    cols = np.searchsorted(vocab, p.gram_ids)
    return sp.csr_matrix((np.ones(len(cols), np.int32), cols, p.gram_offsets), shape=(len(p), len(vocab)))


def _round3_all(x: np.ndarray) -> np.ndarray:
    values, inverse = np.unique(x, return_inverse=True)
    return np.array([_round3(float(v)) for v in values], dtype=np.float64)[inverse] if len(x) else x


def _take(p: Payload, rows: np.ndarray) -> Payload:
    """The payload of ``rows`` only (so per-pair work scales with the pairs, not the unit)."""
    lengths = p.gram_offsets[rows + 1] - p.gram_offsets[rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = np.repeat(p.gram_offsets[rows] - offsets[:-1], lengths)
    grams = p.gram_ids[starts + np.arange(offsets[-1])] if offsets[-1] else np.zeros(0, np.uint64)
    return Payload([p.ids[i] for i in rows], [p.fields[i] for i in rows], [p.texts[i] for i in rows],
                   [p.sha256[i] for i in rows], [p.normalized_sha256[i] for i in rows], p.n_grams[rows],
                   p.signature[rows], offsets, grams)


def score_pairs(q: Payload, qi: np.ndarray, d: Payload, di: np.ndarray) -> dict[str, np.ndarray]:
    """Every canary score of the pairs (q[qi[n]], d[di[n]]), vectorised over the rows involved."""
    uq, qi = np.unique(qi, return_inverse=True)
    ud, di = np.unique(di, return_inverse=True)
    q, d = _take(q, uq), _take(d, ud)
    q_sha, d_sha = _codes(q.sha256, d.sha256)
    q_nsha, d_nsha = _codes(q.normalized_sha256, d.normalized_sha256)
    exact = q_sha[qi] == d_sha[di]
    normalized = (q_nsha[qi] == d_nsha[di]) & (q.n_grams[qi] > 0)
    both = (q.n_grams[qi] > 0) & (d.n_grams[di] > 0)
    width = q.signature.shape[1] if q.signature.ndim == 2 and q.signature.shape[1] else 1
    agree = (q.signature[qi] == d.signature[di]).sum(axis=1) if len(qi) else np.zeros(0)
    signature = np.where(both, agree / width, 0.0)
    vocab = np.unique(np.concatenate([q.gram_ids, d.gram_ids]))
    inter = np.asarray(gram_matrix(q, vocab)[qi].multiply(gram_matrix(d, vocab)[di]).sum(axis=1)).ravel() \
        if len(qi) else np.zeros(0, np.int64)
    inter = inter.astype(np.int64)
    union = q.n_grams[qi].astype(np.int64) + d.n_grams[di] - inter
    direct = inter / np.maximum(union, 1)
    return {"exact": exact, "normalized": normalized, "direct": _round3_all(direct),
            "signature": _round3_all(signature), "intersection": inter, "union": union}


def verify_group(out: Store, group: str, d_units: dict[str, str], q_units: dict[str, str],
                 candidates: dict[str, str] | None) -> UnitResult:
    """Best pair per query among one group's corpus texts (``candidates``: bucket file →
    digest, or None to compare every query with every text of the group)."""
    fp = unit_fingerprint("contamination-text-verify", code_version(__name__),
                          ["exhaustive" if candidates is None else "lsh"],
                          [sorted(d_units.items()), sorted(q_units.items()), sorted((candidates or {}).items())])
    rel = text_work_path(SCORES, group)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        names = sorted(d_units)
        grouped: dict[tuple[str, str], tuple[list[int], list[int]]] = {}  # (doc unit, query unit) -> rows
        if candidates is not None:
            parts = [read_range(out, c, "d_unit", names[0], names[-1]) for c in sorted(candidates)]
            pairs = pa.concat_tables(parts) if parts else PAIR_SCHEMA.empty_table()
            pairs = pairs.filter(pc.is_in(pairs["d_unit"], pa.array(names)))
            for du, dr, qu, qr in zip(*(pairs[n].to_pylist() for n in PAIR_SCHEMA.names), strict=True):
                qi_l, di_l = grouped.setdefault((du, qu), ([], []))
                qi_l.append(qr)
                di_l.append(dr)
        queries = {u: read_payload(out, QUERIES, u) for u in sorted(q_units)}
        best: list[dict[str, Any]] = []
        compared = 0
        for unit in names:
            docs = read_payload(out, DOCS, unit)
            live_d = np.flatnonzero([bool(t) for t in docs.texts])
            for q_unit, q in queries.items():
                if candidates is None:
                    live_q = np.flatnonzero([bool(t) for t in q.texts])
                    qi, di = np.repeat(live_q, len(live_d)), np.tile(live_d, len(live_q))
                else:
                    qi_l, di_l = grouped.get((unit, q_unit), ([], []))
                    qi, di = np.asarray(qi_l, dtype=np.int64), np.asarray(di_l, dtype=np.int64)
                if not len(qi):
                    continue
                compared += len(qi)
                s = score_pairs(q, qi, docs, di)
                best += _best_rows(q_unit, qi, unit, di, s)
        table = pa.Table.from_pylist(_best_per_query(best), schema=SCORE_SCHEMA)
        return {rel: out.write_parquet(rel, table)}, {"compared": compared, "queries": table.num_rows}

    return run_unit(out, rel, fp, compute)


def _rank_key(r: dict[str, Any]) -> tuple:
    return (-max(r["direct"], r["signature"]), not r["exact"], not r["normalized"], r["d_unit"], r["d_row"])


def _best_rows(q_unit: str, qi: np.ndarray, d_unit: str, di: np.ndarray, s: dict[str, np.ndarray]
               ) -> list[dict[str, Any]]:
    """The best pair of each query among these pairs (ties: first corpus text)."""
    top = np.maximum(s["direct"], s["signature"])
    order = np.lexsort((di, ~s["normalized"], ~s["exact"], -top, qi))
    first = np.ones(len(order), dtype=bool)
    first[1:] = qi[order][1:] != qi[order][:-1]
    counts = np.bincount(qi, minlength=int(qi.max()) + 1)
    return [{"q_unit": q_unit, "q_row": int(qi[n]), "d_unit": d_unit, "d_row": int(di[n]),
             "exact": bool(s["exact"][n]), "normalized": bool(s["normalized"][n]),
             "direct": float(s["direct"][n]), "signature": float(s["signature"][n]),
             "intersection": int(s["intersection"][n]), "union": int(s["union"][n]), "compared": int(counts[qi[n]])}
            for n in order[first]]


def _best_per_query(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    compared: dict[tuple[str, int], int] = {}
    for r in rows:
        k = (r["q_unit"], r["q_row"])
        compared[k] = compared.get(k, 0) + r["compared"]
        if k not in out or _rank_key(r) < _rank_key(out[k]):
            out[k] = r
    return [{**out[k], "compared": compared[k]} for k in sorted(out)]


# ---- decisions --------------------------------------------------------------------------
def decide_chunk(out: Store, chunk: str, groups: dict[str, str], cfg: TextCanaryConfig) -> UnitResult:
    """Per (item, field) of one evaluation chunk: the best corpus text and the decision."""
    t = thresholds_of(cfg)
    fp = unit_fingerprint("contamination-text-decide", code_version(__name__), [t.__dict__],
                          [require_marker(out, text_work_path(QUERIES, chunk), "text queries").digest,
                           sorted(groups.items())])
    rel = text_rows_path(chunk)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        q = read_payload(out, QUERIES, chunk)
        found = [read_range(out, text_work_path(SCORES, g), "q_unit", chunk, chunk) for g in sorted(groups)]
        best = _best_per_query(pa.concat_tables(found).to_pylist() if found else [])
        wanted: dict[str, list[int]] = {}
        for r in best:
            wanted.setdefault(r["d_unit"], []).append(r["d_row"])
        docs = {u: _doc_rows(out, u, sorted(set(js))) for u, js in wanted.items()}
        rows, counts = [], {"quarantine": 0, "review": 0, "retain": 0, "empty": 0}
        by_row = {r["q_row"]: r for r in best}
        for i in range(len(q)):
            r = by_row.get(i)
            scores = None if r is None else PairScores(r["exact"], r["normalized"], r["direct"], r["signature"],
                                                       r["intersection"], r["union"])
            decision, rule = decide(scores, t)
            empty = not q.texts[i]
            counts["empty" if empty else decision] += 1
            row = {"item_id": q.ids[i], "field": q.fields[i], "empty": empty, "text_sha256": q.sha256[i],
                   "normalized_sha256": q.normalized_sha256[i], "n_shingles": int(q.n_grams[i]),
                   "signature": q.signature[i].tolist() if q.n_grams[i] else None,
                   "decision": "retain" if empty else decision, "rule": rule, "compared": 0}
            if r is not None:
                d = docs[r["d_unit"]][r["d_row"]]
                row.update(match_doc_id=d["doc_id"], match_unit=r["d_unit"], match_text=d["text"],
                           match_sha256=d["sha256"], match_normalized_sha256=d["normalized_sha256"],
                           match_signature=d["signature"] if d["n_grams"] else None,
                           exact=r["exact"], normalized=r["normalized"], direct_jaccard=r["direct"],
                           signature_estimate=r["signature"], intersection=r["intersection"], union=r["union"],
                           compared=r["compared"])
            rows.append(row)
        table = pa.Table.from_pylist(rows, schema=TEXT_ROW_SCHEMA)
        return {rel: out.write_parquet(rel, table)}, counts

    return run_unit(out, rel, fp, compute)


def _doc_rows(out: Store, unit: str, rows: list[int]) -> dict[int, dict[str, Any]]:
    """A few rows of a corpus unit's payload (without the shingle identities)."""
    t = out.read_parquet(text_work_path(DOCS, unit), columns=["doc_id", "text", "sha256", "normalized_sha256",
                                                              "n_grams", "signature"])
    return dict(zip(rows, t.take(pa.array(rows, pa.int64())).to_pylist(), strict=True))


# ---- recall of the LSH join against comparing every pair -------------------------------
def sample_queries(out: Store, q_units: dict[str, str], n_sample: int, seed: int) -> UnitResult:
    """A seeded sample of non-empty queries (by hash of item id and field), in one file."""
    rel = text_work_path(SAMPLE, "_sample")
    fp = unit_fingerprint("contamination-text-sample", code_version(__name__), [n_sample, seed],
                          sorted(q_units.items()))

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        total = sum(require_marker(out, text_work_path(QUERIES, u), "text queries").info["texts"]
                    for u in q_units)
        rate = n_sample / max(total, 1)
        parts = []
        for u in sorted(q_units):
            t = out.read_parquet(text_work_path(QUERIES, u))
            pick = [i for i, (item, field, text) in enumerate(zip(t["doc_id"].to_pylist(), t["field"].to_pylist(),
                                                                   t["text"].to_pylist(), strict=True))
                    if text and stable_uniform(seed, f"{item}\x00{field}") < rate]
            part = t.take(pa.array(pick, pa.int64()))
            parts.append(part.append_column("q_unit", pa.array([u] * len(pick), pa.string())))
        table = pa.concat_tables(parts) if parts else PAYLOAD_SCHEMA.append(
            pa.field("q_unit", pa.string())).empty_table()
        return {rel: out.write_parquet(rel, table)}, {"sampled": table.num_rows}

    return run_unit(out, rel, fp, compute)


def rule_pairs(q: Payload, d: Payload, t: CanaryThresholds, block: int = 20_000) -> list[tuple[int, int, str]]:
    """Every (query, doc) pair meeting a quarantine or review rule, found by scoring *all*
    pairs: shingle intersections as one sparse product, signatures, hashes and rules as
    dense arrays over blocks of ``block`` corpus texts (memory: queries × block)."""
    if not len(q) or not len(d):
        return []
    vocab = np.unique(np.concatenate([q.gram_ids, d.gram_ids]))
    qm = gram_matrix(q, vocab)
    q_sha, d_sha = _codes(q.sha256, d.sha256)
    q_nsha, d_nsha = _codes(q.normalized_sha256, d.normalized_sha256)
    q_live = np.array([bool(x) for x in q.texts])[:, None]
    width = q.signature.shape[1]
    found: list[tuple[int, int, str]] = []
    for lo in range(0, len(d), block):
        hi = min(len(d), lo + block)
        dm = gram_matrix(_take(d, np.arange(lo, hi)), vocab)
        inter = (qm @ dm.T).toarray().astype(np.int64)
        union = q.n_grams[:, None].astype(np.int64) + d.n_grams[None, lo:hi] - inter
        direct = _round3_all((inter / np.maximum(union, 1)).ravel()).reshape(inter.shape)
        agree = np.zeros(inter.shape, dtype=np.int32)
        for p in range(width):
            agree += q.signature[:, p][:, None] == d.signature[lo:hi, p][None, :]
        both = (q.n_grams[:, None] > 0) & (d.n_grams[None, lo:hi] > 0)
        sig = np.where(both, agree / width, 0.0)
        d_live = np.array([bool(x) for x in d.texts[lo:hi]])[None, :]
        exact = (q_sha[:, None] == d_sha[None, lo:hi]) & q_live & d_live
        norm = (q_nsha[:, None] == d_nsha[None, lo:hi]) & (q.n_grams[:, None] > 0)
        rules = [(t.exact and exact, "exact"), (t.normalized and norm, "normalized"),
                 (direct >= t.direct_jaccard, f"direct_jaccard>={t.direct_jaccard}"),
                 (sig >= t.signature, f"signature>={t.signature}")]
        if t.review_direct_jaccard is not None:
            rules.append((direct >= t.review_direct_jaccard, f"direct_jaccard>={t.review_direct_jaccard}"))
        if t.review_signature is not None:
            rules.append((sig >= t.review_signature, f"signature>={t.review_signature}"))
        taken = ~q_live & np.ones(inter.shape, dtype=bool)
        for mask, name in rules:
            if mask is False:
                continue
            hit = mask & ~taken
            for a, b in zip(*np.nonzero(hit), strict=True):
                found.append((int(a), int(b) + lo, name))
            taken |= mask
    return sorted(found)


def brute_unit(out: Store, d_unit: str, d_digest: str, sample_digest: str, cfg: TextCanaryConfig) -> UnitResult:
    """Rule-meeting pairs of the sampled queries against every text of one corpus unit."""
    t = thresholds_of(cfg)
    rel = text_work_path(BRUTE, d_unit)
    fp = unit_fingerprint("contamination-text-brute", code_version(__name__), [t.__dict__], [d_digest, sample_digest])

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        sample = out.read_parquet(text_work_path(SAMPLE, "_sample"))
        q = payload_from_table(sample)
        d = read_payload(out, DOCS, d_unit)
        units, rows = sample["q_unit"].to_pylist(), sample["row"].to_pylist()
        found = rule_pairs(q, d, t)
        table = pa.table({"d_unit": [d_unit] * len(found), "d_row": [j for _, j, _ in found],
                          "q_unit": [units[i] for i, _, _ in found], "q_row": [rows[i] for i, _, _ in found],
                          "rule": [r for _, _, r in found]}, schema=BRUTE_SCHEMA)
        return {rel: out.write_parquet(rel, table)}, {"pairs": len(found)}

    return run_unit(out, rel, fp, compute)


def lsh_recall(out: Store, mode: str, brute_units: Sequence[str], candidate_files: Sequence[str],
               sampled: int) -> dict[str, Any]:
    """Share of the sample's rule-meeting pairs (all pairs compared) that the LSH join proposed."""
    truth = pa.concat_tables([out.read_parquet(text_work_path(BRUTE, u)) for u in brute_units]) \
        if brute_units else BRUTE_SCHEMA.empty_table()
    pairs = {(a, b, c, d): r for a, b, c, d, r in zip(*(truth[n].to_pylist() for n in BRUTE_SCHEMA.names),
                                                        strict=True)}
    found = set(pairs) if mode == "exhaustive" else set()
    for rel in candidate_files:  # none in exhaustive mode; every pair is found there anyway
        c = out.read_parquet(rel)
        found.update(p for p in zip(*(c[n].to_pylist() for n in PAIR_SCHEMA.names), strict=True) if p in pairs)
    by_rule: dict[str, dict[str, int]] = {}
    for p, rule in pairs.items():
        name = rule.split(">=")[0]
        e = by_rule.setdefault(name, {"pairs": 0, "found": 0})
        e["pairs"] += 1
        e["found"] += p in found
    total = len(pairs)
    return {"mode": mode, "sampled_queries": sampled, "rule_pairs": total, "found": len(found),
            "recall": (len(found) / total) if total else None,
            "by_rule": dict(sorted(by_rule.items())),
            "method": "every sampled query compared with every corpus text (sparse shingle product, all "
                      "signatures); recall = rule-meeting pairs proposed by the LSH join / all of them"}


def digest_of_units(out: Store, kind: str, units: Sequence[str]) -> dict[str, str]:
    return {u: require_marker(out, text_work_path(kind, u), kind).digest for u in units}


def sample_rel() -> str:
    return text_work_path(SAMPLE, "_sample")


def canary_receipt_fields(cfg: TextCanaryConfig) -> dict[str, Any]:
    choice = choose_text_bands(cfg)
    return {"seeds": list(cfg.seeds), "thresholds": thresholds_of(cfg).__dict__, "bands": choice.to_json(),
            "lsh": cfg.lsh.model_dump(mode="json"),
            "jaccard_candidate_probability": {str(j): round(choice.jaccard_candidate_probability(j), 6)
                                              for j in (0.2, 0.3, cfg.direct_jaccard, 0.5, 0.7)}}
