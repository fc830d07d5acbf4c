"""Collision models (GPIC Fig. 6): power-law fit, subset counts against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from corpusforge.hashing import stable_uniform
from corpusforge.layout import staging_records
from tasks.graph import collision
from tasks.graph.collision import fit_power_law, predict, removals
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
    flat = fit_power_law(np.array([10, 100, 1000]), np.array([2, 2, 2]))
    assert flat["fitted"] and flat["beta"] == pytest.approx(0.0, abs=1e-12) and flat["r2"] is None


def test_two_subset_sizes_never_make_a_fit():
    """The demo's old case: two points fit exactly (R² = 1) and extrapolated to 10^15."""
    two = fit_power_law(np.array([300, 600, 1200]), np.array([0, 3, 40]))
    assert two["fitted"] is False and two["points"] == 2
    assert "2 subset size(s) with removals; a fit needs 3" in two["reason"]


def test_a_fit_must_span_a_decade_of_subset_size():
    narrow = fit_power_law(np.array([100, 200, 400, 800]), np.array([1, 3, 9, 30]))
    assert narrow["fitted"] is False and "span 0.90 decade(s) (100 to 800 images)" in narrow["reason"]
    wide = fit_power_law(np.array([100, 200, 400, 1000]), np.array([1, 3, 9, 30]))
    assert wide["fitted"] and wide["fit_sizes"] == [100, 1000]
    assert fit_power_law(np.array([100, 200, 400, 800]), np.array([1, 3, 9, 30]), min_decades=0.9)["fitted"]


def test_predictions_stay_within_the_fit_and_the_images():
    n = np.geomspace(1e3, 3e4, 5)
    fit = fit_power_law(n, 1e-3 * n**1.2)
    assert predict(fit, 10**6, 100.0)[0] == pytest.approx(1e-3 * 1e6**1.2)  # 33x beyond: given
    value, why = predict(fit, 10**7, 100.0)  # 333x the largest subset
    assert value is None and "333x the largest fitted subset (30000)" in why and "at most 100x" in why
    steep = fit_power_law(n, 1e-6 * n**2.5)  # fast growth: soon more removals than images
    value, why = predict(steep, 10**6, 100.0)
    assert value is None and "more than the 1000000 images" in why
    refused = "no fit: 2 subset size(s) with removals; a fit needs 3"
    assert predict(fit_power_law(n[:2], n[:2]), 10**4, 100.0) == (None, refused)


def test_removals_is_nodes_minus_components():
    a = np.array([0, 1, 3, 5], dtype=np.int64)
    b = np.array([1, 2, 4, 5], dtype=np.int64)
    assert removals(7, a, b) == 3  # {0,1,2} loses 2, {3,4} loses 1, self-pair and singletons nothing


def _plain_counts(table: list[dict], by_key: dict[str, np.ndarray]
                  ) -> tuple[list[str], dict[str, float], np.ndarray]:
    """Check every row of the table against a plain count (float64 similarities, scipy's
    components) on its subset, picked by key hash; return the keys, hashes and similarities."""
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
    return keys, u, sims


def test_collision_table_equals_plain_count_on_nested_subsets(tmp_path):
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=60, dim=24, seed=11)
    cfg = NearDedupConfig(index=IndexConfig(kind="flat"), calibration=CalibrationConfig(enabled=False),
                          collision=CollisionConfig(fractions=[0.05, 0.1, 0.2, 0.5], min_fit_decades=0.75,
                                                    thresholds=[0.75, 0.85, 0.95, 0.999], target_size=10**6))
    near_duplicate_stage(store, cfg, shards)
    table = store.read_parquet("graph/collision/table.parquet").to_pylist()
    result = store.read_json("graph/collision/table.json")
    keys, u, sims = _plain_counts(table, by_key)
    fits = result["fits"]
    assert set(fits) == {"0.75", "0.85", "0.95", "0.999"}
    assert fits["0.999"]["fitted"] is False and fits["0.999"]["predicted_target"] is None
    assert fits["0.999"]["predicted_target_note"].startswith("no fit: ")
    assert result["full_size"] == 180 and result["counted_whole"]
    for theta, fit in fits.items():  # the whole corpus counted beside the fit (held out: largest fraction 0.5)
        n_comp, _ = connected_components(sp.csr_matrix(sims > float(theta)), directed=False)
        assert fit["actual_full"] == 180 - n_comp
        for key in ("predicted_full", "predicted_target"):
            assert fit[key] is None or fit[key] <= (180 if key == "predicted_full" else 10**6) - 1
            assert (fit[key] is None) == (fit[key + "_note"] is not None)
    fitted = [f for f in fits.values() if f["fitted"]]  # 180 images: subsets of 14, 35, 86 have removals
    assert len(fitted) == 3 and all(f["points"] >= 3 and f["fit_sizes"] == [14, 86] for f in fitted)
    assert fits["0.95"]["predicted_full"] is not None  # 180 is 2x the largest fitted subset
    assert "would remove more than the 180 images" in fits["0.75"]["predicted_full_note"]  # beta ~ 1.8
    assert "x the largest fitted subset (86)" in fits["0.75"]["predicted_target_note"]
    from tasks.report.receipt import _collision_lines

    text = "\n".join(_collision_lines(store.read_json("graph/summary.json")["collision"]))
    assert "removed at full size" in text and "counted whole" in text
    assert "not given (1)" in text and "(3) no fit: 0 subset size(s) with removals" in text
    assert "e+" not in text  # no astronomical number anywhere
    png = (tmp_path / "graph" / "collision" / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_past_the_cap_only_the_capped_sample_is_searched(tmp_path, monkeypatch):
    """Past ``max_subset_vectors`` the task is O(N): one pass picks the sample by key hash,
    and the search, its pairs and the counts see only that sample (here 40 of 180 vectors
    and pairs rescored 7 at a time, so batches split the pairs)."""
    monkeypatch.setattr(collision, "SCORE_BATCH", 7)
    store, shards, by_key = write_corpus(str(tmp_path), n_shards=3, per_shard=60, dim=24, seed=11)
    cfg = NearDedupConfig(index=IndexConfig(kind="flat"), calibration=CalibrationConfig(enabled=False),
                          collision=CollisionConfig(fractions=[0.05, 0.1, 0.2, 0.5], thresholds=[0.75, 0.95],
                                                    max_subset_vectors=40))
    near_duplicate_stage(store, cfg, shards)
    result = store.read_json("graph/collision/table.json")
    assert not result["counted_whole"] and result["fraction_scale"] == pytest.approx(40 / 90)
    keys, u, sims = _plain_counts(store.read_parquet("graph/collision/table.parquet").to_pylist(), by_key)
    node_keys = [k for s in sorted(shards) for k in store.read_parquet(staging_records(s))["key"].to_pylist()]
    largest = max(r["fraction"] for r in result["rows"])
    sample = {k for k in keys if u[k] < largest}
    assert 30 <= len(sample) <= 50
    pairs = store.read_parquet("graph/collision/pairs.parquet")
    ends = {node_keys[i] for i in pairs["src"].to_pylist() + pairs["dst"].to_pylist()}
    assert ends and ends <= sample, ends - sample
    inside = sims[np.ix_(*[[keys.index(k) for k in sorted(sample)]] * 2)]
    surely, maybe = (int(np.triu(inside >= 0.75 + m, 1).sum()) for m in (1e-3, -1e-3))  # float16 rounding
    assert result["pairs"] == pairs.num_rows and surely <= pairs.num_rows <= maybe
