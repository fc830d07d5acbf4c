"""Collision models (GPIC Fig. 6): power-law fit, subset counts against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from tasks.graph.collision import fit_power_law, removals
from tasks.graph.config import CalibrationConfig, CollisionConfig, IndexConfig, NearDedupConfig
from tasks.graph.stage import near_duplicate_stage
from tests.graph_corpus import write_corpus

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("a,beta", [(0.002, 1.3), (5.0, 0.8), (1e-4, 2.0)])
def test_power_law_fit_recovers_parameters_from_noisy_data(a, beta):
    rng = np.random.default_rng(0)
    n = np.geomspace(1e5, 3.4e6, 6)
    d = a * n**beta * np.exp(rng.normal(0, 0.03, len(n)))
    fit = fit_power_law(n, d)
    assert fit["fitted"] and fit["points"] == 6
    assert fit["beta"] == pytest.approx(beta, abs=0.05)
    assert fit["A"] == pytest.approx(a, rel=0.6)
    assert a * 1.1e8**beta == pytest.approx(fit["A"] * 1.1e8 ** fit["beta"], rel=0.15)
    assert 0.98 < fit["r2"] <= 1.0
    exact = fit_power_law(n, a * n**beta)
    assert exact["beta"] == pytest.approx(beta, abs=1e-9) and exact["r2"] == pytest.approx(1.0)


def test_power_law_fit_without_enough_positive_counts():
    assert fit_power_law(np.array([10, 20, 40]), np.array([0, 0, 0]))["fitted"] is False
    one = fit_power_law(np.array([10, 20, 40]), np.array([0, 0, 3]))
    assert one["fitted"] is False and one["points"] == 1
    flat = fit_power_law(np.array([10, 20, 40]), np.array([0, 2, 2]))
    assert flat["fitted"] and flat["beta"] == pytest.approx(0.0, abs=1e-12) and flat["r2"] is None


def test_removals_is_nodes_minus_components():
    a = np.array([0, 1, 3, 5], dtype=np.int64)
    b = np.array([1, 2, 4, 5], dtype=np.int64)
    assert removals(7, a, b) == 3  # {0,1,2} loses 2, {3,4} loses 1, self-pair and singletons nothing


def test_collision_table_equals_plain_count_on_nested_subsets(tmp_path):
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=60, dim=24, seed=11)
    cfg = NearDedupConfig(index=IndexConfig(kind="flat"), calibration=CalibrationConfig(enabled=False),
                          collision=CollisionConfig(fractions=[0.2, 0.4, 0.7, 1.0],
                                                    thresholds=[0.75, 0.85, 0.95, 0.999], target_size=10**6))
    near_duplicate_stage(store, cfg, shards)
    table = store.read_parquet("graph/collision/table.parquet").to_pylist()
    result = store.read_json("graph/collision/table.json")
    from corpusforge.hashing import stable_uniform

    keys = sorted(by_key)
    u = {k: stable_uniform(0, f"subset:{k}") for k in keys}
    x = np.asarray([by_key[k] for k in keys], dtype=np.float16).astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sims = x @ x.T
    subsets = [{i for i, k in enumerate(keys) if u[k] < f} for f in sorted({r["fraction"] for r in table})]
    assert all(small < big for small, big in zip(subsets, subsets[1:], strict=False))  # nested
    for row in table:
        member = [i for i, k in enumerate(keys) if u[k] < row["fraction"]]
        sub = sims[np.ix_(member, member)] > row["threshold"]
        n_comp, _ = connected_components(sp.csr_matrix(sub), directed=False)
        assert row["subset_size"] == len(member)
        assert row["removed"] == len(member) - n_comp, row
    fits = result["fits"]
    assert set(fits) == {"0.75", "0.85", "0.95", "0.999"}
    assert fits["0.999"]["fitted"] is False and fits["0.999"]["predicted_target"] is None
    assert fits["0.75"]["fitted"] and fits["0.75"]["predicted_full"] > 0
    assert result["full_size"] == 180
    png = (tmp_path / "graph" / "collision" / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
