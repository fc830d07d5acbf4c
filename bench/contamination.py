"""Contamination scans against brute force, side by side (goal: >= 20x at recall >= 0.99).

Each case runs in its own subprocess so its peak RSS is its own.

**Images** — N corpus vectors (default 1M, d = 512: clustered unit vectors, 5 % planted
near-duplicates, as ``bench/graph.py``) and Q evaluation vectors (default 10K: 5 % noisy
copies of corpus vectors at cosine 0.91–0.99, the rest fresh). Flagged = best cosine > 0.9.

* numpy brute force: ``Q @ X.T`` in blocks of 256 queries, max per row (every pair).
* the stage's IVF index (``tasks/contamination/similarity.py``: IVF{nlist},Flat, k-means
  on a seeded sample, nlist = the power of two at or above √N): build once, then search list
  by list (one matrix product per probed list, one BLAS thread), for each ``--nprobe``;
  FAISS's own per-query scan is timed beside it and must flag the same queries. The
  ratio the goal is about is the search (a corpus's index is built once and reused by
  every evaluation set through the stage contract); build and build + search are printed.
* recall = flagged items the index finds / flagged items brute force finds.

**Text canaries** — C synthetic captions (default 1M, 8–25 words: content words drawn
Zipf-like from 30K, function words between them) and T items (default 10K: 2 % exact copies, 2 % case and
punctuation variants, 4 % with ~10 % of words replaced, the rest fresh), run through
the stage's own units (``tasks/contamination/text_scan.py``): per-text facts, LSH join
in key-range buckets, verification, decisions.

* brute force: sampled items compared with *every* caption by the stage's exhaustive
  scorer (sparse shingle products, all signatures — vectorised, not a Python loop),
  timed at two sample sizes and extrapolated to all T as a fixed part (reading every
  caption's facts) plus a part per item.
* ratios: per evaluation set (the captions' facts are computed once per corpus and kept
  by the stage contract, like an index; both sides then need only the items' facts and
  the comparison) and end to end (the captions' facts counted on both sides).
* recall = rule-meeting (item, caption) pairs proposed by the LSH join / all such pairs
  of the sampled items.

    .venv/bin/python bench/contamination.py [--part image|text|all] [--corpus 1000000] [--queries 10000]
        [--captions 1000000] [--items 10000] [--brute-items 40]

Measured vs extrapolated: the image sizes are the issue's (10K × 1M, d = 512); the index
build and search run on all 10K queries, the numpy brute force on ``--brute-queries``
(default 2,000, so the run fits a few minutes on 2 cores) scaled linearly to 10K — its
cost per query is constant — and recall is over those brute-forced queries. The text
sizes default to a tenth of the issue's on captions and items (1M × 10K instead of
10M × 100K); the stage's units run on all of them, brute force on a sample (fixed part +
per-item part, extrapolated). Nothing at the issue's text size was run. The output says
which numbers are extrapolated; bench/README.md, "Contamination", lists the figures measured
on this machine (about 6 min for the image part and 6 min for the text part with
``--brute-items 200``, on 2 cores shared with other sessions).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

DIM = 512
THRESHOLD = 0.9


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class Clock:
    """Wall and CPU seconds (all threads) of a block: on a shared machine the CPU time is the
    steadier measure of work, the wall time what a user waits."""

    def __enter__(self) -> Clock:
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


# ---- images ---------------------------------------------------------------------------
def corpus_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Clustered unit vectors with 5 % planted near-duplicates (as bench/graph.py)."""
    rng = np.random.default_rng(seed)
    n_topics = max(10, n // 100)
    centers = rng.standard_normal((n_topics, dim)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    x = np.empty((n, dim), dtype=np.float32)
    for lo in range(0, n, 100_000):
        hi = min(n, lo + 100_000)
        noise = rng.standard_normal((hi - lo, dim), dtype=np.float32) / np.float32(math.sqrt(dim))
        x[lo:hi] = centers[rng.integers(0, n_topics, hi - lo)] + noise
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    dup = rng.choice(n, size=n // 20, replace=False)
    x[dup] = near(x[rng.integers(0, n, size=len(dup))], rng)
    return x


def near(base: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors at cosine 0.91–0.99 to the rows of ``base``."""
    sim = rng.uniform(0.91, 0.99, size=len(base)).astype(np.float32)[:, None]
    r = rng.standard_normal(base.shape, dtype=np.float32)
    r -= np.sum(r * base, axis=1, keepdims=True) * base
    r /= np.linalg.norm(r, axis=1, keepdims=True)
    out = sim * base + np.sqrt(1 - sim**2) * r
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def query_vectors(x: np.ndarray, q: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fresh = corpus_vectors(q, x.shape[1], seed=seed + 100)
    planted = rng.choice(q, size=q // 20, replace=False)
    fresh[planted] = near(x[rng.integers(0, len(x), size=len(planted))], rng)
    return fresh


def case_image_brute(n: int, q: int, dim: int, brute_queries: int) -> dict:
    x = corpus_vectors(n, dim)
    qs = query_vectors(x, q)[:brute_queries]
    best = np.empty(len(qs), dtype=np.float32)
    with Clock() as c:
        for lo in range(0, len(qs), 256):
            best[lo:lo + 256] = (qs[lo:lo + 256] @ x.T).max(axis=1)
    scale = q / len(qs)
    return {"seconds_measured": c.wall, "cpu_measured": c.cpu, "queries_measured": len(qs),
            "seconds_all_queries": c.wall * scale, "cpu_all_queries": c.cpu * scale,
            "peak_rss_gb": peak_rss_gb(), "flagged": np.flatnonzero(best > THRESHOLD).tolist()}


def case_image_ivf(n: int, q: int, dim: int, nlist: int, nprobes: list[int]) -> dict:
    import faiss

    from tasks.contamination import similarity as sim

    x = corpus_vectors(n, dim)
    qs = query_vectors(x, q)
    rng = np.random.default_rng(7)
    train = x[np.sort(rng.choice(n, size=min(n, nlist * 39), replace=False))]
    with Clock() as b:
        index = sim.new_ivf(dim, nlist, "flat", 1, seed=0)
        index.train(train)
        index.add(x)
    del x, train
    searches = {}
    for nprobe in nprobes:
        faiss.extract_index_ivf(index).nprobe = nprobe
        with Clock() as f:
            s_faiss, _ = sim.ivf_search(index, qs, 1)
        with Clock() as c:
            s, _ = sim.ivf_search_by_list(index, qs, 1, nprobe)
        if not np.array_equal(s_faiss[:, 0] > THRESHOLD, s[:, 0] > THRESHOLD):
            raise AssertionError("list-by-list search flags other queries than FAISS's search")
        searches[nprobe] = {"seconds": c.wall, "cpu": c.cpu, "faiss_seconds": f.wall, "faiss_cpu": f.cpu,
                            "flagged": np.flatnonzero(s[:, 0] > THRESHOLD).tolist()}
    return {"build_seconds": b.wall, "build_cpu": b.cpu, "nlist": nlist, "searches": searches,
            "threads": faiss.omp_get_max_threads(), "peak_rss_gb": peak_rss_gb()}


# ---- text -----------------------------------------------------------------------------
FUNCTION_WORDS = ["a", "the", "of", "with", "on", "in", "and", "near", "under", "two", "small", "large"]


def synthetic_captions(n: int, seed: int, vocab: int = 30_000) -> list[str]:
    """Captions of 8–25 words: content words drawn Zipf-like (exponent 1.05) from ``vocab``,
    each followed by a function word with probability 0.4 — common phrases recur, whole
    captions rarely do."""
    rng = np.random.default_rng(seed)
    content = np.array([f"w{i}" for i in range(vocab)])
    weights = 1.0 / np.arange(1, vocab + 1) ** 1.05
    draws = content[rng.choice(vocab, size=n * 25, p=weights / weights.sum())]
    glue = rng.random(n * 25) < 0.4
    fw = np.array(FUNCTION_WORDS)[rng.integers(0, len(FUNCTION_WORDS), n * 25)]
    lengths = rng.integers(8, 26, size=n)
    out, pos = [], 0
    for length in lengths:
        words: list[str] = []
        while len(words) < length:
            words.append(draws[pos])
            if glue[pos]:
                words.append(fw[pos])
            pos += 1
        out.append(" ".join(words[:length]).capitalize() + ".")
    return out


def text_items(corpus: list[str], t: int, seed: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    fresh = synthetic_captions(t, seed + 1000)
    kinds = ["fresh"] * t
    for i in rng.choice(t, size=t * 8 // 100, replace=False).tolist():
        src = corpus[int(rng.integers(len(corpus)))]
        r = rng.random()
        if r < 0.25:
            fresh[i], kinds[i] = src, "exact"
        elif r < 0.5:
            fresh[i], kinds[i] = src.upper().replace(".", " !"), "variant"
        else:
            words = src.split()
            fresh[i] = " ".join(f"x{int(rng.integers(10**6))}" if rng.random() < 0.1 else w for w in words)
            kinds[i] = "edit"
    return fresh, kinds


def case_text(captions: int, items: int, brute_items: int, part_size: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpusforge.storage import Store
    from tasks.contamination import text_scan as ts
    from tasks.contamination.config import EvalSetConfig, LshConfig, TextCanaryConfig, TextCorpusConfig
    from tasks.contamination.eval_set import cut_eval_set
    from tasks.contamination.stage import _groups, stage_eval_set
    from tasks.contamination.text_sources import item_texts, cut_table_parts

    tmp = tempfile.mkdtemp(prefix="bench-contamination-")
    try:
        corpus = synthetic_captions(captions, 0)
        texts, kinds = text_items(corpus, items, 1)
        pq.write_table(pa.table({"text": corpus}), f"{tmp}/corpus.parquet")
        pq.write_table(pa.table({"id": [f"i{i}" for i in range(items)], "prompt": texts}), f"{tmp}/items.parquet")
        del corpus
        cfg = TextCanaryConfig(corpus=TextCorpusConfig(kind="table", path=f"{tmp}/corpus.parquet", part_size=part_size),
                               lsh=LshConfig(mode="lsh"))
        ecfg = EvalSetConfig(source=f"{tmp}/items.parquet", text_fields=["prompt"], image_column=None,
                             chunk_size=max(1000, items // 10))
        out = Store(f"{tmp}/out", fsync=False)
        cuts = cut_eval_set(ecfg)
        stage_eval_set(out, out.sub("eval"), cuts, ecfg)
        chunks = [c.name for c in cuts.chunks]
        times: dict[str, float] = {}
        cpu: dict[str, float] = {}

        with Clock() as c:  # once per corpus (kept by the stage contract), like an index build
            parts = cut_table_parts(out, cfg.corpus).info["parts"]
            doc = [ts.text_unit(out, ts.DOCS, p, _reader(out, p), p, cfg) for p in parts]
        times["corpus_facts"], cpu["corpus_facts"] = c.wall, c.cpu
        with Clock() as c:
            qry = [ts.text_unit(out, ts.QUERIES, ch, lambda ch=ch: item_texts(out, ch, ["prompt"]), ch, cfg)
                   for ch in chunks]
        times["item_facts"], cpu["item_facts"] = c.wall, c.cpu
        d_dig, q_dig = ts.digest_of_units(out, ts.DOCS, parts), ts.digest_of_units(out, ts.QUERIES, chunks)
        band_rows = sum(m.info["band_rows"] for m in doc + qry)
        buckets = max(1, math.ceil(band_rows / 4_000_000))
        with Clock() as c:
            joins = [ts.join_bucket(out, b, buckets, d_dig, q_dig, cfg.lsh.max_docs_per_key) for b in range(buckets)]
        times["join"], cpu["join"] = c.wall, c.cpu
        cands = {ts.text_work_path(ts.CANDIDATES, f"{b:05d}"): m.digest for b, m in enumerate(joins)}
        with Clock() as c:
            groups = _groups(parts, [m.info["texts"] for m in doc])
            verified = [ts.verify_group(out, g, {u: d_dig[u] for u in us}, q_dig, cands) for g, us in groups.items()]
        times["verify"], cpu["verify"] = c.wall, c.cpu
        with Clock() as c:
            scores = {g: m.digest for g, m in zip(groups, verified, strict=True)}
            decided = [ts.decide_chunk(out, ch, scores, cfg) for ch in chunks]
        times["decide"], cpu["decide"] = c.wall, c.cpu
        decisions = {k: sum(m.info[k] for m in decided) for k in ("quarantine", "review", "retain")}

        # brute force: sampled items against every caption with the stage's exhaustive scorer, timed
        # at two sample sizes: a fixed part (reading every caption's facts, building its matrices)
        # plus a part per item, extrapolated to all items
        sample = ts.sample_queries(out, q_dig, brute_items, 0)
        sampled_rows = out.read_parquet(ts.sample_rel())
        units, rows = sampled_rows["q_unit"].to_pylist(), sampled_rows["row"].to_pylist()
        n_sampled = sample.info["sampled"]
        small = max(1, n_sampled // 4)
        truth: set = set()
        clocks = []
        for n in (small, n_sampled):
            q = ts.payload_from_table(sampled_rows.slice(0, n))
            with Clock() as brute:
                for p in parts:
                    d = ts.read_payload(out, ts.DOCS, p)
                    pairs = ts.rule_pairs(q, d, ts.thresholds_of(cfg))
                    if n == n_sampled:
                        truth |= {(p, j, units[i], rows[i]) for i, j, _ in pairs}
            clocks.append(brute)
        found = set()
        for rel in cands:
            t = out.read_parquet(rel)
            for a, b, u, r in zip(*(t[n].to_pylist() for n in ts.PAIR_SCHEMA.names), strict=True):
                if (a, b, u, r) in truth:
                    found.add((a, b, u, r))

        def extrapolate(kind: str) -> dict:
            t_small, t_all = getattr(clocks[0], kind), getattr(clocks[1], kind)
            per_item = max(0.0, (t_all - t_small) / max(n_sampled - small, 1))
            fixed = max(0.0, t_all - per_item * n_sampled)
            return {"fixed": fixed, "per_item": per_item, "all_items": fixed + per_item * items,
                    "measured": t_all}

        per_eval = ("item_facts", "join", "verify", "decide")
        return {"captions": captions, "items": items, "seconds": times, "cpu": cpu,
                "lsh_seconds": sum(times.values()), "lsh_cpu": sum(cpu.values()),
                "lsh_per_eval_seconds": sum(times[k] for k in per_eval),
                "lsh_per_eval_cpu": sum(cpu[k] for k in per_eval),
                "brute_items_measured": [small, n_sampled], "brute_wall": extrapolate("wall"),
                "brute_cpu": extrapolate("cpu"),
                "rule_pairs_in_sample": len(truth), "found_by_lsh": len(found),
                "recall": len(found) / len(truth) if truth else None,
                "pairs_compared": sum(m.info["compared"] for m in verified),
                "all_pairs": captions * items, "buckets": buckets, "decisions": decisions,
                "truncated_band_values": sum(m.info["truncated_keys"] for m in joins),
                "planted": {k: kinds.count(k) for k in sorted(set(kinds))}, "peak_rss_gb": peak_rss_gb()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _reader(out, part: str):
    """The texts of one corpus part as the stage's text unit reads them."""
    from tasks.contamination.text_sources import table_texts

    def read() -> tuple[list[str], list[None], list[str]]:
        ids, texts = table_texts(out, part)
        return ids, [None] * len(ids), texts
    return read


# ---- driver ---------------------------------------------------------------------------
def run_case(name: str, args: dict, threads: int | None = None) -> dict:
    """One case in a fresh interpreter (its own peak RSS); ``threads`` caps BLAS and OpenMP threads."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if threads:
        env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, __file__, "--case", name, json.dumps(args)], capture_output=True,
                         text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"case {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


CASES = {"image_brute": case_image_brute, "image_ivf": case_image_ivf, "text": case_text}


def image_part(a: argparse.Namespace) -> None:
    from tasks.shared.ivf import auto_nlist

    nlist = a.nlist or auto_nlist(a.corpus, per_root=1)
    bq = min(a.brute_queries, a.queries)
    print(f"images: {a.queries:,} queries × {a.corpus:,} corpus vectors, d = {a.dim}, threshold > {THRESHOLD}")
    brute = run_case("image_brute", dict(n=a.corpus, q=a.queries, dim=a.dim, brute_queries=bq))
    # one thread: many small matrix products (one per probed list) lose to thread start-up on 2 shared cores
    ivf = run_case("image_ivf", dict(n=a.corpus, q=a.queries, dim=a.dim, nlist=nlist, nprobes=a.nprobe), threads=1)
    truth = set(brute.pop("flagged"))
    bw, bc = brute["seconds_all_queries"], brute["cpu_all_queries"]
    note = "" if bq == a.queries else f" (measured on {bq:,} queries, scaled to {a.queries:,})"
    print(f"  numpy brute force: {bw:.1f} s wall / {bc:.1f} s CPU{note}, peak {brute['peak_rss_gb']:.2f} GB; "
          f"flagged among the brute-forced queries: {len(truth)}")
    print(f"  IVF{nlist},Flat build (once per corpus, reused): {ivf['build_seconds']:.1f} s wall / "
          f"{ivf['build_cpu']:.1f} s CPU; peak {ivf['peak_rss_gb']:.2f} GB (FAISS threads {ivf['threads']})")
    summary = {}
    for nprobe, r in ivf["searches"].items():
        got = {i for i in r.pop("flagged") if i < bq}
        recall = len(truth & got) / len(truth) if truth else None
        summary[nprobe] = {**r, "recall_flagged": recall}
        print(f"  nprobe={nprobe}: search {r['seconds']:.2f} s wall / {r['cpu']:.2f} s CPU for all {a.queries:,} "
              f"queries (FAISS's per-query scan: {r['faiss_seconds']:.2f} s) → {bw / r['seconds']:.0f}x wall, "
              f"{bc / r['cpu']:.0f}x CPU vs brute force; recall of flagged {recall}; build + search "
              f"{bw / (ivf['build_seconds'] + r['seconds']):.1f}x wall")
    print(json.dumps({"image": {"brute": brute, "ivf": {**ivf, "searches": summary}, "flagged": len(truth)}}))


def text_part(a: argparse.Namespace) -> None:
    r = run_case("text", dict(captions=a.captions, items=a.items, brute_items=a.brute_items,
                              part_size=a.part_size))
    s, c, bw, bc = r["seconds"], r["cpu"], r["brute_wall"], r["brute_cpu"]
    print(f"text canaries: {a.items:,} items × {a.captions:,} captions")
    print("  LSH (stage units), wall/CPU s: " + ", ".join(f"{k.replace('_', ' ')} {s[k]:.1f}/{c[k]:.1f}" for k in s)
          + f"; {r['pairs_compared']:,} of {r['all_pairs']:,} pairs compared; peak {r['peak_rss_gb']:.2f} GB")
    n_small, n_all = r["brute_items_measured"]
    print(f"  brute force (every item against every caption, vectorised): measured on {n_small} and {n_all} items "
          f"({bw['measured']:.1f} s wall / {bc['measured']:.1f} s CPU for {n_all}); fit: {bc['fixed']:.1f} s CPU fixed "
          f"+ {bc['per_item']:.3f} s CPU per item → {bw['all_items']:.0f} s wall / {bc['all_items']:.0f} s CPU "
          f"for all "
          f"{a.items:,} (extrapolated)")
    print(f"  per evaluation set (caption facts kept from an earlier run on both sides): "
          f"{bw['all_items'] / r['lsh_per_eval_seconds']:.0f}x wall, "
          f"{bc['all_items'] / r['lsh_per_eval_cpu']:.0f}x CPU; "
          f"end to end (caption facts computed on both sides): "
          f"{(bw['all_items'] + s['corpus_facts']) / r['lsh_seconds']:.0f}x wall, "
          f"{(bc['all_items'] + c['corpus_facts']) / r['lsh_cpu']:.0f}x CPU")
    print(f"  recall {r['recall']} ({r['found_by_lsh']} of {r['rule_pairs_in_sample']} rule-meeting pairs of the "
          f"sampled items proposed by the join); decisions {r['decisions']} for planted {r['planted']}; band values "
          f"truncated at max_docs_per_key: {r['truncated_band_values']}")
    print(json.dumps({"text": r}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--part", choices=["image", "text", "all"], default="all")
    p.add_argument("--corpus", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=DIM)
    p.add_argument("--brute-queries", type=int, default=2_000, help="queries brute-forced (scaled to all)")
    p.add_argument("--nlist", type=int, default=None, help="default: the stage's (power of two at or above sqrt(N))")
    p.add_argument("--nprobe", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--captions", type=int, default=1_000_000)
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--brute-items", type=int, default=40)
    p.add_argument("--part-size", type=int, default=100_000)
    a = p.parse_args()
    if a.case:
        print(json.dumps(CASES[a.case[0]](**json.loads(a.case[1]))))
        return
    if a.part in ("image", "all"):
        image_part(a)
    if a.part in ("text", "all"):
        text_part(a)


if __name__ == "__main__":
    main()
