"""The fetch stage planned before a run (``corpusforge plan``): each URL-list partition's fetch
ledger judged with the key it computes, and how many URLs the run would request and from how many
hosts (rows the licence or the URL already refuse, and URLs with a stored final outcome, are not
requested). A ledger that is current but holds deferred or failed URLs is written again. The host
units (:mod:`.hostunits`) are not listed: they are cut from the whole list when it runs, and a
host unit whose URLs all have a stored outcome requests nothing."""

from __future__ import annotations

from corpusforge.contract import COMPUTED, SKIPPED, explain, read_marker
from corpusforge.layout import part_name
from tasks.ingest.files import FETCH_LEDGER_DIR, fetch_ledger_path, fetch_url_path
from corpusforge.plans import StagePlan, deletions
from corpusforge.storage import Store
from tasks.ingest.fetch.addresses import Blocked, parse_target
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.fetcher import url_digest
from tasks.ingest.fetch.unit import before_request, fetch_key, fetch_store, read_deny_list
from tasks.ingest.licenses import LicenseConfig
from tasks.ingest.partition import chunk_rows
from tasks.ingest.sources import Partition

FETCH_NAMES = {"[0]": "fetch.user_agent (product token)", "[1]": "fetch.allow_private_networks",
               "[2]": "fetch.max_bytes", "[3]": "fetch.max_redirects", "[4]": "fetch.refresh", "[5]": "fetch.store"}


def plan_units(store: Store, scratch: Store, parts: list[Partition], cfg: FetchConfig,
               lic: LicenseConfig | None) -> StagePlan:
    """The fetch units over ``parts`` (chunks in ``scratch``); ``outputs``: the ledger digests of
    the units that skip; ``facts``: the URLs to request and their hosts."""
    stage = StagePlan("fetch", names=FETCH_NAMES)
    _, deny_sha = read_deny_list(cfg)
    fetched = fetch_store(store, cfg)
    urls, hosts = 0, set()
    for p in parts:
        marker = read_marker(store, fetch_ledger_path(p.index))
        action, reason = explain(marker, fetch_key(scratch, p, cfg, lic, deny_sha, fetched.root))
        if action == SKIPPED and marker is not None and marker.info["pending"]:
            action, reason = COMPUTED, f"{marker.info['pending']} URLs deferred or failed in the last run"
        stage.add(part_name(p.index), action, reason)
        if action == SKIPPED and marker is not None:
            stage.outputs[part_name(p.index)] = marker.digest
            continue
        for meta in chunk_rows(p, scratch):
            if before_request(meta, lic) is not None or fetched.exists(fetch_url_path(url_digest(meta["url"]))):
                continue
            try:
                hosts.add(parse_target(meta["url"]).host)
            except Blocked:  # refused without a request
                continue
            urls += 1
    deletions(stage, store, FETCH_LEDGER_DIR, ".parquet", [part_name(p.index) for p in parts])
    stage.facts = {"urls": urls, "hosts": len(hosts)}
    return stage
