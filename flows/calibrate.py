"""``corpusforge calibrate``: near-duplicate thresholds fitted to a corpus's own pictures, with the evidence.

Reads a seeded sample of pictures from ``source``, either a built corpus (its staging
shards: the sample the build's ``near_dedup.calibrate: auto`` would draw) or a folder of
images (local or ``s3://``), plants the standard copies on them, embeds everything with the
configured model and chooses the thresholds at zero false links among the sample's
unrelated pairs plus a margin (:mod:`tasks.graph.self_calibration`). Writes into ``out``:

- ``calibration.json``: the record (model, seed, sample and its digest, closest unrelated
  pair, recall per transform, chosen thresholds);
- ``near_dedup.yaml``: the chosen thresholds as a build config's ``near_dedup`` section;
- ``index.html``: the report, with contact sheets (:mod:`tasks.graph.calibration_report`).

A small job (a few hundred pictures), so it runs in this process; the model is loaded as the
feature stage loads it. Same source, config and code: the same bytes.
"""

from __future__ import annotations

import posixpath
from typing import Any

import yaml
from pydantic import Field

from corpusforge.config import StrictModel
from corpusforge.contract import completed_units
from corpusforge.hashing import canonical_json, sha256_bytes
from corpusforge.layout import STAGING_TARS
from corpusforge.storage import Store
from tasks.graph.calibration_report import report_page
from tasks.graph.config import NearDedupConfig
from tasks.graph.nodes import number_nodes
from tasks.graph.self_calibration import PER_TRANSFORM, SAMPLE, calibrate_sample, chosen_thresholds, reduced
from tasks.graph.self_calibration_unit import model_spec, read_pictures, sample_nodes
from tasks.shared.features.config import FeaturesConfig
from tasks.shared.features.decode import DecodeError, decode_rgb
from tasks.shared.inputs import list_folder

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
RECORD, THRESHOLDS, REPORT = "calibration.json", "near_dedup.yaml", "index.html"


class CalibrateConfig(StrictModel):
    """What to calibrate on, where the record goes, and the model (the build config's sections)."""

    source: str = Field(..., title="Pictures", description="A built corpus root or a folder of images; local or s3://.")
    out: str = Field(..., title="Report folder", description="calibration.json, near_dedup.yaml, index.html.")
    storage_options: dict[str, Any] = Field(default_factory=dict, title="Storage options",
                                            description="fsspec options for source and out.")
    near_dedup: NearDedupConfig = Field(default_factory=NearDedupConfig, title="Near-duplicate settings",
                                        description="model_id, seed, and the thresholds calibration starts from.")
    features: FeaturesConfig = Field(default_factory=FeaturesConfig, title="Feature models",
                                     description="The spec (weights) of near_dedup.model_id.")


def corpus_pictures(source: Store, seed: int) -> tuple[list[str], list[str], list[Any]] | None:
    """The build's sample of a built corpus, or None when ``source`` has no staging shards."""
    shards = completed_units(source, STAGING_TARS, ".tar")
    if not shards:
        return None
    nodes = number_nodes(source, shards)
    return read_pictures(source, nodes, sample_nodes(nodes, seed, SAMPLE))


def folder_pictures(uri: str, options: dict[str, Any], seed: int) -> tuple[list[str], list[str], list[Any]]:
    """A seeded sample of a folder's images (ranked by a hash of seed and path: stable as it grows)."""
    names = [p for p, _ in list_folder(uri, options) if posixpath.splitext(p)[1].lower() in IMAGE_SUFFIXES]
    chosen = sorted(sorted(names, key=lambda p: sha256_bytes(f"{seed}:{p}".encode()))[:SAMPLE])
    store = Store(uri, options)
    keys, shas, pictures = [], [], []
    for name in chosen:
        data = store.read_bytes(name)
        try:
            pictures.append(reduced(decode_rgb(data, 1024)))
        except DecodeError:
            continue
        keys.append(name)
        shas.append(sha256_bytes(data))
    return keys, shas, pictures


def run_calibrate(config: CalibrateConfig) -> dict[str, Any]:
    """Calibrate (module docstring); the record. ValueError for what the user must change."""
    from tasks.shared.features.registry import load_model

    cfg = config.near_dedup
    spec = model_spec(cfg, config.features)
    source = Store(config.source, config.storage_options)
    found = corpus_pictures(source, cfg.seed)
    keys, shas, pictures = found if found is not None else folder_pictures(config.source, config.storage_options,
                                                                           cfg.seed)
    model = load_model(spec, config.features.runtime, config.features.torchscript_allowlist)
    cal, measured = calibrate_sample(pictures, model, seed=cfg.seed, duplicate_above=cfg.pair_removal_above)
    chosen = chosen_thresholds(cal, verifying=cfg.verifying, edge=cfg.edge_min_similarity,
                               review=cfg.verification.review_min_similarity)
    record = {"model_id": cfg.model_id, "source": "built corpus" if found is not None else "folder of images",
              "seed": cfg.seed, "margin": cal.margin,
              "sample": {"pictures": len(keys), "per_transform": PER_TRANSFORM,
                         "sha256": sha256_bytes(canonical_json(shas).encode())},
              "closest_unrelated": cal.closest_unrelated, "link_above": cal.link_above,
              "merged_originals": cal.merged_originals, "recall": cal.recall, "digest": cal.digest(),
              "thresholds": chosen}
    out = Store(config.out, config.storage_options)
    out.write_bytes(REPORT, report_page(cal, measured, chosen, cfg.model_id, keys, cfg.verifying).encode("utf-8"))
    out.write_json(RECORD, record)
    if chosen["fitted"]:
        section = {"near_dedup": {"model_id": cfg.model_id, **{k: chosen[k] for k in (
            "edge_min_similarity", "component_link_above", "pair_removal_above")},
            "verification": {"review_min_similarity": chosen["review_min_similarity"]}}}
        out.write_bytes(THRESHOLDS, yaml.safe_dump(section, sort_keys=False).encode("utf-8"))
    else:
        out.remove(THRESHOLDS)
    return record
