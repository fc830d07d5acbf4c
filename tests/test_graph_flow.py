"""near_dedup_flow: a new corpus version on a 2-process Dask cluster equals the in-process stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpusforge.cluster import DaskConfig
from corpusforge.storage import Store
from flows.near_dedup import NearDedupFlowParams, near_dedup_flow
from tasks.graph.config import CalibrationConfig, CollisionConfig, IndexConfig, NearDedupAdvanced, NearDedupConfig
from tasks.graph.stage import near_duplicate_stage
from tests.graph_corpus import write_corpus

pytestmark = pytest.mark.timeout(300)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_flow_on_two_dask_workers_writes_new_version_equal_to_in_process(tmp_path, prefect_server):
    src, shards, _ = write_corpus(str(tmp_path / "v1"), n_shards=4, per_shard=30, dim=24, seed=9)
    before = tree(tmp_path / "v1")
    cfg = NearDedupConfig(index=IndexConfig(kind="flat", k=40), advanced=NearDedupAdvanced(merge_max_edges=40),
                          collision=CollisionConfig(fractions=[0.5, 1.0]),
                          calibration=CalibrationConfig(pairs_per_bin=2))
    config = NearDedupFlowParams(source=str(tmp_path / "v1"), out=str(tmp_path / "v2"), near_dedup=cfg,
                                 dask=DaskConfig(n_workers=2, threads_per_worker=1, processes=True))
    summary = near_dedup_flow(config)
    assert tree(tmp_path / "v1") == before  # the old version is untouched
    assert summary["graph"]["merge_tasks"] > 1
    local = Store(str(tmp_path / "local"))
    near_duplicate_stage(local, cfg, list(reversed(shards)), source=src)
    assert tree(tmp_path / "v2" / "graph") == tree(tmp_path / "local" / "graph")
    lineage = Store(str(tmp_path / "v2")).read_json("lineage.json")
    assert lineage["derived_from"] == str(tmp_path / "v1") and lineage["staging_shards"] == sorted(shards)


@pytest.mark.parametrize("out", ["v1", "v1/next", "."])
def test_flow_refuses_to_write_into_the_source(tmp_path, out, prefect_server):
    write_corpus(str(tmp_path / "v1"), n_shards=1, per_shard=5, dim=8)
    config = NearDedupFlowParams(source=str(tmp_path / "v1"), out=str(tmp_path / out),
                                 dask=DaskConfig(processes=False, n_workers=1))
    with pytest.raises(ValueError, match="overlaps the source"):
        near_dedup_flow(config)
    assert not (tmp_path / "v1" / "graph").exists()


def test_config_loads_from_yaml_and_rejects_unknown_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("source: a\nout: b\nnear_dedup:\n  pair_removal_above: 0.97\n  index: {kind: ivf, nprobe: 32}\n")
    config = NearDedupFlowParams.from_yaml(path)
    assert config.near_dedup.pair_removal_above == 0.97 and config.near_dedup.index.nprobe == 32
    path.write_text("source: a\nout: b\nnear_dedup:\n  pair_treshold: 0.97\n")
    with pytest.raises(ValueError, match="pair_treshold"):
        NearDedupFlowParams.from_yaml(path)
    with pytest.raises(ValueError, match="pair_removal_above must exceed"):
        NearDedupConfig(pair_removal_above=0.9)


def test_pass_over_a_corpus_missing_features_refuses_naming_the_shards(tmp_path, prefect_server):
    """Every staged record must be covered: shards without features are named, nothing is written."""
    from corpusforge.layout import feature_keys, feature_vectors

    _, shards, _ = write_corpus(str(tmp_path / "v1"), n_shards=3, per_shard=5, dim=8)
    for path in (feature_vectors("wfd", shards[1]), feature_keys("wfd", shards[1])):
        (tmp_path / "v1" / path).unlink()
    (tmp_path / "v1" / "_markers" / f"{feature_vectors('wfd', shards[1])}.json").unlink()
    config = NearDedupFlowParams(source=str(tmp_path / "v1"), out=str(tmp_path / "v2"),
                                 near_dedup=NearDedupConfig(model_id="wfd"),
                                 dask=DaskConfig(processes=False, n_workers=1))
    with pytest.raises(ValueError, match=f"no wfd features.*{shards[1]}"):
        near_dedup_flow(config)
    assert not (tmp_path / "v2" / "graph").exists()


def test_missing_decisions_are_an_error_never_no_decisions(tmp_path):
    from tasks.graph.stage import read_decisions

    src, shards, _ = write_corpus(str(tmp_path / "v1"), n_shards=2, per_shard=5, dim=8)
    with pytest.raises(FileNotFoundError, match="never completed"):
        read_decisions(src, shards)
    cfg = NearDedupConfig(collision=CollisionConfig(enabled=False), calibration=CalibrationConfig(enabled=False))
    near_duplicate_stage(src, cfg, shards[:1])
    with pytest.raises(FileNotFoundError, match=f"missing for staging shards \\['{shards[1]}'\\]"):
        read_decisions(src, shards)
