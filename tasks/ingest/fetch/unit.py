"""The fetch stage's work units: a host unit's URLs fetched, and each partition's fetch ledger.

A host unit (:func:`fetch_host_unit`, planned by :mod:`.hostunits`) requests its URLs host by
host in lanes (:mod:`.lanes`), so one slow host holds at most its connection limit's threads;
bytes go to the fetch store, final outcomes are never requested again, and a killed unit resumes
from the stored outcomes. The ledger of a partition (:func:`write_fetch_ledger`) is assembled
from the host units' outcomes without a request, so ingest reads it as before. Files, resume and
both fingerprints (:func:`fetch_key`): docs/fetch.md (the stage and its files).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict, deque
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc

from corpusforge.contract import (COMPUTED, SKIPPED, Unit, UnitResult, current_marker, finish_unit, must_compute,
                                  unit_fingerprint)
from corpusforge.faults import fault_point
from corpusforge.hashing import sha256_bytes
from tasks.ingest.files import (FETCH_LEDGER_SCHEMA, FETCH_OUTCOMES_SCHEMA, FETCH_PARTS_PER_ROW_GROUP, FETCH_PLAN,
                                fetch_ledger_path, fetch_outcomes_path, fetch_unit_name, fetch_unit_path)
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
    return unit_fingerprint("fetch", code_version(__name__), _decisive(cfg, store_root),
                            [part.digest, license_verdicts(part, chunks, lic), deny_sha256])


def _decisive(cfg: FetchConfig, store_root: str) -> list[Any]:
    """The settings that decide a URL's outcome."""
    return [cfg.product(), cfg.allow_private_networks, cfg.max_bytes, cfg.max_redirects, cfg.refresh, store_root]


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


def row_sha1(meta: dict[str, Any]) -> str | None:
    """The SHA-1 an export gives for a row's bytes (Commons), None if none."""
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


def _ledger_info(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a unit's marker keeps of its outcome rows: counts by outcome and figures per host."""
    by_outcome = Counter(r["outcome"] for r in rows)
    return {"urls": len(rows), "fetched": by_outcome.get(FETCHED, 0), "pending": sum(not r["final"] for r in rows),
            "by_outcome": dict(sorted(by_outcome.items())), "hosts": host_figures(rows)}


def fetch_host_unit(store: Store, unit: int, sha256: str, cfg: FetchConfig) -> UnitResult:
    """Fetch host unit ``unit`` (its URL file's SHA-256 ``sha256``), skipped when current with
    nothing deferred; its marker."""
    deny, deny_sha = read_deny_list(cfg)
    fetched_store = fetch_store(store, cfg)
    fp = unit_fingerprint("fetch-hosts", code_version(__name__), _decisive(cfg, fetched_store.root),
                          [sha256, deny_sha])
    rel = fetch_outcomes_path(unit)
    marker = current_marker(store, rel, fp)
    if marker is not None and marker.info["pending"] == 0:
        return UnitResult.of(marker, SKIPPED)
    must_compute()
    rows = store.read_parquet(fetch_unit_path(unit)).to_pylist()
    fetcher = Fetcher(cfg, fetched_store, deny, seed=unit)
    wanted = [(r["url"], r["sha1"]) for r in rows]
    first: dict[tuple[str, str | None], int] = {}  # a URL listed twice is fetched once
    for i, want in enumerate(wanted):
        first.setdefault(want, i)
    fetched: dict[tuple[str, str | None], Outcome] = {}

    def one(item: int | tuple[int, Hop]) -> tuple[str, tuple[int, Hop]] | None:
        """Fetch row ``item`` (or go on with its :class:`Hop`); a hop to another host is handed back."""
        i, hop = item if isinstance(item, tuple) else (item, None)
        result = fetcher.fetch(*wanted[i], hop=hop)
        if isinstance(result, Hop):
            return result.target.host, (i, result)
        fetched[wanted[i]] = result
        fault_point("fetch.url", fetch_unit_name(unit))
        return None

    # by host, in the file's order (hosts by name, each host's URLs in input order)
    queues: dict[str | None, deque[int | tuple[int, Hop]]] = defaultdict(deque)
    for i in sorted(set(first.values())):
        queues[rows[i]["host"]].append(i)
    try:
        for i in queues.pop(None, ()):  # no host: refused before any request
            one(i)
        fetcher.hosts.learn(list(queues))
        run_lanes(queues, fetcher.slots, cfg.connections, cfg.threads, one)
    finally:
        fetcher.close()
    again = {"requests": 0, "status_429": 0, "wait_seconds": 0.0, "bytes_received": 0}  # a repeat asked nothing
    outcomes = sorted(({"part": r["part"], "row": r["row"], "url": r["url"],
                        **(fetched[want] if first[want] == i else {**fetched[want], **again})}
                       for i, (r, want) in enumerate(zip(rows, wanted, strict=True))),
                      key=lambda r: (r["part"], r["row"]))
    sha = store.write_parquet(rel, pa.Table.from_pylist(outcomes, schema=FETCH_OUTCOMES_SCHEMA),
                              row_groups=[r["part"] // FETCH_PARTS_PER_ROW_GROUP for r in outcomes])
    return UnitResult.of(finish_unit(store, rel, fp, {rel: sha}, {"unit": unit, **_ledger_info(outcomes)}),
                         COMPUTED)


FETCH_HOST_UNIT = Unit(fetch_host_unit, "fetch-host-unit", probe=True)


def _unit_outcomes(store: Store, part: int) -> dict[int, dict[str, Any]]:
    """Row → outcome of partition ``part``'s requested rows, from the host units that hold them."""
    where = pc.field("part") == part
    units = store.dataset(FETCH_PLAN).to_table(filter=where, columns=["unit"]).column("unit").to_pylist()
    got: dict[int, dict[str, Any]] = {}
    for unit in units:
        for r in store.dataset(fetch_outcomes_path(unit)).to_table(filter=where).to_pylist():
            got[r.pop("row")] = r
    return got


def write_fetch_ledger(store: Store, part: Partition, cfg: FetchConfig, lic: LicenseConfig | None = None
                       ) -> UnitResult:
    """A URL-list partition's fetch ledger from its rows' outcomes (skipped when current with
    nothing deferred); its marker. No request: the host units ran before."""
    _, deny_sha = read_deny_list(cfg)
    fp = fetch_key(store, part, cfg, lic, deny_sha, fetch_store(store, cfg).root)
    rel = fetch_ledger_path(part.index)
    marker = current_marker(store, rel, fp)
    if marker is not None and marker.info["pending"] == 0:
        return UnitResult.of(marker, SKIPPED)
    must_compute()
    got = _unit_outcomes(store, part.index)
    ledger = []
    for i, meta in enumerate(chunk_rows(part, store)):
        out = before_request(meta, lic)
        if out is None and i not in got:
            raise ValueError(f"no host unit holds row {i} of partition {part.name}: plan the host units first")
        ledger.append({**(got[i] if out is None else out), "row": i, "url": meta.get("url")})
    sha = store.write_parquet(rel, pa.Table.from_pylist(ledger, schema=FETCH_LEDGER_SCHEMA))
    return UnitResult.of(finish_unit(store, rel, fp, {rel: sha}, {"part": part.index, **_ledger_info(ledger)}),
                         COMPUTED)


FETCH_LEDGER = Unit(write_fetch_ledger, "write-fetch-ledger", probe=True)
