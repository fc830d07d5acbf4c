"""The fetch stage's units are cut by host (issue 33: "one unit owns a host's politeness"): a
host whose URLs are spread over every input partition is requested by one host unit, a big
host is cut into units of ``fetch.unit_urls``, small hosts are packed; each partition's ledger
is assembled from the units' outcomes, and a grown export requests only its new URLs."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusforge.contract import in_process
from corpusforge.storage import Store
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.hostunits import host_assignment, input_cut_sha256, plan_host_units, plan_host_units_call
from tasks.ingest.fetch.stage import fetch_stage
from tasks.ingest.files import FETCH_PLAN, fetch_ledger_path, fetch_unit_path
from tasks.ingest.licenses import LicenseConfig
from tasks.ingest.sources import SourceConfig, cut_partitions
from tests.http_hosts import write_images

UA = "corpusforge/1.0 (+https://example.org/bot; bot@example.org)"
BIG, WIKI, SMALL = "127.0.0.60", "127.0.0.61", "127.0.0.62"
LEDGER_FACTS = ["row", "url", "host", "outcome", "detail", "final", "http_status", "sha256", "bytes", "retrieved_at"]


def _call(fn: Any, kwargs: dict[str, Any]) -> Any:
    return fn(**kwargs)  # not submit(fn, **kwargs): a step's ``key`` would be taken as the task's


class DaskFanOut:
    """Every unit as a task on a Dask cluster's worker processes (what the flow's task runner does)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, unit: Any, calls: list[dict[str, Any]]) -> list[Any]:
        return self.client.gather([self.client.submit(_call, unit.fn, c, pure=False) for c in calls])

    def stream(self, unit: Any, calls: list[dict[str, Any]], sink: Any) -> None:
        for i, result in enumerate(self(unit, calls)):
            sink(i, result)


def _parts(tmp: Path, out: Store, urls: list[str], licences: list[str] | None = None, size: int = 8) -> list:
    source = tmp / f"urls-{len(urls)}.parquet"
    pq.write_table(pa.table({"url": urls, "license": licences or ["CC BY 4.0"] * len(urls)}), source)
    return cut_partitions(str(source), out, SourceConfig(partition_size=size))[1]


def _urls(h: Any, images: range) -> list[str]:
    """Two of every three rows on BIG (so it is in every partition), the rest on WIKI and SMALL."""
    hosts = [BIG, WIKI, BIG, SMALL, BIG, BIG]
    return [h.url(hosts[i % len(hosts)], f"/img/img{i}.jpg") for i in images]


def _ledgers(out: Store, n: int) -> list[list[dict]]:
    return [pq.read_table(Path(out.root) / fetch_ledger_path(p), columns=LEDGER_FACTS).to_pylist() for p in range(n)]


def test_small_hosts_are_packed_and_big_hosts_cut():
    counts = [("a", 3), ("b", 25), ("c", 4), ("d", 5), (None, 1), ("e", 7)]
    assert host_assignment(counts, 10) == ([("a", 0, False), ("b", 1, True), ("c", 4, False), ("d", 4, False),
                                            ("", 4, False), ("e", 5, False)], 6)
    assert host_assignment([("a", 20)], 10) == ([("a", 0, True)], 2)


def test_plan_cuts_a_host_spread_over_every_partition_in_input_order(tmp_path):
    """Planned out of core (no request): rows the licence drops are in no unit; a host over
    ``unit_urls`` gets units of its own, in input order; the plan routes each partition."""
    out = Store(str(tmp_path / "out"), fsync=False)
    urls = [f"http://{BIG if i % 3 else WIKI}/img{i}.jpg" for i in range(24)] + ["file:///etc/passwd"]
    licences = ["All rights reserved" if i == 4 else "CC BY 4.0" for i in range(len(urls))]
    parts = _parts(tmp_path, out, urls, licences)
    assert len(parts) == 4
    result = plan_host_units(out, input_cut_sha256(out), LicenseConfig(), unit_urls=9)
    assert result["urls"] == 24 and result["hosts"] == 2  # row 4 dropped; the file: URL has no host
    units = [pq.read_table(Path(out.root) / fetch_unit_path(u)).to_pylist() for u in range(len(result["units"]))]
    big = [(r["part"], r["row"]) for u in units for r in u if r["host"] == BIG]
    assert [len(u) for u in units] == [9, 6, 9] and {r["host"] for u in units[:2] for r in u} == {BIG}
    assert big == sorted(big) and len(big) == 15  # cut in input order
    assert {r["host"] for r in units[2]} == {WIKI, None}  # packed together
    routes = pq.read_table(Path(out.root) / FETCH_PLAN).to_pylist()
    assert {(r["part"], r["unit"]) for r in routes} == {(r["part"], u) for u, rows in enumerate(units) for r in rows}


def test_the_planning_task_is_passed_the_input_cut_not_its_partitions(tmp_path):
    """The planning unit's parameters stay O(1) at any partition count (the input cut's SHA-256,
    never a Partition per input partition: ~2·10⁵ at 10⁸ URLs); its key still changes with any
    chunk's digest, and equals for the same list."""
    urls = [f"http://{BIG}/img{i}.jpg" for i in range(240)]
    calls, keys = {}, []
    for name, size in (("cut-a", 120), ("cut-b", 2)):
        out = Store(str(tmp_path / name), fsync=False)
        parts = _parts(tmp_path, out, urls, size=size)
        calls[len(parts)] = call = plan_host_units_call(out, input_cut_sha256(out), FetchConfig(), LicenseConfig())
        assert not any(isinstance(v, list) for v in call["kwargs"].values())
        assert plan_host_units(**call["kwargs"])["units"] and Path(out.root, FETCH_PLAN).exists()
        keys.append(call["key"])
    sizes = {p: len(pickle.dumps(c["kwargs"])) for p, c in calls.items()}
    assert sorted(sizes) == [2, 120] and sizes[2] == sizes[120] < 4096, sizes
    out = Store(str(tmp_path / "cut-b"), fsync=False)
    assert plan_host_units_call(out, input_cut_sha256(out), FetchConfig(), LicenseConfig())["key"] == keys[1]
    _parts(tmp_path, out, urls[:-1] + ["http://other/x.jpg"], size=2)  # one chunk's digest changed
    assert plan_host_units_call(out, input_cut_sha256(out), FetchConfig(), LicenseConfig())["key"] != keys[1]


@pytest.mark.parametrize("workers", [2])
def test_one_unit_requests_a_host_and_a_grown_export_only_its_new_urls(tmp_path, http_hosts, local_cluster,
                                                                       monkeypatch, workers):
    """BIG's URLs lie in every input partition; on a cluster of worker processes every request to it
    goes over one unit's connections (per host at most its limit: 2 client ports; with a unit per
    input partition each unit opened its own). A rerun over the grown export requests only the new
    URLs, and its ledgers equal a fresh build's."""
    from distributed import Client

    monkeypatch.setenv("CORPUSFORGE_FETCH_CLOCK", "2026-01-02T03:04:05Z")  # the workers inherit it
    write_images(tmp_path / "images", 40)
    cfg = FetchConfig(user_agent=UA, allow_private_networks=True, threads=8, retries=0)
    hosts = {BIG: {"robots": "allow"}, WIKI: {"robots": "allow"}, SMALL: {"robots": "404"}}
    with http_hosts(tmp_path, hosts, tmp_path / "images", latency_ms=10) as h, \
            local_cluster(n_workers=workers, threads_per_worker=2) as cluster, Client(cluster) as client:
        fan_out = DaskFanOut(client)
        out = Store(str(tmp_path / "out"), fsync=False)
        parts = _parts(tmp_path, out, _urls(h, range(24)))
        assert len(parts) == 3
        work, section = fetch_stage(out, parts, cfg, LicenseConfig(), fan_out)
        seen = h.seen()
        assert work["host_units"]["computed"] == 1 and section["fetched"] == 24
        assert len([p for p, _ in seen["requests"][BIG] if p.startswith("/img/")]) == 16
        assert len(seen["ports"][BIG]) <= cfg.connections(BIG), seen["ports"]
        assert all(r["outcome"] == "fetched" for ledger in _ledgers(out, 3) for r in ledger)

        h.reset()  # a rerun of the same list: nothing requested, no unit computed
        work, _ = fetch_stage(out, parts, cfg, LicenseConfig(), fan_out)
        assert not h.seen()["requests"] and work["host_units"]["computed"] == work["ledgers"]["computed"] == 0

        h.reset()  # the export grew by a partition
        grown = _parts(tmp_path, out, _urls(h, range(32)))
        work, _ = fetch_stage(out, grown, cfg, LicenseConfig(), fan_out)
        asked = sorted(p for reqs in h.seen()["requests"].values() for p, _ in reqs if p.startswith("/img/"))
        assert asked == sorted(f"/img/img{i}.jpg" for i in range(24, 32))
        assert work["ledgers"]["computed"] == 1  # the new partition's: the others are current

        fresh = Store(str(tmp_path / "fresh"), fsync=False)
        fetch_stage(fresh, _parts(tmp_path, fresh, _urls(h, range(32))), cfg, LicenseConfig(), fan_out)
    assert _ledgers(out, 4) == _ledgers(fresh, 4)


def test_in_process_stage_matches_its_units(tmp_path, http_hosts):
    """The stage needs no cluster: in process, a unit per host group and a ledger per partition."""
    write_images(tmp_path / "images", 8)
    cfg = FetchConfig(user_agent=UA, allow_private_networks=True, threads=4, retries=0, unit_urls=3)
    with http_hosts(tmp_path, {BIG: {"robots": "404"}, WIKI: {"robots": "404"}}, tmp_path / "images") as h:
        out = Store(str(tmp_path / "out"), fsync=False)
        parts = _parts(tmp_path, out, [h.url(BIG if i % 2 else WIKI, f"/img/img{i}.jpg") for i in range(8)]
                       + ["", "file:///x"])
        work, section = fetch_stage(out, parts, cfg, LicenseConfig(), in_process)
    assert work["host_units"]["computed"] == 5 and section["fetched"] == 8
    outcomes = [r["outcome"] for ledger in _ledgers(out, 2) for r in ledger]
    assert outcomes == ["fetched"] * 8 + ["error/missing_url", "error/blocked_address"]
