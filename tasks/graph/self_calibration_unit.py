"""``near_dedup.calibrate: auto``: the build fits its thresholds on its own pictures, once.

One unit, before the graph's queries (the search floor and every decision read the
thresholds): a seeded sample of the staging shards' images (node ids ranked by a seeded
hash, :data:`SAMPLE` smallest; stable as the corpus grows), self-calibrated with the
configured model (:func:`tasks.graph.self_calibration.calibrate_sample`). Its key holds every
staging shard's digest (the sample is drawn from them all): an unchanged corpus and model reuse
the recorded thresholds, embedding nothing. Files, record and key: docs/near-duplicates.md
("Thresholds fitted to your own pictures").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from corpusforge.contract import UnitResult, remove_tree, require_marker, run_unit, unit_fingerprint
from corpusforge.hashing import canonical_json, sha256_bytes
from corpusforge.layout import staging_index, staging_records, staging_tar
from corpusforge.storage import Store
from corpusforge.version import code_version
from tasks.graph.calibration import pair_hash
from tasks.graph.calibration_report import report_page
from tasks.graph.config import NearDedupConfig
from tasks.graph.nodes import NodeTable, read_shard_table
from tasks.graph.self_calibration import MARGIN, PER_TRANSFORM, SAMPLE, calibrate_sample, chosen_thresholds, reduced
from tasks.shared.features.config import FeaturesConfig, ModelSpec
from tasks.shared.features.decode import DecodeError, decode_rgb
from tasks.shared.features.registry import family_module, load_model

RECORD_PATH = "graph/self_calibration/calibration.json"
REPORT_PATH = "graph/self_calibration/index.html"
FOLDER = "graph/self_calibration"


def model_spec(cfg: NearDedupConfig, features: FeaturesConfig | None) -> ModelSpec:
    """The spec of the graph's model: from the feature config, or wfd's (it has no weights)."""
    specs = {m.model_id: m for m in (features.models if features else [])}
    if cfg.model_id in specs:
        return specs[cfg.model_id]
    if cfg.model_id == "wfd":
        return ModelSpec(name="wfd")
    raise ValueError(f"near_dedup.calibrate: auto needs the spec of model {cfg.model_id!r} (features.models)")


def sample_nodes(nodes: NodeTable, seed: int, n: int) -> np.ndarray:
    """The ``n`` node ids with the smallest seeded hashes, sorted."""
    ids = np.arange(nodes.n_nodes, dtype=np.int64)
    return np.sort(ids[np.argsort(pair_hash(ids, ids, seed), kind="stable")[:n]])


def read_pictures(source: Store, nodes: NodeTable, ids: np.ndarray) -> tuple[list[str], list[str], list[Any]]:
    """(key, sha256, reduced picture) of each node that decodes, in node order."""
    keys, shas, pictures = [], [], []
    owner = nodes.shard_of(ids)
    for s in np.unique(owner):
        shard = nodes.shards[s]
        rec = source.read_parquet(staging_records(shard), columns=["key", "sha256"]).to_pylist()
        idx = {r["key"]: r for r in source.read_parquet(staging_index(shard)).to_pylist()
               if r["ext"] not in ("txt", "json")}
        for node in ids[owner == s].tolist():
            r = rec[node - int(nodes.offsets[s])]
            m = idx.get(r["key"])
            if m is None:
                continue
            try:
                picture = reduced(decode_rgb(source.read_range(staging_tar(shard), m["offset"], m["size"]), 1024))
            except DecodeError:  # ingest decoded it once; a picture that fails here is left out of the sample
                continue
            keys.append(r["key"])
            shas.append(r["sha256"])
            pictures.append(picture)
    return keys, shas, pictures


def self_calibration_call(source: Store, out: Store, cfg: NearDedupConfig, features: FeaturesConfig | None,
                          nodes: NodeTable, table: str) -> dict[str, Any]:
    """The unit's parameters: names, the spec and the fingerprint (module docstring)."""
    spec = model_spec(cfg, features)
    runtime = features.runtime if features else FeaturesConfig().runtime
    allow = features.torchscript_allowlist if features else []
    staged = [require_marker(source, staging_tar(s), "staging shard").digest for s in nodes.shards]
    code = code_version(__name__, family_module(spec), exclude=("tasks.shared.features.registry",))
    fp = unit_fingerprint("graph-self-calibration", code,
                          [spec.model_dump(mode="json"), runtime.precision, cfg.seed, SAMPLE, PER_TRANSFORM, MARGIN,
                           cfg.verifying, cfg.edge_min_similarity, cfg.verification.review_min_similarity],
                          staged)
    return dict(source=source, out=out, cfg=cfg, spec=spec, runtime=runtime, allowlist=list(allow),
                shard_table=table, fp=fp)


def self_calibrate(source: Store, out: Store, cfg: NearDedupConfig, spec: ModelSpec, runtime: Any,
                   allowlist: list[str], shard_table: str, fp: str) -> UnitResult[dict[str, Any]]:
    """Run (or reuse) the calibration; the record is the result's ``info``."""
    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        nodes = read_shard_table(out, shard_table)[0]
        keys, shas, pictures = read_pictures(source, nodes, sample_nodes(nodes, cfg.seed, SAMPLE))
        model = load_model(spec, runtime, allowlist)
        cal, measured = calibrate_sample(pictures, model, seed=cfg.seed, duplicate_above=cfg.pair_removal_above)
        chosen = chosen_thresholds(cal, verifying=cfg.verifying, edge=cfg.edge_min_similarity,
                                   review=cfg.verification.review_min_similarity)
        record = {"model_id": cfg.model_id, "seed": cfg.seed, "margin": cal.margin,
                  "sample": {"pictures": len(keys), "per_transform": PER_TRANSFORM,
                             "sha256": sha256_bytes(canonical_json(shas).encode())},
                  "closest_unrelated": cal.closest_unrelated, "link_above": cal.link_above,
                  "merged_originals": cal.merged_originals, "recall": cal.recall, "digest": cal.digest(),
                  "thresholds": chosen, "report": REPORT_PATH}
        page = report_page(cal, measured, chosen, cfg.model_id, keys, cfg.verifying)
        outputs = {REPORT_PATH: out.write_bytes(REPORT_PATH, page.encode("utf-8")),
                   RECORD_PATH: out.write_json(RECORD_PATH, record)}
        return outputs, record

    return run_unit(out, RECORD_PATH, fp, compute)


def calibrated(cfg: NearDedupConfig, record: dict[str, Any]) -> NearDedupConfig:
    """``cfg`` with the record's thresholds (unchanged when the calibration could not fit)."""
    t = record["thresholds"]
    if not t.get("fitted"):
        return cfg
    verification = cfg.verification.model_copy(update={"review_min_similarity": t["review_min_similarity"]})
    return cfg.model_copy(update={k: t[k] for k in ("edge_min_similarity", "component_link_above",
                                                     "pair_removal_above")} | {"verification": verification})


def forget_self_calibration(out: Store) -> None:
    """Remove the record, the report and their marker (``calibrate: off``)."""
    remove_tree(out, FOLDER)
