"""Host units of the fetch stage against real loopback servers, one rule each: the circuit breaker, a bandwidth
limit, https with SNI and a verified name, a name resolving to a private address, and, on a
2-worker Dask cluster, the host's pauses, breaker and minimum interval held across workers.
Every 127.0.0.x host here is used by this file alone (the in-process host ledger outlives a
test)."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.ingest.files import FETCH_UNIT_SCHEMA, fetch_outcomes_path, fetch_unit_path
from corpusforge.storage import Store
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.unit import fetch_host_unit, host_of
from tests.http_hosts import tls_host, write_images

UA = "corpusforge/1.0 (+https://example.org/bot; bot@example.org)"


def _units(tmp: Path, units: list[list[str]]) -> tuple[Store, list[tuple[int, str]]]:
    """One host unit per list of URLs, as the planner writes them (its rows numbered in list
    order); (unit, its file's SHA-256) each."""
    store = Store(str(tmp / "out"), fsync=False)
    made = []
    for u, urls in enumerate(units):
        rows = [{"part": u, "row": i, "url": url, "sha1": None, "host": host_of({"url": url})}
                for i, url in enumerate(urls)]
        made.append((u, store.write_parquet(fetch_unit_path(u), pa.Table.from_pylist(rows, schema=FETCH_UNIT_SCHEMA))))
    return store, made


def _ledger(store: Store, unit: int) -> list[dict]:
    """The unit's outcomes, in its list's order."""
    return pq.read_table(Path(store.root) / fetch_outcomes_path(unit)).to_pylist()


def _config(**fetch) -> FetchConfig:
    return FetchConfig(**{"user_agent": UA, "allow_private_networks": True, "retries": 0, "backoff_s": 0.0,
                          "deadline_s": 5.0, **fetch})


def test_breaker_defers_a_failing_hosts_urls(tmp_path, http_hosts):
    host = "127.0.0.40"
    write_images(tmp_path / "images", 1)
    with http_hosts(tmp_path, {host: {"robots": "404"}}, tmp_path / "images") as h:
        store, [part] = _units(tmp_path, [[h.url(host, f"/503always/x{i}.jpg") for i in range(8)]])
        result = fetch_host_unit(store, *part, _config(breaker_failures=3, threads=1))
        asked = [p for p, _ in h.seen()["requests"][host] if p.startswith("/503always/")]
    rows = _ledger(store, part[0])
    assert [r["outcome"] for r in rows] == ["error/fetch_failed"] * 3 + ["error/fetch_deferred"] * 5
    assert all(r["detail"] == f"circuit open: 3 consecutive failed attempts at {host}" for r in rows[3:])
    assert len(asked) == 3 and all(r["requests"] == 0 for r in rows[3:])
    assert result.info["pending"] == 8  # failed and deferred URLs are tried again by the next run


def test_bandwidth_limit_per_host(tmp_path, http_hosts):
    host, rate = "127.0.0.41", 150_000
    files = write_images(tmp_path / "images", 8)
    with http_hosts(tmp_path, {host: {"robots": "404"}}, tmp_path / "images") as h:
        store, [part] = _units(tmp_path, [[h.url(host, f"/img/img{i}.jpg") for i in range(8)]])
        fetch_host_unit(store, *part, _config(bytes_per_s_per_host=rate, threads=4))
        starts = sorted(t for p, t in h.seen()["requests"][host] if p.startswith("/img/"))
    rows = _ledger(store, part[0])
    assert [r["outcome"] for r in rows] == ["fetched"] * 8
    sizes = sorted(len(files[f"img{i}.jpg"]) for i in range(8))
    # a body arrives at full speed, then the host waits until it is paid for: all but the bodies
    # that may be in flight together (2 connections) and the last one are paid before the last start
    unpaid = sum(sizes[-3:])
    assert starts[-1] - starts[0] >= (sum(sizes) - unpaid) / rate * 0.95, (starts, sizes)
    assert sum(r["wait_seconds"] for r in rows) > 0


def test_https_with_sni_and_a_verified_name(tmp_path):
    write_images(tmp_path / "images", 2)
    with tls_host(tmp_path, "images.test", tmp_path / "images") as tls:
        urls = [f"https://images.test:{tls.port}/img/img0.jpg", f"https://other.test:{tls.port}/img/img1.jpg"]
        store, [part] = _units(tmp_path, [urls])
        cfg = _config(resolve={"images.test": "127.0.0.1", "other.test": "127.0.0.1"}, ca_bundle=str(tls.cert),
                      threads=1)
        fetch_host_unit(store, *part, cfg)
        seen = list(tls.seen)
    good, other = _ledger(store, part[0])
    assert good["outcome"] == "fetched" and good["http_status"] == 200
    # the name is sent as SNI and Host, and the certificate is checked against it: other.test,
    # on the same address (whose pooled connection was verified for images.test), is refused
    assert ("images.test", f"images.test:{tls.port}", "/img/img0.jpg") in seen
    assert all(sni == "images.test" and host.startswith("images.test:") for sni, host, _ in seen), seen
    assert other["outcome"] == "filtered/robots_disallowed" and other["requests"] == 0
    assert "CERTIFICATE_VERIFY_FAILED" in other["detail"], other["detail"]


@pytest.mark.parametrize("allow", [False, True])
def test_a_name_resolving_to_a_private_address(tmp_path, allow):
    write_images(tmp_path / "images", 1)
    with tls_host(tmp_path, "intranet.test", tmp_path / "images") as tls:
        url = f"https://intranet.test:{tls.port}/img/img0.jpg"
        store, [part] = _units(tmp_path, [[url, url.replace("intranet", "cgnat")]])
        cfg = _config(resolve={"intranet.test": "127.0.0.1", "cgnat.test": "100.64.0.9"}, ca_bundle=str(tls.cert),
                      allow_private_networks=allow, threads=1, connect_timeout_s=0.5, deadline_s=1.0)
        fetch_host_unit(store, *part, cfg)
        seen = list(tls.seen)
    loopback, cgnat = _ledger(store, part[0])
    if allow:
        assert loopback["outcome"] == "fetched" and seen
        assert cgnat["outcome"] != "error/blocked_address"
    else:
        assert not seen, "a refused address was connected to"
        assert loopback["outcome"] == "error/blocked_address" and loopback["requests"] == 0
        assert loopback["detail"] == "intranet.test resolves to 127.0.0.1 is a loopback, private or CGNAT address"
        assert cgnat["outcome"] == "error/blocked_address" and "100.64.0.9" in cgnat["detail"]


def test_pauses_breaker_and_interval_hold_across_workers(tmp_path, http_hosts, local_cluster):
    """Two worker processes: a 429's Retry-After and an open breaker met by a unit on one worker
    hold for the next unit on the other; two units at once keep a host's minimum interval."""
    from distributed import Client

    pause, broken, spaced = "127.0.0.45", "127.0.0.46", "127.0.0.47"
    write_images(tmp_path / "images", 12)
    hosts = {pause: {"robots": "404"}, broken: {"robots": "404"}, spaced: {"robots": "404"}}
    with http_hosts(tmp_path, hosts, tmp_path / "images", latency_ms=10) as h:
        parts = [[h.url(pause, "/429s/3/img0.jpg")] + [h.url(broken, f"/503always/a{i}") for i in range(5)],
                 [h.url(pause, f"/img/img{i}.jpg") for i in (1, 2, 3)] + [h.url(broken, f"/503always/b{i}")
                                                                          for i in range(3)],
                 [h.url(spaced, f"/img/img{i}.jpg") for i in range(6)],
                 [h.url(spaced, f"/img/img{i}.jpg") for i in range(6, 12)]]
        store, units = _units(tmp_path, parts)
        cfg = _config(breaker_failures=4, threads=4, hosts={spaced: {"min_interval_s": 0.4}})
        with local_cluster(n_workers=2, threads_per_worker=2) as cluster, Client(cluster) as client:
            first, second = sorted(client.scheduler_info()["workers"])
            run = lambda part, worker: client.submit(fetch_host_unit, store, *part, cfg,  # noqa: E731
                                                     workers=[worker], pure=False)
            run(units[0], first).result()
            run(units[1], second).result()
            client.gather([run(units[2], first), run(units[3], second)])
        seen = h.seen()["requests"]
    a, b = _ledger(store, 0), _ledger(store, 1)
    t429 = next(t for p, t in seen[pause] if p.startswith("/429s/"))
    after = [t for p, t in seen[pause] if p.startswith("/img/")]
    assert a[0]["status_429"] == 1 and len(after) == 3
    assert min(after) >= t429 + 3 - 0.1, f"the other worker asked {min(after) - t429:.2f} s after the 429"
    asked = [p for p, _ in seen[broken] if p.startswith("/503always/")]
    # the breaker opens at the 4th failure; with 2 requests in flight per host one more may
    # already be on the wire then, never one of the second worker's unit
    assert 4 <= len(asked) <= 4 + cfg.connections_per_host - 1, asked
    assert all(p.startswith("/503always/a") for p in asked), asked
    assert [r["outcome"] for r in b[3:]] == ["error/fetch_deferred"] * 3 and "circuit open" in b[3]["detail"]
    starts = sorted(t for p, t in seen[spaced] if p.startswith("/img/"))
    gaps = [later - earlier for earlier, later in zip(starts, starts[1:])]
    # 0.4 s apart when granted; the server's arrival times can lag a grant on a loaded machine
    # (without the shared interval two units' requests arrive together: gaps near 0)
    assert len(starts) == 12 and min(gaps) >= 0.2, gaps


def test_redirects_between_two_hosts_never_wait_on_each_others_slot(tmp_path, http_hosts, local_cluster):
    """Two hosts of one connection each whose URLs redirect to each other, in one unit on a
    worker process: a lane that meets a redirect to a host it holds no slot of hands the URL to
    that host's queue instead of waiting for the slot while it keeps its own (before, the two
    lanes waited on each other until the request deadline, and both URLs failed)."""
    from distributed import Client

    one, two = "127.0.0.48", "127.0.0.49"
    write_images(tmp_path / "images", 4)
    with http_hosts(tmp_path, {one: {"robots": "allow"}, two: {"robots": "allow"}}, tmp_path / "images",
                    latency_ms=20) as h:
        to = lambda host, name: "/to/" + quote(h.url(host, f"/img/{name}"), safe="")  # noqa: E731
        store, [part] = _units(tmp_path, [[h.url(one, to(two, "img0.jpg")), h.url(two, to(one, "img1.jpg")),
                                           h.url(one, "/img/img2.jpg"), h.url(two, "/img/img3.jpg")]])
        cfg = _config(threads=4, deadline_s=3.0, hosts={one: {"connections": 1}, two: {"connections": 1}})
        with local_cluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
            start = time.monotonic()
            client.submit(fetch_host_unit, store, *part, cfg, pure=False).result()
            took = time.monotonic() - start
        peak = h.seen()["peak"]
    rows = _ledger(store, part[0])
    assert [r["outcome"] for r in rows] == ["fetched"] * 4, [(r["outcome"], r["detail"]) for r in rows]
    assert took < cfg.deadline_s, f"{took:.1f} s: a lane waited for a slot another lane held"
    assert peak[one] == peak[two] == 1


def test_the_request_deadline_holds_while_headers_drip(tmp_path, http_hosts):
    """A host that sends its status line and headers a byte every 0.2 s (each read well inside
    the read timeout) is given up at the request's deadline, as a dripping body is (before, the
    deadline was checked only while the body streamed: 36 s here, days with 16 KiB of headers)."""
    host = "127.0.0.50"
    write_images(tmp_path / "images", 1)
    with http_hosts(tmp_path, {host: {"robots": "404"}}, tmp_path / "images") as h:
        store, [part] = _units(tmp_path, [[h.url(host, "/dripheaders/img0.jpg")]])
        start = time.monotonic()
        fetch_host_unit(store, *part, _config(deadline_s=2.0, connect_timeout_s=1.0))
        took = time.monotonic() - start
    [row] = _ledger(store, part[0])
    assert row["outcome"] == "error/fetch_failed" and "deadline" in row["detail"].lower(), row["detail"]
    assert took < 6, f"{took:.1f} s for a request with a 2 s deadline"
