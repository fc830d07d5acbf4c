"""Contamination's image scan at scale: the flow's planning, one exact scan task, the IVF index.

The corpus side is the benchmark's staged corpus with its 512-d features (every image a
training image: ``corpus_splits: null``, so no manifest is needed); the evaluation side is
a fixed set of :data:`EVAL_QUERIES` images (a benchmark does not grow with the corpus),
written as one embedded evaluation chunk under ``{data}/eval``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from bench.scale import FIXED, GUARDED, INPUTS, MODEL_512, STEPS, Scale, _model, step

EVAL_QUERIES = 1000
EVAL_CHUNK = "000000"


def _eval_store(data: str):
    from corpusforge.storage import Store

    return Store(os.path.join(data, "eval"), fsync=False)


def write_eval_features(store, sc: Scale, src: str) -> None:
    """One evaluation chunk of EVAL_QUERIES 512-d features, made like the corpus's (same model
    fingerprint), a tenth of them near copies of corpus vectors."""
    from corpusforge.feature_files import read_shard_features, write_shard_features

    _, model = _model(MODEL_512)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((EVAL_QUERIES, 512)).astype(np.float32)
    _, corpus = read_shard_features(store, MODEL_512, "000000")
    copies = min(EVAL_QUERIES // 10, len(corpus))
    x[:copies] = corpus[:copies] + 0.01 * rng.standard_normal((copies, 512))
    keys = [f"eval{i:06d}" for i in range(EVAL_QUERIES)]
    write_shard_features(_eval_store(os.path.dirname(src)), MODEL_512, EVAL_CHUNK, keys, ["0" * 64] * len(keys),
                         [True] * len(keys), [None] * len(keys), x.astype(np.float16), "bench-eval",
                         {"model": model})


INPUTS["contamination_eval"] = write_eval_features
NEEDS = ("staging", "features512", "contamination_eval")
MODULES = ("tasks.contamination.stage", "faiss")


def _sides(store, data: str):
    """The scan's two sides as image_stage builds them: the corpus's shards listed, each
    side's shard list written under work/ and named by its SHA-256."""
    from tasks.contamination import image_scan as scan
    from tasks.contamination.stage import corpus_feature_shards

    target = scan.write_side(store, "images-target", store, MODEL_512, corpus_feature_shards(store, MODEL_512))
    query = scan.write_side(store, "images-query", _eval_store(data), MODEL_512, [EVAL_CHUNK])
    return query, target


@step("contamination_driver", NEEDS, "flow", MODULES)
def run_contamination_driver(store, sc: Scale, data: str) -> dict[str, Any]:
    """The image scan's work in the flow process (tasks.contamination.stage.image_stage and
    run_scan): the corpus's shards listed, the sides written, the counts, the target digest,
    the pair rule, the search chosen (and an index refused when too big), the scan tasks'
    parameters built; the tasks themselves are not run."""
    from corpusforge.contract import UnitResult
    from tasks.contamination.config import ImageScanConfig
    from tasks.contamination.stage import run_scan

    cfg = ImageScanConfig(model_id=MODEL_512, corpus_splits=None)
    query, target = _sides(store, data)
    params: list[dict[str, Any]] = []
    tasks = 0

    def fan_out(unit: Any, calls: list[dict[str, Any]]) -> list[Any]:
        nonlocal tasks
        tasks += len(calls)
        params.extend(calls)
        return [UnitResult("0" * 64, {}, "0" * 64, {}, action="skipped") for _ in calls]

    result = run_scan(store, "images", query, target, cfg.k, cfg.search, cfg.exact_max_pairs, cfg.ivf,
                      cfg.recall_queries, cfg.flag_above, fan_out=fan_out)
    return {"tasks": tasks, "params": params, "search": result["search"], "targets": result["targets"]}


@step("contamination_scan_exact", NEEDS, "task", MODULES)
def run_contamination_scan_exact(store, sc: Scale, data: str) -> dict[str, Any]:
    """One exact scan task (scan_shard_exact): the evaluation chunk against every corpus
    shard, streamed through a bounded block."""
    from corpusforge.contract import marker_path
    from tasks.contamination.files import found_matches_path
    from tasks.contamination import image_scan as scan

    query, target = _sides(store, data)
    rule = scan.pair_rule(query, target)
    store.remove(marker_path(found_matches_path("images", EVAL_CHUNK)))
    kwargs = dict(out=store, scan="images", query=query, shard=EVAL_CHUNK, target=target,
                  target_digest=target.digest(), k=5, rule=rule)
    result = scan.scan_shard_exact(**kwargs)
    return {"tasks": 1, "params": [kwargs], "queries": result.info["queries"]}


@step("contamination_index_ivf", NEEDS, "task", MODULES)
def run_contamination_index_ivf(store, sc: Scale, data: str) -> dict[str, Any]:
    """The IVF index over every corpus vector (build_scan_index, default IvfConfig: Flat
    lists held in the task's memory). Refused above 16 GiB of lists (8.3M 512-d vectors,
    check_index_size), so nothing is projected past it (:func:`index_refused_above`)."""
    from corpusforge.contract import marker_path
    from tasks.contamination.files import contamination_index
    from tasks.contamination import image_scan as scan
    from tasks.contamination.config import IvfConfig

    query, target = _sides(store, data)
    rule = scan.pair_rule(query, target)
    store.remove(marker_path(contamination_index("images")))
    kwargs = dict(out=store, name="images", target=target, target_digest=target.digest(), cfg=IvfConfig(), rule=rule)
    built = scan.build_scan_index(**kwargs).info
    return {"tasks": 1, "params": [kwargs], "nlist": built["plan"]["nlist"], "vectors": built["n_vectors"]}


def index_refused_above() -> int:
    """The most 512-d vectors whose scan index the stage builds with the default IvfConfig."""
    from tasks.contamination.config import IvfConfig
    from tasks.contamination.image_scan import check_index_size

    lo, hi = 1, 10**9  # check_index_size passes at lo, refuses at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            check_index_size("images", mid, 512, IvfConfig().storage)
            lo = mid
        except ValueError:
            hi = mid
    return lo


STEPS["contamination_index_ivf"] = dataclasses.replace(STEPS["contamination_index_ivf"], refused=index_refused_above())
FIXED += ["contamination_driver", "contamination_scan_exact", "contamination_index_ivf"]
GUARDED += ["contamination_driver", "contamination_scan_exact"]
