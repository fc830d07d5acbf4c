"""bench/scale.py's projections cannot be flattered (issue 31): the bound is checked against the
larger of the log-log fit and the line through the last two sizes, a cap needs two measured
sizes past it, and a size not run is unmeasured, never passing. In-process, on measurement rows."""

from __future__ import annotations

from bench import scale


def _row(step: str, n: int, rss: float, cpu: float = 1.0, files: int = 10) -> dict:
    return {"step": step, "n": n, "wall_s": cpu, "cpu_s": cpu, "base_rss": 30 << 20, "peak_rss": rss,
            "files_opened": files, "bytes_read": 0, "params_max": 500, "tasks": 1, "regime": None}


def test_a_fit_bent_by_small_sizes_does_not_hide_linear_growth_at_the_large_ones():
    # flat to 100k, then +100 B per record: the fit stays under 2 GB at 1e8, the line reaches ~10 GB
    runs = [_row("receipt", 10_000, 40 << 20), _row("receipt", 100_000, 41 << 20),
            _row("receipt", 1_000_000, (41 << 20) + 900_000 * 100)]
    a = scale.analyse("receipt", runs, [10_000, 100_000, 1_000_000])
    rss = a["projections"][10**8]["rss"]
    assert rss.fit < scale.FLOW_BOUND < rss.line
    assert any(b.startswith("flow memory") for b in a["broken"]), a["broken"]


def test_growth_above_1_1_between_the_last_two_sizes_breaks_the_bound():
    runs = [_row("receipt", n, 40 << 20, cpu=c) for n, c in ((10_000, 1.0), (100_000, 10.0), (1_000_000, 150.0))]
    a = scale.analyse("receipt", runs, [10_000, 100_000, 1_000_000])
    assert a["b_cpu_s"][0] < scale.GROWTH_BOUND < a["b_cpu_s"][1]
    assert any(b.startswith("cpu time b=1.18") for b in a["broken"]), a["broken"]


def test_a_cap_needs_two_measured_sizes_past_it_and_the_benchmark_adds_one():
    sizes = [10_000, 100_000, 1_000_000]
    runs = [_row("exact_dedup", n, 70 << 20) for n in sizes]
    a = scale.analyse("exact_dedup", runs, sizes)
    assert any("buckets=256" in u for u in a["unmeasured"]), a["unmeasured"]
    assert a["projections"][10**8]["rss"].checked is None
    assert scale.verdict(a).startswith("UNMEASURED")
    assert scale.sizes_for("exact_dedup", sizes) == [10_000, 100_000, 600_000, 1_000_000]
    runs.insert(2, _row("exact_dedup", 600_000, 70 << 20))
    a = scale.analyse("exact_dedup", runs, sizes)
    assert a["unmeasured"] == [] and a["projections"][10**8]["rss"].checked is not None


def test_a_size_not_run_is_unmeasured_and_fails_a_bounded_step(capsys):
    runs = [_row("receipt", n, 40 << 20) for n in (10_000, 100_000)]
    failures = scale.report({"receipt": runs}, [10_000, 100_000, 1_000_000])
    assert any("not run at N=1M" in f for f in failures), failures
    assert "UNMEASURED" in capsys.readouterr().out
