"""Fetch one URL to a final outcome (or defer it): the opt-outs, the address checks on every
redirect hop, the retries and the host's politeness, in the order that reads the least.

Outcomes are the manifest's status and reason code (docs/fetch.md, outcomes), ``fetched``, or
``error/fetch_deferred`` (Retry-After beyond the cap, or the host's circuit open). A final outcome
is kept in the fetch store (``fetch/urls/``, in batches: :class:`KeptOutcomes`) and the URL is
never requested again; a deferred one, a failure after every retry, and a robots.txt refusal
because robots.txt was unreachable are tried again by the next run."""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urljoin

import httpcore
import httpx

from corpusforge.hashing import canonical_json, sha256_bytes
from tasks.ingest.files import fetch_blob_path, fetch_url_path
from corpusforge.storage import Store
from tasks.ingest.fetch.addresses import Blocked, Target, parse_target, resolve_checked
from tasks.ingest.fetch.client import (REQUEST_ERRORS, Deadline, TooLarge, image_magic, new_client, request,
                                       tls_context)
from tasks.ingest.fetch.config import FetchConfig
from tasks.ingest.fetch.optouts import (ROBOTS_MAX_BYTES, DenyList, OriginFile, robots_rule, tdm_header_rule,
                                        tdmrep_rule, x_robots_rule)
from tasks.ingest.fetch.origins import Origins
from tasks.ingest.fetch.politeness import (RETRIED_STATUSES, HostSlots, HostView, SlotTimeout, backoff,
                                           retry_after_seconds)

CLOCK_ENV = "CORPUSFORGE_FETCH_CLOCK"  # an ISO time: every fetch happens "then" (tests, reproducible demos)
FETCHED = "fetched"
DEFERRED = "error/fetch_deferred"
REDIRECTS = frozenset({301, 302, 303, 307, 308})


def fetch_clock() -> datetime:
    """Now in UTC, or the frozen time ``CORPUSFORGE_FETCH_CLOCK`` names."""
    frozen = os.environ.get(CLOCK_ENV)
    if frozen:
        return datetime.fromisoformat(frozen.replace("Z", "+00:00")).astimezone(timezone.utc)
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def url_digest(url: str) -> str:
    return sha256_bytes(url.encode())


class Outcome(dict):
    """One URL's ledger facts (the fetch ledger's columns but ``row`` and ``url``)."""

    @classmethod
    def new(cls, host: str | None) -> Outcome:
        return cls(host=host, outcome="", detail=None, final=True, http_status=None, opt_out_rule=None,
                   evidence=None, sha256=None, bytes=None, retrieved_at=None, requests=0, status_429=0,
                   wait_seconds=0.0, bytes_received=0)

    def end(self, outcome: str, detail: str | None = None, final: bool = True, **facts: Any) -> Outcome:
        self.update(outcome=outcome, detail=detail, final=final, **facts)
        return self


@dataclass
class Hop:
    """A URL's fetch that a redirect took to a host whose slot the lane that met it does not hold:
    it goes on in a lane of that host (:mod:`.lanes`). Before, the lane waited for a slot of the
    other host while it held its own: two lanes whose URLs redirected to each other's hosts waited
    on each other until the request deadline (60 s), and both URLs failed."""

    target: Target
    out: Outcome
    left: int  # redirects still allowed


class KeptOutcomes:
    """A unit's final outcomes, kept in the fetch store in batches of up to :data:`BATCH` (or what
    came in :data:`BATCH_S`): one file of JSON lines per batch, found under each of its URLs'
    names (``fetch/urls/{h[:2]}/{h}.json``, hard links: :meth:`~corpusforge.storage.Store.write_linked`).
    A file of its own per URL cost a create, a chmod, a write and a rename, each a system call
    that hands the GIL among the unit's threads, the create alone 20-750 µs of kernel CPU on a
    busy disk (measured here); a link is one call. A unit killed mid-fetch loses at most its
    unwritten batch: those URLs are requested again when it resumes."""

    BATCH, BATCH_S = 32, 0.5

    def __init__(self, store: Store, refresh: str | None):
        self.store, self.refresh = store, refresh
        self.lock = threading.Lock()
        self.batch: list[tuple[str, Outcome]] = []
        self.since = 0.0

    def add(self, url: str, out: Outcome) -> None:
        with self.lock:
            if not self.batch:
                self.since = time.monotonic()
            self.batch.append((url, out))
            if len(self.batch) < self.BATCH and time.monotonic() - self.since < self.BATCH_S:
                return
            batch, self.batch = self.batch, []
        self._write(batch)

    def flush(self) -> None:
        with self.lock:
            batch, self.batch = self.batch, []
        if batch:
            self._write(batch)

    def _write(self, batch: list[tuple[str, Outcome]]) -> None:
        lines = "".join(canonical_json({"url": url, "refresh": self.refresh, "outcome": dict(out)}) + "\n"
                        for url, out in batch)
        self.store.write_linked([fetch_url_path(url_digest(url)) for url, _ in batch], lines.encode())

    def stored(self, url: str) -> Outcome | None:
        """The final outcome this URL got before (under the same ``fetch.refresh`` label)."""
        rel = fetch_url_path(url_digest(url))
        if not self.store.exists(rel):
            return None
        for line in self.store.read_bytes(rel).splitlines():
            data = json.loads(line)
            if data["url"] == url:
                return Outcome(data["outcome"]) if data.get("refresh") == self.refresh else None
        return None


class Fetcher:
    """Fetches URLs for one unit: one HTTP client, the units' shared host and origin state."""

    def __init__(self, cfg: FetchConfig, store: Store, deny: DenyList, clock: Callable[[], datetime] = fetch_clock,
                 seed: int = 0):
        self.cfg, self.store, self.deny, self.clock = cfg, store, deny, clock
        self.tls = tls_context(cfg.ca_bundle)
        self.clients: dict[str, httpcore.ConnectionPool] = {}  # one per host name (client_for says why)
        self.clients_lock = threading.Lock()
        self.hosts = HostView(cfg.breaker_failures, cfg.breaker_cooldown_s)
        self.slots = HostSlots()
        self.origins = Origins(store, self._origin_file, clock, cfg.robots_max_age_s)
        self.rng = random.Random(seed)
        self.product = cfg.product()
        self.kept = KeptOutcomes(store, cfg.refresh)

    def close(self) -> None:
        """Stop syncing with the host ledger, close the connections, write the last outcomes."""
        self.hosts.close()
        for client in self.clients.values():
            client.close()
        self.kept.flush()

    def client_for(self, target: Target) -> httpcore.ConnectionPool:
        """The client for ``target``'s host name. Connections are pooled by the address connected
        to, so a TLS connection verified for one name would otherwise carry another name's
        requests (two names on one CDN address); and a pool holds only one host's few
        connections, where one pool for every host was scanned whole per request (1,000 URLs
        from 32 hosts: 2 million idle checks and 60,000 polls; with a pool per host, 5,700 checks)."""
        with self.clients_lock:
            if target.host not in self.clients:
                self.clients[target.host] = new_client(self.tls)
            return self.clients[target.host]

    # ---- one URL -----------------------------------------------------------------------------
    def fetch(self, url: str, sha1: str | None = None, hop: Hop | None = None) -> Outcome | Hop:
        """The URL's final (or deferred) outcome: the stored one, else fetched now and kept; or,
        in a lane, a :class:`Hop` to another host (``hop``: where such a fetch goes on)."""
        if hop is not None:
            out = self._hops(hop.target, hop.out, sha1, hop.left)
        elif (before := self.kept.stored(url)) is not None:
            return before
        else:
            out = self._fetch(url, sha1)
        if isinstance(out, Outcome) and out["final"]:
            self.kept.add(url, out)
        return out

    def _fetch(self, url: str, sha1: str | None) -> Outcome | Hop:
        try:
            target = parse_target(url)
        except Blocked as exc:
            return Outcome.new(None).end("error/blocked_address", str(exc))
        out = Outcome.new(target.host)
        if rule := self.deny.rule(url, target):
            return out.end("filtered/opted_out", rule, opt_out_rule="deny-list", evidence=rule)
        return self._hops(target, out, sha1, self.cfg.max_redirects)

    def _hops(self, target: Target, out: Outcome, sha1: str | None, left: int) -> Outcome | Hop:
        """Request ``target`` and follow its redirects (``left`` more at most), each hop checked;
        a redirect to a host other than the one whose slot this thread's lane holds is handed back
        as a :class:`Hop`, so that a lane never waits for a slot while it holds one."""
        while True:
            try:
                address = resolve_checked(target, self.cfg.allow_private_networks, self.cfg.resolve)
            except Blocked as exc:
                return out.end("error/blocked_address", str(exc))
            except ConnectionError as exc:
                return out.end("error/fetch_failed", str(exc), final=False)
            refused = self._opted_out(target, out)
            if refused is not None:
                return refused
            result = self._attempts(target, address, out)
            if isinstance(result, Outcome):
                return self._body(result, sha1) if result["outcome"] == FETCHED else result
            try:
                target = parse_target(urljoin(target.origin + target.path, result))
            except Blocked as exc:
                return out.end("error/blocked_address", f"redirect to {result!r}: {exc}")
            if not left:
                return out.end("error/fetch_failed", f"more than {self.cfg.max_redirects} redirects (last "
                                                     f"{target.origin}{target.path})")
            left -= 1
            if self.slots.lane_elsewhere(target.host):
                return Hop(target, out, left)

    def _opted_out(self, target: Target, out: Outcome) -> Outcome | None:
        """robots.txt and tdmrep.json of the target's origin (before it is requested)."""
        files = self.origins.files(target)
        robots = files["robots.txt"]
        if rule := robots_rule(robots, target, self.product):
            unavailable = robots.status is None or robots.status >= 500
            return out.end("filtered/robots_disallowed", rule, final=not unavailable, opt_out_rule="robots.txt",
                           evidence=rule)
        if rule := tdmrep_rule(files[".well-known/tdmrep.json"], target):
            return out.end("filtered/opted_out", rule, opt_out_rule="tdmrep.json", evidence=rule)
        return None

    def _attempts(self, target: Target, address: str, out: Outcome) -> Outcome | str:
        """Request ``target`` until it answers for good: a final outcome, or a redirect's Location."""
        host, hosts = target.host, self.hosts
        rate = self.cfg.bandwidth(host)
        found: dict[str, str] = {}

        def read_body(status: int, headers: httpx.Headers) -> bool:
            if status != 200:
                return False
            rule = x_robots_rule(headers.get_list("x-robots-tag"), self.product) or tdm_header_rule(headers)
            if rule:
                found["rule"] = rule
            return not rule

        for attempt in range(self.cfg.retries + 1):
            try:
                with self.slots.slot(host, self.cfg.connections(host), self.cfg.deadline_s):
                    # the turn is taken in the slot: a request starts when its turn comes, so no more
                    # than the slots' requests can start before the bytes of the earlier ones are charged
                    waited = hosts.turn(host, self.cfg.min_interval(host), rate is not None)
                    if waited is None:
                        return out.end(DEFERRED, f"circuit open: {self.cfg.breaker_failures} consecutive failed "
                                                 f"attempts at {host}", final=False)
                    out["wait_seconds"] += waited
                    out["requests"] += 1
                    resp = request(self.client_for(target), target, address, self.cfg.user_agent or "",
                                   self.cfg.deadline_s, self.cfg.connect_timeout_s, self.cfg.max_bytes, read_body)
                    if rate is not None and resp.received:
                        hosts.charge(host, resp.received, rate)
                    after = None
                    if resp.status in RETRIED_STATUSES:
                        after = retry_after_seconds(resp.headers.get("retry-after"), datetime.now(timezone.utc))
                    if after is not None and after <= self.cfg.retry_after_cap_s:
                        hosts.pause(host, after)  # before the slot is let go: no request slips in before it
            except TooLarge as exc:
                return out.end("error/too_large", str(exc))
            except httpcore.LocalProtocolError as exc:  # a request it cannot send: asking again changes nothing
                return out.end("error/fetch_failed", f"LocalProtocolError: {exc}")
            except (*REQUEST_ERRORS, Deadline, SlotTimeout) as exc:  # connection and protocol errors
                hosts.failed(host)
                why = f"{type(exc).__name__}: {exc}"
            else:
                out["http_status"] = resp.status
                out["bytes_received"] += resp.received
                if resp.status in REDIRECTS and resp.headers.get("location"):
                    hosts.succeeded(host)
                    return resp.headers["location"]
                if resp.status not in RETRIED_STATUSES:
                    hosts.succeeded(host)
                    return self._answer(resp, out, found.get("rule"))
                out["status_429"] += resp.status == 429
                if resp.status != 429:
                    hosts.failed(host)
                why = f"HTTP {resp.status}"
                if after is not None:
                    if after > self.cfg.retry_after_cap_s:
                        return out.end(DEFERRED, f"Retry-After {after:g} s > cap {self.cfg.retry_after_cap_s:g} s",
                                       final=False)
                    continue
            if attempt < self.cfg.retries:
                hosts.pause(host, backoff(attempt, self.cfg.backoff_s, self.cfg.backoff_max_s, self.rng))
        return out.end("error/fetch_failed", f"{why} after {self.cfg.retries + 1} attempts", final=False)

    def _answer(self, resp: Any, out: Outcome, rule: str | None) -> Outcome:
        if rule:
            return out.end("filtered/opted_out", rule, opt_out_rule=rule.split(":", 1)[0], evidence=rule)
        if resp.status != 200:
            return out.end("error/http_status", f"HTTP {resp.status}")
        out["_body"] = resp.body
        out["sha256"] = resp.sha256
        return out.end(FETCHED)

    def _body(self, out: Outcome, sha1: str | None) -> Outcome:
        """A 200's body: an image by its magic bytes, matching the export's SHA-1, stored."""
        body: bytes = out.pop("_body")
        if image_magic(body[:16]) is None:
            return out.end("error/not_an_image", f"no image magic bytes in {len(body)} bytes "
                                                 f"(starts {body[:8]!r})", sha256=None)
        if sha1 and hashlib.sha1(body).hexdigest() != sha1.lower():
            return out.end("error/checksum_mismatch", f"SHA-1 {hashlib.sha1(body).hexdigest()} != {sha1}",
                           sha256=None)
        rel = fetch_blob_path(out["sha256"])
        if not self.store.exists(rel):
            self.store.write_bytes(rel, body, out["sha256"])
        return out.end(FETCHED, bytes=len(body), retrieved_at=iso(self.clock()))

    # ---- origin files --------------------------------------------------------------------------
    def _origin_file(self, target: Target) -> OriginFile:
        """robots.txt or tdmrep.json of an origin: redirects followed (each hop checked), no retry."""
        for _ in range(self.cfg.max_redirects + 1):
            try:
                address = resolve_checked(target, self.cfg.allow_private_networks, self.cfg.resolve)
                with self.slots.slot(target.host, self.cfg.connections(target.host), self.cfg.deadline_s):
                    resp = request(self.client_for(target), target, address, self.cfg.user_agent or "",
                                   self.cfg.deadline_s, self.cfg.connect_timeout_s, ROBOTS_MAX_BYTES,
                                   lambda status, _: status == 200)
            except (Blocked, ConnectionError, TooLarge, Deadline, SlotTimeout, *REQUEST_ERRORS) as exc:
                return OriginFile(None, error=f"{type(exc).__name__}: {exc}")
            if resp.status in REDIRECTS and resp.headers.get("location"):
                try:
                    target = parse_target(urljoin(target.origin + target.path, resp.headers["location"]))
                except Blocked as exc:
                    return OriginFile(None, error=str(exc))
                continue
            if resp.body is None:
                return OriginFile(resp.status)
            return OriginFile(resp.status, resp.sha256, resp.body.decode("utf-8", "replace"))
        return OriginFile(None, error="too many redirects")
