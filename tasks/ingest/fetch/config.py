"""The ``fetch`` section of a build: who we are, how hard we may knock, what we refuse."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pydantic import Field, field_validator

from corpusforge.config import StrictModel

# A contact a site operator can reach: an e-mail address or a URL (Wikimedia's User-Agent policy).
CONTACT = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+|https?://\S+")


class HostProfile(StrictModel):
    """Politeness for one host (Wikimedia's robot policy: 2 connections to upload.wikimedia.org)."""

    connections: int = Field(2, ge=1, le=64, description="Requests in flight to this host, across all workers.")
    min_interval_s: float = Field(0.0, ge=0, description="Least time between the starts of two requests to "
                                                         "this host, across all workers.")
    bytes_per_s: float | None = Field(None, gt=0, description="Bandwidth from this host across all workers "
                                                              "(bytes/s, averaged over requests); default: "
                                                              "fetch.bytes_per_s_per_host.")


class FetchConfig(StrictModel):
    """How a URL-list source is fetched (``tasks/ingest/fetch/``)."""

    user_agent: str | None = Field(
        None, description="User-Agent sent with every request; must name a contact (an e-mail address or a "
                          "URL), e.g. 'corpusforge/1.0 (+https://example.org/bot; bot@example.org)'. A build of a "
                          "URL list refuses to start without one.")
    store: str | None = Field(None, description="Where fetched bytes are kept, content-addressed (local or "
                                                "s3://); default: under the output root. Builds sharing a store "
                                                "never fetch a URL twice.")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options for fetch.store.")
    refresh: str | None = Field(None, description="A label (e.g. a date): URLs whose stored outcome was "
                                                  "fetched under another label are fetched again, once.")
    allow_private_networks: bool = Field(
        False, description="Allow loopback, private (RFC 1918, ULA) and CGNAT addresses (tests, an intranet "
                           "mirror). Link-local (169.254.0.0/16, cloud metadata), multicast, reserved and "
                           "unspecified addresses are refused even then.")
    connections_per_host: int = Field(2, ge=1, le=64, description="Requests in flight to one host across "
                                                                  "all workers, unless hosts names it.")
    bytes_per_s_per_host: float | None = Field(
        None, gt=0, description="Bandwidth from one host across all workers, in bytes/s averaged over requests "
                                "(a body arrives at full speed, then the host's next request waits until its "
                                "bytes are paid for), unless hosts names it; default: no limit.")
    hosts: dict[str, HostProfile] = Field(
        default_factory=lambda: {"upload.wikimedia.org": HostProfile(connections=2)},
        description="Per-host profiles (connections, min_interval_s, bytes_per_s).")
    threads: int = Field(16, ge=1, le=256, description="URLs one fetch unit works on at once.")
    unit_urls: int = Field(10_000, ge=1, description="URLs in one host unit at most: a host with more is cut "
                                                     "into several units, small hosts are packed together.")
    max_bytes: int = Field(64 << 20, gt=0, description="Body cap: a larger Content-Length or body is "
                                                       "error/too_large (nothing more is read).")
    deadline_s: float = Field(60.0, gt=0, description="Total time one request may take, body included.")
    connect_timeout_s: float = Field(10.0, gt=0, description="Time to connect to a host.")
    retries: int = Field(3, ge=0, le=10, description="Further attempts after a 408, 429, 5xx or connection "
                                                     "error, with exponential backoff and jitter.")
    backoff_s: float = Field(1.0, ge=0, description="First backoff; doubled each attempt, with ±50 % jitter.")
    backoff_max_s: float = Field(60.0, ge=0, description="Longest backoff.")
    retry_after_cap_s: float = Field(
        120.0, ge=0, description="Longest Retry-After honoured by waiting; a longer one defers the URL to the "
                                 "next run.")
    breaker_failures: int = Field(10, ge=1, description="Consecutive failed attempts at one host (across all "
                                                        "workers) after which its URLs are deferred to the next "
                                                        "run, for breaker_cooldown_s.")
    breaker_cooldown_s: float = Field(60.0, ge=0, description="How long an open breaker defers a host's URLs; "
                                                              "then attempts resume, and one more failure opens "
                                                              "it again.")
    max_redirects: int = Field(5, ge=0, le=5, description="Redirects followed (at most 5).")
    robots_max_age_s: float = Field(86_400.0, ge=0, description="How long a fetched robots.txt and "
                                                                "tdmrep.json are reused (RFC 9309: 24 h).")
    resolve: dict[str, str] = Field(
        default_factory=dict, description="Names resolved to these addresses instead of by DNS (like curl "
                                          "--resolve: an intranet mirror, tests); the addresses are checked like "
                                          "any other.")
    ca_bundle: str | None = Field(None, description="A PEM file of the certificate authorities https hosts are "
                                                    "verified against instead of the system's (an intranet "
                                                    "mirror, tests).")
    deny_list: str | None = Field(
        None, description="An offline opt-out list: one entry a line, a URL prefix (https://host/path) or a bare "
                          "host name; '#' starts a comment. A listed URL is never requested.")

    @field_validator("resolve")
    @classmethod
    def _addresses(cls, value: dict[str, str]) -> dict[str, str]:
        return {name.lower(): str(ipaddress.ip_address(address)) for name, address in value.items()}

    @field_validator("user_agent")
    @classmethod
    def _has_contact(cls, value: str | None) -> str | None:
        if value is not None and not CONTACT.search(value):
            raise ValueError("the User-Agent must name a contact (an e-mail address or a http(s):// URL)")
        return value

    def connections(self, host: str) -> int:
        profile = self.hosts.get(host)
        return profile.connections if profile else self.connections_per_host

    def min_interval(self, host: str) -> float:
        profile = self.hosts.get(host)
        return profile.min_interval_s if profile else 0.0

    def bandwidth(self, host: str) -> float | None:
        profile = self.hosts.get(host)
        return profile.bytes_per_s if profile and profile.bytes_per_s else self.bytes_per_s_per_host

    def product(self) -> str:
        """The User-Agent's product token ('corpusforge' of 'corpusforge/1.0 (...)'), which scoped
        robots.txt groups and X-Robots-Tag lines address."""
        return re.split(r"[/\s]", (self.user_agent or "").strip(), maxsplit=1)[0].lower()
