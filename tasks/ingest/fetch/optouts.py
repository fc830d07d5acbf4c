"""Opt-outs, each decided before a body is read and never retried: robots.txt (RFC 9309), the
X-Robots-Tag ``noai``/``noimageai`` directives (also scoped to a user agent), TDMRep (the
``tdm-reservation: 1`` header and ``/.well-known/tdmrep.json``) and an offline deny-list.
Each check returns the rule that refused a URL (kept per record as evidence), or None."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from protego import Protego

from tasks.ingest.fetch.addresses import Target

AI_DIRECTIVES = {"noai", "noimageai"}
# X-Robots-Tag directives that carry a value after ':' (so 'name: value' is not a user-agent scope).
VALUED_DIRECTIVES = {"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"}
ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 §2.5: a crawler must parse at least 500 KiB


@dataclass(frozen=True)
class OriginFile:
    """A robots.txt or tdmrep.json as fetched: the final status (None: unreachable), the body's
    SHA-256 and text, or the error."""

    status: int | None
    sha256: str | None = None
    text: str = ""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "sha256": self.sha256, "text": self.text, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OriginFile:
        return cls(data["status"], data["sha256"], data["text"], data["error"])


@functools.lru_cache(maxsize=64)  # at most 64 robots.txt of 500 KiB held
def _robots_parser(text: str) -> Protego:
    """A robots.txt parsed once per text (it was parsed again for every URL)."""
    return Protego.parse(text)


def robots_rule(robots: OriginFile, target: Target, product: str) -> str | None:
    """Why robots.txt disallows ``target``, or None. RFC 9309 §2.3.1: a 4xx file allows
    everything; a 5xx or an unreachable file disallows everything."""
    where = f"{target.origin}/robots.txt"
    if robots.status is None or robots.status >= 500:
        return f"{where} unavailable ({robots.status or robots.error}): everything disallowed (RFC 9309)"
    if robots.status >= 400:
        return None
    if _robots_parser(robots.text).can_fetch(target.origin + target.path, product):
        return None
    return f"{where} sha256={robots.sha256} disallows {target.path} for {product}"


def x_robots_rule(values: list[str], product: str) -> str | None:
    """The X-Robots-Tag line that opts out of AI use for us: unscoped, or scoped to our product
    token (``corpusforge: noai``)."""
    for value in values:
        scope = None
        body = value
        match = re.match(r"^\s*([A-Za-z0-9_.\-*]+)\s*:\s*(.*)$", value)
        if match and match.group(1).lower() not in VALUED_DIRECTIVES:
            scope, body = match.group(1).lower(), match.group(2)
        if scope is not None and scope not in (product, "*"):
            continue
        directives = {d.strip().lower() for d in body.split(",")}
        if hit := sorted(directives & AI_DIRECTIVES):
            return f"X-Robots-Tag: {value.strip()}" if scope else f"X-Robots-Tag: {hit[0]}"
    return None


def tdm_header_rule(headers: dict[str, str]) -> str | None:
    """TDMRep's HTTP header: ``tdm-reservation: 1`` reserves text and data mining rights."""
    if headers.get("tdm-reservation", "").strip() == "1":
        policy = headers.get("tdm-policy")
        return "tdm-reservation: 1" + (f" (tdm-policy {policy})" if policy else "")
    return None


def _pattern(location: str) -> re.Pattern[str]:
    """A TDMRep location (a path pattern: '*' any characters, a trailing '$' the end)."""
    anchored = location.endswith("$")
    body = re.escape(location.rstrip("$")).replace(r"\*", ".*")
    return re.compile(body + ("$" if anchored else ""))


def tdmrep_rule(tdmrep: OriginFile, target: Target) -> str | None:
    """The ``/.well-known/tdmrep.json`` entry that reserves ``target``'s path, or None (no file,
    unreadable JSON: no reservation)."""
    if tdmrep.status != 200:
        return None
    try:
        entries = json.loads(tdmrep.text)
    except json.JSONDecodeError:
        return None
    path = target.path
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("location"), str):
            continue
        if _pattern(entry["location"]).match(path):
            if str(entry.get("tdm-reservation")) == "1":
                return f"{target.origin}/.well-known/tdmrep.json sha256={tdmrep.sha256} location {entry['location']}"
            return None  # the first matching location decides
    return None


class DenyList:
    """An offline opt-out list (e.g. a registry's export): URL prefixes and bare host names."""

    def __init__(self, lines: list[str]):
        entries = [line.split("#", 1)[0].strip() for line in lines]
        self.prefixes = tuple(e for e in entries if "://" in e)
        self.hosts = frozenset(e.lower() for e in entries if e and "://" not in e)

    def rule(self, url: str, target: Target) -> str | None:
        if target.host in self.hosts:
            return f"deny-list: host {target.host}"
        for prefix in self.prefixes:
            if url.startswith(prefix):
                return f"deny-list: {prefix}"
        return None
