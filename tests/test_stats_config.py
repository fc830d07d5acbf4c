"""Flow configs: YAML loading, unknown keys rejected, protocol defaults; GPIC release references."""

from __future__ import annotations

import io

import numpy as np
import pytest
from pydantic import ValidationError

from flows.evaluate import EvaluateConfig
from flows.reference_stats import ReferenceStatsFlowParams
from tasks.stats.config import MetricsConfig
from tasks.stats.evaluate import ChunkFeatures, ProtocolMismatch, evaluate_features, load_reference


def test_reference_config_from_yaml_with_protocol_defaults(tmp_path):
    path = tmp_path / "ref.yaml"
    path.write_text("corpus: /data/out\noracle: true\nsample: {max_rows: 2000}\n")
    cfg = ReferenceStatsFlowParams.from_yaml(path)
    assert cfg.model.model_id == "dinov2_vitl14_gpic_eval" and cfg.feature_dtype == "float32"
    assert cfg.groups() == ("test", "val", "train_nano", "train_lite", "train_full", "test_subset")
    assert cfg.sample.max_rows == 2000 and cfg.sample.seed == 0
    assert ReferenceStatsFlowParams.from_yaml(path, corpus="s3://b/c").corpus == "s3://b/c"
    for bad in ("corpus: x\nsplit: [test]\n", "corpus: x\noracle: true\nsplits: [val]\n",
                "corpus: x\nmetrics: {kk: 5}\n"):
        path.write_text(bad)
        with pytest.raises(ValidationError):
            ReferenceStatsFlowParams.from_yaml(path)


def test_evaluate_config_from_yaml(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("generated: [s3://bucket/samples]\nreference: stats/test-dinov2_vitl14_gpic_eval.npz\n"
                    "out: results\nmetrics: {fd_method: eigh}\n")
    cfg = EvaluateConfig.from_yaml(path)
    assert cfg.metrics.fd_method == "eigh" and not cfg.allow_mismatch
    assert cfg.metrics.deviations() and not MetricsConfig().deviations()
    path.write_text("generated: [x]\nreference: r.npz\nout: o\nallow_mismatches: true\n")
    with pytest.raises(ValidationError):
        EvaluateConfig.from_yaml(path)
    for field in EvaluateConfig.model_fields.values():
        assert field.title, "every field is titled for the deployment form"


def _release_file(tmp_path, rng, d=8, with_rows=True):
    arrays = {"dino_mu": rng.standard_normal(d), "dino_sigma": np.cov(rng.standard_normal((50, d)), rowvar=False)}
    if with_rows:
        arrays["dino_embeddings"] = rng.standard_normal((40, d)).astype(np.float32)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path = tmp_path / "test_stats.npz"
    path.write_bytes(buf.getvalue())
    return str(path), arrays


def test_gpic_release_file_is_a_reference_without_provenance(tmp_path):
    rng = np.random.default_rng(0)
    path, arrays = _release_file(tmp_path, rng)
    ref = load_reference(path)
    assert ref.provenance is None and ref.n == 40
    np.testing.assert_array_equal(ref.mu, arrays["dino_mu"])
    identity = {"model_id": "dinov2_vitl14_gpic_eval", "arch": "vit_large_patch14_dinov2",
                "preprocessing": "gpic_eval", "weights": "ab" * 32, "random_init": False, "normalized": False}
    chunk = ChunkFeatures([f"g{i}" for i in range(30)], rng.standard_normal((30, 8)).astype(np.float32),
                          {"bad.png": "decode: broken"}, identity)
    cfg = MetricsConfig(k=3, mmd_subsets=2, mmd_subset_size=10)
    result = evaluate_features([chunk], ref, cfg)
    devs = result["protocol"]["deviations"]
    assert any("no provenance" in d for d in devs) and any("only 30 generated" in d for d in devs)
    assert result["generated"]["errors_by_reason"] == {"decode": 1}
    assert {"fd", "precision", "mmd2"} <= set(result["metrics"])
    with pytest.raises(ProtocolMismatch, match="dimensions"):
        evaluate_features([ChunkFeatures(["a", "b"], np.zeros((2, 5), np.float32), {}, identity)], ref, cfg)
    other = {**identity, "preprocessing": "dinov2_eval"}
    with pytest.raises(ProtocolMismatch, match="different models"):
        evaluate_features([chunk, ChunkFeatures(["x"], np.zeros((1, 8), np.float32), {}, other)], ref, cfg)


def test_reference_without_rows_gives_fd_only(tmp_path):
    rng = np.random.default_rng(1)
    path, _ = _release_file(tmp_path, rng, with_rows=False)
    chunk = ChunkFeatures([f"g{i}" for i in range(20)], rng.standard_normal((20, 8)).astype(np.float32), {},
                          {"model_id": "dinov2_vitl14_gpic_eval", "arch": "vit_large_patch14_dinov2",
                           "preprocessing": "gpic_eval"})
    result = evaluate_features([chunk], load_reference(path), MetricsConfig())
    assert "precision" not in result["metrics"] and result["metrics"]["notes"]


def test_the_flow_holds_chunk_names_and_each_task_reads_its_chunk_from_the_listing(tmp_path):
    """Evaluate's listing task writes the files to the output folder; an embedding task reads
    back exactly the chunk cut_generated cut, and what the flow gets is a few bytes a chunk."""
    import pickle

    from corpusforge.storage import Store
    from tasks.stats.evaluate import listed_chunk_names, cut_generated, read_listed_chunk, write_generated_listing

    gen = tmp_path / "gen"
    for i in range(2_500):
        folder = gen / f"m{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.png").write_bytes(b"x" * (i % 7))
    (gen / "a.tar").write_bytes(b"")
    out = Store(str(tmp_path / "out"))
    expected = list(cut_generated([str(gen)], {}, chunk_size=1_000))
    listed = write_generated_listing(out, [str(gen) + "/"], {}, chunk_size=1_000)
    assert [c.kind for c in expected] == ["files"] * 3 + ["tar"]
    assert [(c.name, c.files) for c in listed] == [(c.name, len(c.uris)) for c in expected]
    assert [read_listed_chunk(out, c.index, [str(gen)]) for c in listed] == expected
    assert listed_chunk_names(out) == [c.name for c in expected]
    assert len(pickle.dumps(listed)) < 100 * len(listed) < len(pickle.dumps(expected)) / 100
    with pytest.raises(FileNotFoundError, match="no chunk 4"):
        read_listed_chunk(out, 4, [str(gen)])
