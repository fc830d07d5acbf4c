"""The fetch unit: one URL-list input partition's URLs fetched, its fetch ledger written.

Output: ``work/fetch/{part}.parquet`` (:data:`tasks.ingest.files.FETCH_LEDGER_SCHEMA`), one row
per input row in input order; the bytes go to the fetch store (``fetch/blobs/``), each URL's
final outcome to ``fetch/urls/``. Ingest reads the ledger and the bytes like any other source.

Fingerprint: the partition's chunk digest, each row's licence verdict, the deny-list's SHA-256
and the settings that decide an outcome (User-Agent product token, private networks, body cap,
redirects, refresh label, store). A unit whose ledger holds deferred or failed URLs runs again
on the next build, and only those URLs are requested (the others' outcomes are stored); a killed
unit likewise resumes from the stored outcomes. Rows are worked on host by host in lanes
(:mod:`.lanes`), each holding one of the host's connection slots while it drains the host's
URLs, so one slow host holds at most its connection limit's threads.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict, deque
from typing import Any

import fsspec
import pyarrow as pa

from corpusforge.contract import (COMPUTED, SKIPPED, Unit, UnitResult, current_marker, finish_unit, must_compute,
                                  unit_fingerprint)
from corpusforge.faults import fault_point
from corpusforge.hashing import sha256_bytes
from tasks.ingest.files import FETCH_LEDGER_SCHEMA, fetch_ledger_path
from corpusforge.storage import Store
from corpusforge.tarshard import is_safe_key
from corpusforge.version import code_version
from tasks.ingest.fetch.addresses import Blocked, parse_target
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.fetcher import FETCHED, Fetcher, Hop, Outcome
from tasks.ingest.fetch.lanes import run_lanes
from tasks.ingest.fetch.optouts import DenyList
from tasks.ingest.licenses import LicenseConfig, license_reason
from tasks.ingest.partition import chunk_rows, license_verdicts
from tasks.ingest.sources import Partition


def fetch_store(out: Store, cfg: FetchConfig) -> Store:
    """Where fetched bytes and outcomes are kept: ``fetch.store``, or the output root."""
    return Store(cfg.store, cfg.storage_options) if cfg.store else out


def read_deny_list(cfg: FetchConfig) -> tuple[DenyList, str | None]:
    """The offline deny-list and its SHA-256 (None: no list)."""
    if cfg.deny_list is None:
        return DenyList([]), None
    with fsspec.open(cfg.deny_list, "rb") as f:
        data = f.read()
    return DenyList(data.decode("utf-8", "replace").splitlines()), sha256_bytes(data)


def fetch_key(chunks: Store, part: Partition, cfg: FetchConfig, lic: LicenseConfig | None,
              deny_sha256: str | None, store_root: str) -> str:
    """The fingerprint of one partition's fetch (the run and ``corpusforge plan`` share it);
    ``chunks``: the store the partition's chunk is read with, ``store_root``: the fetch store's."""
    decisive = [cfg.product(), cfg.allow_private_networks, cfg.max_bytes, cfg.max_redirects, cfg.refresh,
                store_root]
    return unit_fingerprint("fetch", code_version(__name__), decisive,
                            [part.digest, license_verdicts(part, chunks, lic), deny_sha256])


def before_request(meta: dict[str, Any], lic: LicenseConfig | None) -> Outcome | None:
    """The outcome of a row that is never requested: no URL, an unsafe key, a licence refused."""
    url = meta.get("url") or ""
    try:
        host = parse_target(url).host
    except Blocked:
        host = None
    out = Outcome.new(host)
    if not url:
        return out.end("error/missing_url", "empty url")
    if meta.get("key") and not is_safe_key(meta["key"]):
        return out.end("error/unsafe_key", repr(meta["key"]))
    if reason := license_reason(meta.get("license"), meta.get("license_url"), lic):
        code, _, detail = reason.partition(":")
        return out.end(f"filtered/{code}", detail.strip() or None)
    return None


def host_of(meta: dict[str, Any]) -> str | None:
    """The host a row's URL names (None: no usable URL)."""
    try:
        return parse_target(meta.get("url") or "").host
    except Blocked:
        return None


def _sha1(meta: dict[str, Any]) -> str | None:
    extra = json.loads(meta["extra"]) if meta.get("extra") else {}
    value = extra.get("sha1")
    return value if isinstance(value, str) and value else None


def host_figures(ledger: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per host: URLs, requests, bytes received, 429 answers and seconds waited (as stored)."""
    hosts: dict[str, Counter[str]] = defaultdict(Counter)
    waited: Counter[str] = Counter()
    for r in ledger:
        if r["host"] is None or not r["requests"]:
            continue
        h = hosts[r["host"]]
        h.update(urls=1, requests=r["requests"], bytes=r["bytes_received"], status_429=r["status_429"])
        waited[r["host"]] += r["wait_seconds"]
    return {host: {**dict(sorted(c.items())), "seconds_waited": round(waited[host], 1)}
            for host, c in sorted(hosts.items())}


def fetch_partition(store: Store, part: Partition, cfg: FetchConfig, lic: LicenseConfig | None = None
                    ) -> UnitResult:
    """Fetch one URL-list partition (skipped when current with nothing deferred); its marker."""
    deny, deny_sha = read_deny_list(cfg)
    fp = fetch_key(store, part, cfg, lic, deny_sha, fetch_store(store, cfg).root)
    rel = fetch_ledger_path(part.index)
    marker = current_marker(store, rel, fp)
    if marker is not None and marker.info["pending"] == 0:
        return UnitResult.of(marker, SKIPPED)
    must_compute()
    rows = chunk_rows(part, store)
    fetcher = Fetcher(cfg, fetch_store(store, cfg), deny, seed=part.index)

    refused = {i: out for i, meta in enumerate(rows) if (out := before_request(meta, lic)) is not None}
    wanted = {i: (meta["url"], _sha1(meta)) for i, meta in enumerate(rows) if i not in refused}
    first: dict[tuple[str, str | None], int] = {}  # a URL listed twice is fetched once
    for i, want in wanted.items():
        first.setdefault(want, i)

    fetched: dict[tuple[str, str | None], Outcome] = {}

    def one(item: int | tuple[int, Hop]) -> tuple[str, tuple[int, Hop]] | None:
        """Fetch row ``item`` (or go on with its :class:`Hop`); a hop to another host is handed back."""
        i, hop = item if isinstance(item, tuple) else (item, None)
        result = fetcher.fetch(*wanted[i], hop=hop)
        if isinstance(result, Hop):
            return result.target.host, (i, result)
        fetched[wanted[i]] = result
        fault_point("fetch.url", part.name)
        return None

    # by host, in order of first appearance
    queues: dict[str | None, deque[int | tuple[int, Hop]]] = defaultdict(deque)
    for i in sorted(set(first.values())):
        queues[host_of(rows[i])].append(i)
    try:
        for i in queues.pop(None, ()):  # no host: refused before any request
            one(i)
        fetcher.hosts.learn(list(queues))
        run_lanes(queues, fetcher.slots, cfg.connections, cfg.threads, one)
    finally:
        fetcher.close()
    again = {"requests": 0, "status_429": 0, "wait_seconds": 0.0, "bytes_received": 0}  # a repeat asked nothing
    outcomes = {**refused, **{i: fetched[want] if first[want] == i else Outcome({**fetched[want], **again})
                              for i, want in wanted.items()}}
    ledger = [{"row": i, "url": meta.get("url"), **outcomes[i]} for i, meta in enumerate(rows)]
    sha = store.write_parquet(rel, pa.Table.from_pylist(ledger, schema=FETCH_LEDGER_SCHEMA))
    by_outcome = Counter(r["outcome"] for r in ledger)
    info = {"part": part.index, "urls": len(ledger), "fetched": by_outcome.get(FETCHED, 0),
            "pending": sum(not r["final"] for r in ledger), "by_outcome": dict(sorted(by_outcome.items())),
            "hosts": host_figures(ledger)}
    return UnitResult.of(finish_unit(store, rel, fp, {rel: sha}, info), COMPUTED)


FETCH_PARTITION = Unit(fetch_partition, "fetch-partition")
