"""Which addresses a fetch may connect to: a URL's name is resolved here, every address it
resolves to is checked, and the connection then goes to the checked address (never resolved
again by the HTTP client), on every redirect hop. So a name that resolves to a private address,
or a redirect to cloud metadata (169.254.169.254), reaches nothing."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

CGNAT = ipaddress.ip_network("100.64.0.0/10")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")  # control characters and space
NEVER = "link-local, multicast, reserved or unspecified"


class Blocked(Exception):
    """The URL or an address it resolves to may not be fetched; ``str()`` says why."""


@dataclass(frozen=True)
class Target:
    """A URL split for a request to a checked address."""

    scheme: str
    host: str      # the name (or literal) from the URL, lower-case
    port: int
    path: str      # path and query, at least "/"

    @property
    def origin(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}" + ("" if self.port == default else f":{self.port}")

    @property
    def host_header(self) -> str:
        return self.origin.split("://", 1)[1]


def parse_target(url: str) -> Target:
    """A http(s) URL as a :class:`Target`; anything else (file:, ftp:, a URL with credentials
    or no host) is :class:`Blocked`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Blocked(f"unusable URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise Blocked(f"scheme {parts.scheme or '(none)'!r} is not http or https")
    if not parts.hostname:
        raise Blocked("URL without a host")
    if parts.username or parts.password:
        raise Blocked("URL with credentials")
    if _CONTROL.search(url):
        raise Blocked("control character or space in URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80), path)


def refusal(address: str, allow_private: bool) -> str | None:
    """Why ``address`` may not be connected to, or None."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return f"{address} is {NEVER}"
    if ip.is_loopback or ip.is_private or ip in CGNAT:
        return None if allow_private else f"{address} is a loopback, private or CGNAT address"
    if ip.is_reserved or not ip.is_global:
        return f"{address} is {NEVER}"
    return None


def _is_address(host: str) -> bool:
    """Whether ``host`` is an IP address in its canonical form (``127.1`` and the like are not:
    they are left to the resolver, which reads them as it always did)."""
    try:
        return str(ipaddress.ip_address(host)) == host
    except ValueError:
        return False


def resolve_checked(target: Target, allow_private: bool, pinned: Mapping[str, str] | None = None) -> str:
    """The address to connect to for ``target``: every address its name resolves to must pass
    :func:`refusal` (one bad address refuses the name: DNS rebinding picks among them).
    ``pinned`` names resolved without DNS (``fetch.resolve``), checked the same way."""
    if pinned and target.host in pinned:
        infos = [(None, None, None, None, (pinned[target.host], target.port))]
    elif _is_address(target.host):  # an address as written: nothing to look up (a lookup lets go of the GIL)
        infos = [(None, None, None, None, (target.host, target.port))]
    else:
        try:
            infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise ConnectionError(f"cannot resolve {target.host}: {exc}") from None
    addresses = sorted({info[4][0] for info in infos}, key=lambda a: (":" in a, a))
    for address in addresses:
        if why := refusal(address, allow_private):
            raise Blocked(f"{target.host} resolves to {why}")
    if not addresses:
        raise ConnectionError(f"{target.host} resolves to no address")
    return addresses[0]
