"""Fetching a URL-list source (issue 33): the loopback hosts (a real server process, one
127.0.0.x address per host) script every fault; the build runs as users run it, the CLI in a
subprocess on a 2-worker cluster. The opt-out, address and politeness rules are also checked
one by one, in-process."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import pyarrow.dataset as ds
import pytest
import yaml

from tasks.ingest.fetch.addresses import Blocked, parse_target, refusal
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.optouts import DenyList, OriginFile, robots_rule, tdmrep_rule, x_robots_rule
from tasks.ingest.fetch.politeness import retry_after_seconds
from tasks.shared.inputs import locate
from tests.http_hosts import write_images

UA = "corpusforge/1.0 (+https://example.org/bot; bot@example.org)"
CLOCK = "2026-01-02T03:04:05Z"
A, B, C, D, E, F, G = (f"127.0.0.{i}" for i in range(2, 9))
HOSTS = {A: {"robots": "allow"}, B: {"robots": "disallow:/img/img3.jpg"}, C: {"robots": "404"},
         D: {"robots": "503"}, E: {"robots": "timeout"},
         F: {"robots": "allow", "tdmrep": [{"location": "/img/*", "tdm-reservation": 1}]},
         G: {"robots": "scoped:/img/"}}


# ---- the rules, one by one -------------------------------------------------------------------

def test_addresses_refused_and_allowed():
    assert refusal("169.254.169.254", allow_private=True) is not None  # cloud metadata: never
    assert refusal("224.0.0.1", allow_private=True) is not None
    assert refusal("0.0.0.0", allow_private=True) is not None
    for private in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "100.64.0.1", "::1", "fd00::1", "::ffff:127.0.0.1"):
        assert "private" in refusal(private, allow_private=False), private
        assert refusal(private, allow_private=True) is None, private
    assert refusal("93.184.216.34", allow_private=False) is None
    for url, why in [("file:///etc/passwd", "scheme 'file'"), ("ftp://x/y", "scheme 'ftp'"),
                     ("http://user:pw@x/", "credentials"), ("http:///x", "without a host")]:
        with pytest.raises(Blocked, match=why):
            parse_target(url)


def test_a_url_is_never_a_path():
    """URLs come only from a URL list's ``url`` column: a path column holding one stays refused."""
    assert locate("/data", "https://example.org/a.jpg")[0] is None


def test_retry_after_in_seconds_and_as_a_date():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert retry_after_seconds("7", now) == 7
    assert retry_after_seconds("Thu, 01 Jan 2026 00:00:30 GMT", now) == 30
    assert retry_after_seconds("Wed, 31 Dec 2025 00:00:00 GMT", now) == 0
    assert retry_after_seconds("soon", now) is None


def test_opt_out_rules():
    assert x_robots_rule(["noai"], "corpusforge") == "X-Robots-Tag: noai"
    assert x_robots_rule(["noindex, noimageai"], "corpusforge") == "X-Robots-Tag: noimageai"
    assert x_robots_rule(["corpusforge: noai"], "corpusforge") == "X-Robots-Tag: corpusforge: noai"
    assert x_robots_rule(["otherbot: noai", "noindex"], "corpusforge") is None
    assert x_robots_rule(["unavailable_after: 2030-01-01"], "corpusforge") is None
    target = parse_target("http://h/img/a.jpg")
    tdm = OriginFile(200, "ab", json.dumps([{"location": "/img/*", "tdm-reservation": 1}]))
    assert "location /img/*" in tdmrep_rule(tdm, target)
    assert tdmrep_rule(tdm, parse_target("http://h/other.jpg")) is None
    assert tdmrep_rule(OriginFile(404), target) is None
    deny = DenyList(["# registry export", "http://h/img/", "blocked.example"])
    assert deny.rule("http://h/img/a.jpg", target) == "deny-list: http://h/img/"
    assert deny.rule("http://blocked.example/x", parse_target("http://blocked.example/x")) == \
        "deny-list: host blocked.example"


@pytest.mark.parametrize("robots, allowed", [
    (OriginFile(200, "s", "User-agent: *\nDisallow: /img/\n"), False),
    (OriginFile(200, "s", "User-agent: corpusforge\nDisallow: /img/\n\nUser-agent: *\nAllow: /\n"), False),
    (OriginFile(200, "s", "User-agent: otherbot\nDisallow: /\n"), True),
    (OriginFile(404), True),  # RFC 9309: 4xx allows everything
    (OriginFile(503), False),  # 5xx disallows everything
    (OriginFile(None, error="timeout"), False),  # unreachable disallows everything
])
def test_robots_rules_of_rfc_9309(robots, allowed):
    assert (robots_rule(robots, parse_target("http://h/img/a.jpg"), "corpusforge") is None) == allowed


def test_user_agent_must_name_a_contact():
    with pytest.raises(ValueError, match="contact"):
        FetchConfig(user_agent="corpusforge/1.0")
    assert FetchConfig(user_agent=UA).product() == "corpusforge"


# ---- the build, end to end ---------------------------------------------------------------------

def _rows(h, deny: Path) -> tuple[list[dict], dict[str, str]]:
    """The URL list and each key's expected outcome (status/reason-code)."""
    a = lambda path: h.url(A, path)  # noqa: E731
    img = lambda i: a(f"/img/img{i}.jpg")  # noqa: E731
    plan = [(f"ok{i}", img(i), "kept") for i in range(12)]  # enough to meet the per-host limit
    plan += [
        ("nolicence", img(12), "filtered/license_not_allowed"),
        ("after429s", a("/429s/1/img13.jpg"), "kept"), ("after429date", a("/429date/2/img14.jpg"), "kept"),
        ("after503", a("/503once/img15.jpg"), "kept"),
        ("gone404", a("/status/404/x"), "error/http_status"), ("gone410", a("/status/410/x"), "error/http_status"),
        ("legal451", a("/status/451/x"), "error/http_status"),
        ("noai", a("/xrobots/noai/img16.jpg"), "filtered/opted_out"),
        ("scopednoai", a("/xrobots/" + quote("corpusforge: noimageai", safe="") + "/img17.jpg"),
         "filtered/opted_out"),
        ("othersbot", a("/xrobots/" + quote("otherbot: noai", safe="") + "/img18.jpg"), "kept"),
        ("tdmheader", a("/tdm/img19.jpg"), "filtered/opted_out"),
        ("denied", img(20), "filtered/opted_out"),
        ("robotsno", h.url(B, "/img/img3.jpg"), "filtered/robots_disallowed"),
        ("robotsyes", h.url(B, "/img/img21.jpg"), "kept"),
        ("robots404", h.url(C, "/img/img22.jpg"), "kept"),
        ("robots503", h.url(D, "/img/img23.jpg"), "filtered/robots_disallowed"),
        ("robotstimeout", h.url(E, "/img/img24.jpg"), "filtered/robots_disallowed"),
        ("tdmrep", h.url(F, "/img/img25.jpg"), "filtered/opted_out"),
        ("robotsscoped", h.url(G, "/img/img26.jpg"), "filtered/robots_disallowed"),
        ("chain", a("/redirect/3/img27.jpg"), "kept"),
        ("loop", a("/loop/x"), "error/fetch_failed"),
        ("metadata", a("/to/" + quote("http://169.254.169.254/latest/meta-data/", safe="")), "error/blocked_address"),
        ("tofile", a("/to/" + quote("file:///etc/passwd", safe="")), "error/blocked_address"),
        ("fileurl", "file:///etc/passwd", "error/blocked_address"),
        ("huge", a("/huge/x"), "error/too_large"), ("endless", a("/endless/x"), "error/too_large"),
        ("drip", a("/drip/img0.jpg"), "error/fetch_failed"),
        ("html", a("/html/x"), "error/not_an_image"),
        ("truncated", a("/img/truncated.jpg"), "error/decode_error"),
        ("bomb", a("/img/bomb.png"), "error/decompression_bomb"),
        ("later", a("/retry-far/img28.jpg"), "error/fetch_deferred"),
        ("badsha1", img(29), "error/checksum_mismatch"),
        ("sameurl", img(2), "exact_duplicate/sha256_match"),  # listed twice: fetched once
        ("sameurlnolicence", img(1), "filtered/license_not_allowed"),  # its licence still decides
    ]
    deny.write_text(f"# an offline opt-out registry\n{img(20)}\n")
    rows = [{"key": k, "url": u, "license": "All rights reserved" if "nolicence" in k else "CC BY 2.0",
             "license_url": "https://creativecommons.org/licenses/by/2.0/", "attribution": f"author of {k}",
             "caption": f"a photo {k}", "sha1": "0" * 40 if k == "badsha1" else None} for k, u, _ in plan]
    return rows, {k: want for k, _, want in plan}


def _config(tmp: Path, deny: Path) -> Path:
    path = tmp / "build.yaml"
    path.write_text(yaml.safe_dump({
        "fetch": {"user_agent": UA, "allow_private_networks": True, "deny_list": str(deny), "deadline_s": 1.0,
                  "retries": 1, "backoff_s": 0.05, "retry_after_cap_s": 5, "max_bytes": 1 << 20, "threads": 8},
        "input": {"partition_size": 16}, "validation": {"min_side": 1},
        "features": {"models": []}, "near_dedup": None, "eval_captions": None,
        "splits": {"val": 0, "test": 0, "shard_size": 50}, "dask": {"n_workers": 2}}))
    return path


def _build(cli, api: str, source: Path, out: Path, config: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "CORPUSFORGE_FETCH_CLOCK": CLOCK, "PREFECT_API_URL": api}
    return subprocess.Popen([*cli, "build", "--source", str(source), "--out", str(out), "--config", str(config)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def _finish(proc: subprocess.Popen) -> None:
    output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, output[-3000:]


def _manifest(out: Path) -> dict[str, dict]:
    return {r["key"]: r for r in ds.dataset(out / "manifest", format="parquet").to_table().to_pylist()}


def _image_requests(seen: dict, since: float = 0.0) -> list[tuple[str, str]]:
    """(host, path) of every request but those for robots.txt and tdmrep.json."""
    return [(host, path) for host, reqs in seen["requests"].items() for path, t in reqs
            if t >= since and not path.startswith(("/robots.txt", "/.well-known/"))]


def _kept(out: Path) -> set[str]:
    """The URLs whose final outcome is kept in the fetch store (JSON lines, a batch a file)."""
    return {json.loads(line)["url"] for p in (out / "fetch" / "urls").rglob("*.json")
            for line in p.read_text().splitlines()}


def _files(root: Path, folder: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / folder).rglob("*")) if p.is_file()}


@pytest.mark.long
def test_url_list_build_fetches_politely_once_and_resumes(tmp_path, cli, http_hosts, prefect_server):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = tmp_path / "images"
    files = write_images(images, 30)
    deny = tmp_path / "deny.txt"
    with http_hosts(tmp_path, HOSTS, images, latency_ms=20) as h:
        rows, want = _rows(h, deny)
        rows[0]["sha1"] = hashlib.sha1(files["img0.jpg"]).hexdigest()  # a Commons-style SHA-1 that matches
        source = tmp_path / "src" / "urls.parquet"
        source.parent.mkdir()
        pq.write_table(pa.Table.from_pylist(rows), source)
        config, out = _config(tmp_path, deny), tmp_path / "out"

        # no User-Agent with a contact: refused before anything starts
        bare = tmp_path / "bare.yaml"
        bare.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(config.read_text()).items() if k != "fetch"}))
        refused = subprocess.run([*cli, "build", "--source", str(source), "--out", str(out), "--config", str(bare)],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "fetch.user_agent" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and not out.exists() and not h.seen()["requests"]

        # killed mid-fetch (SIGKILL to its process group) once outcomes are kept, then resumed
        first = _build(cli, prefect_server, source, out, config, start_new_session=True)
        deadline = time.monotonic() + 300  # a loaded machine starts the CLI, Prefect and Dask slowly
        while len(_image_requests(h.seen())) < 8 or not _kept(out):
            assert first.poll() is None and time.monotonic() < deadline, "the build ended before it was killed"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = time.time()
        time.sleep(0.5)  # requests in flight at the kill reach the server's log
        stored = _kept(out)
        _finish(_build(cli, prefect_server, source, out, config))
        again = {h.url(host, path) for host, path in _image_requests(h.seen(), killed_at)}
        assert again and not again & stored, f"URLs with a stored outcome fetched again: {sorted(again & stored)}"

        manifest = _manifest(out)
        assert {k: f"{r['status']}/{r['reason'].split(':')[0]}" if r["reason"] else r["status"]
                for k, r in manifest.items()} == want
        assert {manifest[k]["http_status"] for k in ("gone404", "gone410", "legal451")} == {404, 410, 451}
        assert {k: manifest[k]["opt_out_rule"] for k in ("noai", "scopednoai", "tdmheader", "tdmrep", "denied")} == {
            "noai": "X-Robots-Tag", "scopednoai": "X-Robots-Tag", "tdmheader": "tdm-reservation",
            "tdmrep": "tdmrep.json", "denied": "deny-list"}
        assert "sha256=" in manifest["robotsno"]["reason"] and manifest["ok0"]["url"] == rows[0]["url"]
        assert manifest["ok3"]["retrieved_at"] == CLOCK

        # release shards carry no URL; the receipt has the fetch figures
        for shard in (out / "shards").rglob("*.tar"):
            with tarfile.open(shard) as tar:
                for member in tar:
                    assert b"127.0.0." not in tar.extractfile(member).read()
        receipt = json.loads((out / "receipt.json").read_text())
        assert receipt["fetch"]["by_outcome"]["filtered/robots_disallowed"] == 4
        assert receipt["fetch"]["hosts"][A]["requests"] > 20 and receipt["fetch"]["hosts"][A]["status_429"] >= 1
        assert "Fetch" in (out / "report.md").read_text()

        # a fresh build (its own fetch store) with a frozen clock: the same shards and manifest
        h.reset()
        fresh = tmp_path / "fresh"
        _finish(_build(cli, prefect_server, source, fresh, config))
        seen = h.seen()
    assert _files(fresh, "shards") == _files(out, "shards")
    assert _files(fresh, "manifest") == _files(out, "manifest")

    # politeness and opt-outs, from what the hosts saw in one whole run (2 workers, 3 fetch units)
    paths = {host: [p for p, _ in reqs] for host, reqs in seen["requests"].items()}
    assert max(seen["peak"].values()) <= 2 and seen["peak"][A] == 2, seen["peak"]
    for host in HOSTS:
        assert paths[host].count("/robots.txt") == 1, (host, paths[host])
    for opted in ("/xrobots/noai/img16.jpg", "/xrobots/corpusforge%3A%20noimageai/img17.jpg", "/tdm/img19.jpg"):
        assert paths[A].count(opted) == 1, opted
    assert "/img/img12.jpg" not in paths[A] and "/img/img20.jpg" not in paths[A]  # licence, deny-list
    assert paths[A].count("/img/img2.jpg") == 1 and paths[A].count("/img/img1.jpg") == 1  # a URL listed twice
    assert "/img/img3.jpg" not in paths[B] and "/img/img25.jpg" not in paths[F]
    assert paths[G] == ["/robots.txt", "/.well-known/tdmrep.json"]
    for slow in ("/429s/1/img13.jpg", "/429date/2/img14.jpg"):
        times = [t for p, t in seen["requests"][A] if p == slow]
        assert len(times) == 2 and times[1] - times[0] >= 1.0, (slow, times)


def test_commons_and_flickr_exports_become_url_lists():
    from tasks.ingest.fetch.exports import commons_rows, flickr_rows
    from tasks.ingest.licenses import LicenseConfig, license_reason

    commons = {"query": {"pages": {"42": {"pageid": 42, "imageinfo": [{
        "url": "https://upload.wikimedia.org/wikipedia/commons/a/a1/Owl.jpg", "sha1": "ab" * 20,
        "descriptionurl": "https://commons.wikimedia.org/wiki/File:Owl.jpg",
        "extmetadata": {"LicenseShortName": {"value": "CC BY 4.0"},
                        "LicenseUrl": {"value": "https://creativecommons.org/licenses/by/4.0"},
                        "Artist": {"value": "<a href=\"//commons.wikimedia.org/wiki/User:Ann\">Ann &amp; Bo</a>"},
                        "Credit": {"value": "<span>Own work</span>"},
                        "ImageDescription": {"value": "An <b>owl</b> at dusk"}}}]}}}}
    [row] = commons_rows(commons)
    assert row["attribution"] == "Ann & Bo; Own work" and row["caption"] == "An owl at dusk"
    assert row["key"] == "wm42" and row["sha1"] == "ab" * 20
    assert license_reason(row["license"], row["license_url"], LicenseConfig()) == ""
    table = [{"id": 0, "name": "All Rights Reserved", "url": ""},
             {"id": 4, "name": "Attribution License", "url": "https://creativecommons.org/licenses/by/2.0/"},
             {"id": 16, "name": "CC BY 4.0", "url": "https://creativecommons.org/licenses/by/4.0/"}]
    photos = [{"id": "1", "owner": "9@N0", "ownername": "Cy", "title": "Bridge", "license": "4",
               "url_o": "https://f/1.jpg"},
              {"id": "2", "owner": "9@N0", "title": "Dog", "license": "0", "url_o": "https://f/2.jpg"},
              {"id": "3", "owner": "9@N0", "title": "Cat", "license": "16", "url_o": "https://f/3.jpg"}]
    verdicts = [license_reason(r["license"], r["license_url"], LicenseConfig()) for r in flickr_rows(photos, table)]
    assert verdicts[0] == "" and verdicts[2] == "" and verdicts[1].startswith("license_not_allowed")


def test_plan_says_how_many_urls_hosts_and_host_units_a_build_would_fetch(tmp_path, cli):
    """``corpusforge plan`` (the CLI, in a subprocess) reads the URL list (never a host): rows the
    licence drops and bad URLs are not requested; the host units are those the build's planning
    step cuts with ``fetch.unit_urls`` (hosts of 2, 2 and 2 URLs and a URL without a host, 3 a
    unit: 3 units), counted before it ran and read from its marker after. It writes nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpusforge.contract import in_process, keyed
    from corpusforge.storage import Store
    from tasks.ingest.fetch.hostunits import PLAN_HOST_UNITS, input_cut_sha256, plan_host_units_call
    from tasks.ingest.licenses import LicenseConfig
    from tasks.ingest.sources import SourceConfig, cut_partitions

    urls = [f"http://127.0.0.{2 + i % 3}:9/img{i}.jpg" for i in range(7)] + ["file:///etc/passwd"]
    licences = ["CC BY 4.0"] * 6 + ["All rights reserved", "CC0"]
    pq.write_table(pa.table({"url": urls, "license": licences}), tmp_path / "urls.parquet")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"fetch": {"user_agent": UA, "unit_urls": 3}, "features": {"models": []},
                                      "near_dedup": None}))
    out = tmp_path / "out"

    def plan(*flags: str) -> str:
        done = subprocess.run([*cli, "plan", "--source", str(tmp_path / "urls.parquet"), "--out", str(out),
                               "--config", str(config), *flags], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    data = json.loads(plan("--json"))
    fetch = data["stages"][0]
    assert fetch["stage"] == "fetch" and fetch["facts"] == {"urls": 6, "hosts": 3, "host_units": 3}
    assert fetch["counts"]["recompute"] == 1 and data["stages"][1]["stage"] == "ingest"
    assert not out.exists()

    store, scratch = Store(str(out), fsync=False), Store(str(tmp_path / "scratch"), fsync=False)
    for cut in (store, scratch):  # the plan's cut (in a scratch folder) is the build's, byte for byte
        cut_partitions(str(tmp_path / "urls.parquet"), cut, SourceConfig())
    assert input_cut_sha256(scratch) == input_cut_sha256(store)
    call = plan_host_units_call(store, input_cut_sha256(store), FetchConfig(unit_urls=3), LicenseConfig())
    assert len(in_process(keyed(PLAN_HOST_UNITS), [call])[0].info["units"]) == 3  # the build's planning step
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert "(6 URLs to request from 3 hosts; 3 host units)" in plan()  # the step's result, from its marker
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_plan_finds_stored_outcomes_without_a_call_per_url(tmp_path, monkeypatch):
    """``corpusforge plan`` over a URL list lists the fetch store's outcome folders instead of asking
    for each URL (on S3 a round trip each): the fetch store's calls are the same at 16 and 160 URLs,
    and the counts equal asking for each URL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpusforge.storage import Store
    from tasks.ingest.fetch import plan as fetch_plan
    from tasks.ingest.fetch.fetcher import url_digest
    from tasks.ingest.files import fetch_url_path
    from tasks.ingest.licenses import LicenseConfig
    from tasks.ingest.sources import SourceConfig, cut_partitions

    calls: list[str] = []
    for method in ("exists", "listdir", "open", "read_bytes"):
        def counting(self, rel="", *args, _real=getattr(Store, method), **kwargs):
            if rel.startswith("fetch/"):
                calls.append(rel)
            return _real(self, rel, *args, **kwargs)
        monkeypatch.setattr(Store, method, counting)
    cfg = FetchConfig(user_agent=UA)
    counted = {}
    for n in (16, 160):
        urls = [f"http://127.0.0.{2 + i % 4}:9/img{i}.jpg" for i in range(n)]
        pq.write_table(pa.table({"url": urls, "license": ["CC BY 4.0"] * n}), tmp_path / f"urls{n}.parquet")
        out, scratch = Store(str(tmp_path / f"out{n}")), Store(str(tmp_path / f"scratch{n}"))
        out.write_linked([fetch_url_path(url_digest(u)) for u in urls[:6] + urls[-2:]], b"{}\n")  # a last run's
        parts = cut_partitions(str(tmp_path / f"urls{n}.parquet"), scratch, SourceConfig(partition_size=40))[1]
        calls.clear()
        facts = fetch_plan.plan_units(out, scratch, parts, cfg, LicenseConfig()).facts
        counted[n] = len(calls)
        asked = [u for u in urls if not out.exists(fetch_url_path(url_digest(u)))]  # the per-URL reference
        assert len(asked) == n - 8
        assert facts == {"urls": len(asked), "hosts": len({u.split("/")[2] for u in asked}), "host_units": 1}
    assert counted[16] == counted[160] <= 1 + 8, counted


def test_fetch_progress_shows_urls_fetched_and_bytes_per_second():
    from types import SimpleNamespace

    from corpusforge.progress import RunProgress
    from flows.build_corpus import _fetch_measure

    progress = RunProgress("build-corpus", ["fetch"], log_every=1e9)
    progress._push = lambda force=False: None  # no logger, no artifact: only the line is checked
    unit = SimpleNamespace(info={"fetched": 40, "hosts": {"a": {"bytes": 3_000_000}, "b": {"bytes": 1_000_000}}})
    with progress.stage("fetch", "fetch-host-unit", "host units", measure=_fetch_measure) as stage:
        progress.add("fetch-host-unit", 2)
        progress.advance("fetch-host-unit", 1, [unit])
        line = stage.line()
    assert line.startswith("fetch: 1/2 host units (50%), 40 URLs fetched, 4.0 MB (") and "MB/s)" in line
