"""The fetch stage planned before a run (``corpusforge plan``): each URL-list partition's fetch
ledger judged with the key it computes (one holding deferred or failed URLs is written again),
the URLs the run would request (none a licence, the URL or a stored final outcome refuses) and
their hosts, and the host units (:mod:`.hostunits`): the planning step's when it is current, else
counted from every partition's rows as it counts them.

Stored outcomes are found by listing the fetch store's ``fetch/urls/`` folders (one listing
each, at most 257), not by asking for each URL (on S3 a round trip each, serially); the URLs
asked and the names listed are spilled and matched by DuckDB out of core, a partition's rows or
a folder's names in memory at a time."""

from __future__ import annotations

import posixpath
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.contract import COMPUTED, SKIPPED, explain, read_marker, step_result
from corpusforge.layout import part_name
from corpusforge.outofcore import spilling_duckdb
from corpusforge.plans import StagePlan, deletions
from corpusforge.storage import Store
from tasks.ingest.fetch.addresses import Blocked, parse_target
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.fetcher import url_digest
from tasks.ingest.fetch.hostunits import (DUCKDB_MEMORY, PLAN_HOST_UNITS, host_assignment, input_cut_sha256,
                                          plan_host_units_call)
from tasks.ingest.fetch.unit import before_request, fetch_key, fetch_store, host_of, read_deny_list
from tasks.ingest.files import FETCH_LEDGER_DIR, FETCH_PLAN, fetch_ledger_path, fetch_url_path
from tasks.ingest.licenses import LicenseConfig
from tasks.ingest.partition import chunk_rows
from tasks.ingest.sources import Partition

FETCH_NAMES = {"[0]": "fetch.user_agent (product token)", "[1]": "fetch.allow_private_networks",
               "[2]": "fetch.max_bytes", "[3]": "fetch.max_redirects", "[4]": "fetch.refresh", "[5]": "fetch.store"}
URLS_DIR = posixpath.dirname(posixpath.dirname(fetch_url_path("00")))  # fetch/urls: a folder per first 2 hex digits
ASKED = pa.schema([("name", pa.string()), ("host", pa.string())])
STORED = pa.schema([("name", pa.string())])


def plan_units(store: Store, scratch: Store, parts: list[Partition], cfg: FetchConfig,
               lic: LicenseConfig | None) -> StagePlan:
    """The fetch units over ``parts`` (chunks and input cut in ``scratch``); ``outputs``: the ledger
    digests of the units that skip; ``facts``: the URLs to request, their hosts, the host units."""
    stage = StagePlan("fetch", names=FETCH_NAMES)
    _, deny_sha = read_deny_list(cfg)
    fetched = fetch_store(store, cfg)
    asked: set[int] = set()
    for p in parts:
        marker = read_marker(store, fetch_ledger_path(p.index))
        action, reason = explain(marker, fetch_key(scratch, p, cfg, lic, deny_sha, fetched.root))
        if action == SKIPPED and marker is not None and marker.info["pending"]:
            action, reason = COMPUTED, f"{marker.info['pending']} URLs deferred or failed in the last run"
        stage.add(part_name(p.index), action, reason)
        if action == SKIPPED and marker is not None:
            stage.outputs[part_name(p.index)] = marker.digest
        else:
            asked.add(p.index)
    deletions(stage, store, FETCH_LEDGER_DIR, ".parquet", [part_name(p.index) for p in parts])
    call = plan_host_units_call(store, input_cut_sha256(scratch), cfg, lic)
    planned = step_result(store, PLAN_HOST_UNITS.name, call["key"], (FETCH_PLAN,))
    hosts: Counter[str | None] = Counter()  # every kept row's host, when the step would cut the units anew
    with tempfile.TemporaryDirectory(prefix="corpusforge-fetch-plan-") as tmp:
        for p in parts if planned is None else [p for p in parts if p.index in asked]:
            rows = [meta for meta in chunk_rows(p, scratch) if before_request(meta, lic) is None]
            if planned is None:
                hosts.update(host_of(meta) for meta in rows)
            if p.index in asked:
                _spill_asked(rows, Path(tmp) / f"asked-{p.index:06d}.parquet")
        urls, asked_hosts = _not_stored(fetched, Path(tmp))
    units = _unit_count(hosts, cfg.unit_urls) if planned is None else len(planned.info["units"])
    stage.facts = {"urls": urls, "hosts": asked_hosts, "host_units": units}
    return stage


def _spill_asked(rows: list[dict], path: Path) -> None:
    """The URL digests (as stored outcome names) and hosts of ``rows`` a request may go to."""
    asked: dict[str, list[str]] = {"name": [], "host": []}
    for meta in rows:
        try:
            host = parse_target(meta["url"]).host
        except Blocked:  # refused without a request
            continue
        asked["name"].append(f"{url_digest(meta['url'])}.json")
        asked["host"].append(host)
    if asked["name"]:
        pq.write_table(pa.table(asked, schema=ASKED), path)


def _not_stored(fetched: Store, tmp: Path) -> tuple[int, int]:
    """URLs spilled in ``tmp`` that have no stored outcome in ``fetched``, and their hosts: the
    stored names listed a folder at a time (no call per URL), matched out of core."""
    if not any(tmp.glob("asked-*.parquet")):
        return 0, 0
    pq.write_table(STORED.empty_table(), tmp / "stored.parquet")
    for folder in fetched.listdir(URLS_DIR):
        names = fetched.listdir(f"{URLS_DIR}/{folder}")
        pq.write_table(pa.table({"name": names}, schema=STORED), tmp / f"stored-{folder}.parquet")
    with spilling_duckdb(DUCKDB_MEMORY) as db:
        urls, hosts = db.execute(f"SELECT count(*), count(DISTINCT a.host) FROM read_parquet('{tmp}/asked-*.parquet') "
                                 f"a ANTI JOIN read_parquet('{tmp}/stored*.parquet') s ON a.name = s.name").fetchone()
    return int(urls), int(hosts)


def _unit_count(hosts: Counter[str | None], unit_urls: int) -> int:
    """The host units the planning step cuts from these per-host URL counts (hosts in its order)."""
    return host_assignment(sorted(hosts.items(), key=lambda h: (h[0] is None, h[0] or "")), unit_urls)[1]
