"""The licence allow-list (GPIC §2.1): only permissively licensed images enter the corpus.

Real metadata spells one licence many ways ("CC BY 2.0", "cc-by", "Attribution 2.0 Generic",
".../licenses/by/2.0/"), so a record's licence name and URL are first normalised to a
:class:`License` (family plus optional version) and only then compared with the allow-list,
normalised the same way. The name is the statement of record: an explicit name that is not
recognised is evidence against the URL, so the URL is read only when the name is empty; a name
and URL that disagree are a conflict (``LicenseConfig.on_conflict``). The full rules and reason
codes: docs/ingest.md (licences) and docs/outcomes.md. The decision needs no image byte, so
ingest makes it before reading the image.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from corpusforge.config import StrictModel

CC_BY_FAMILIES = ("CC BY", "CC BY-SA", "CC BY-ND", "CC BY-NC", "CC BY-NC-SA", "CC BY-NC-ND")
CC0 = "CC0"
PUBLIC_DOMAIN = "Public Domain"
NO_KNOWN_RESTRICTIONS = "No known restrictions"
# GPIC §2.1: "restricting the source pool to CC BY, CC0, Public Domain, and No-Known-Restrictions".
GPIC_ALLOWED = ["CC BY", CC0, PUBLIC_DOMAIN, NO_KNOWN_RESTRICTIONS]

LICENSE_MISSING = "license_missing"
LICENSE_NOT_ALLOWED = "license_not_allowed"
LICENSE_CONFLICT = "license_conflict"


@dataclass(frozen=True)
class License:
    family: str
    version: str | None = None

    def __str__(self) -> str:
        return f"{self.family} {self.version}" if self.version else self.family

    def accepted_by(self, entry: License) -> bool:
        return self.family == entry.family and (entry.version is None or entry.version == self.version)


_VERSION = re.compile(r"(?<![\w.])(\d{1,2}(?:\.\d{1,2})?)(?![\w.])")
_CC_TOKENS = {"by", "sa", "nc", "nd", "cc", "pd"}
_CC_URL = re.compile(r"creativecommons\.org/licen[cs]es/([a-z-]+)(?:/(\d+(?:\.\d+)?))?(?:/([a-z]{2})(?![a-z]))?")
_CC_PUBLIC_DOMAIN_URL = re.compile(r"creativecommons\.org/publicdomain/(zero|mark)/(\d+(?:\.\d+)?)?")
# Words of licence names, mapped to the tokens the family is built from ("" drops a word).
_WORDS = {
    "creativecommons": "cc", "attribution": "by", "sharealike": "sa", "noncommercial": "nc",
    "noderivatives": "nd", "noderivs": "nd", "license": "", "licence": "", "licensed": "", "under": "",
    "international": "", "generic": "", "unported": "", "deed": "", "version": "", "v": "", "the": "",
}
_PHRASES = [("creative commons", "creativecommons"), ("share alike", "sharealike"),
            ("non commercial", "noncommercial"), ("no derivatives", "noderivatives"),
            ("no derivs", "noderivs")]
_PUBLIC_DOMAIN_NAMES = {"pd", "pdm", "public domain", "public domain mark", "publicdomain", "cc pdm",
                        "cc public domain mark", "public domain dedication",
                        "no copyright", "pd us", "public domain us"}
_NO_KNOWN_NAMES = {"no known restrictions", "no known copyright restrictions", "nkcr",
                   "flickr commons", "no known copyright restriction"}


def _version(raw: str | None, jurisdiction: str | None = None) -> str | None:
    """``4`` → ``4.0``; a ported licence keeps its jurisdiction (``3.0 DE``), so an entry naming
    one version does not silently accept a port, while a family entry accepts every version."""
    if not raw:
        return None
    version = raw if "." in raw else f"{raw}.0"
    return f"{version} {jurisdiction.upper()}" if jurisdiction else version


def _cc_family(tokens: list[str]) -> str | None:
    """``CC BY[-NC][-SA|-ND]`` from tokens like ['by', 'nc', 'sa'] (any order), else None."""
    parts = set(tokens)
    if "by" not in parts or not parts <= {"by", "sa", "nc", "nd"} or {"sa", "nd"} <= parts:
        return None
    return "CC BY" + "".join(f"-{t.upper()}" for t in ("nc", "sa", "nd") if t in parts)


def _from_url(text: str) -> License | None:
    if m := _CC_URL.search(text):
        family = _cc_family(m.group(1).split("-"))
        return License(family, _version(m.group(2), m.group(3))) if family else None
    if m := _CC_PUBLIC_DOMAIN_URL.search(text):
        return License(CC0 if m.group(1) == "zero" else PUBLIC_DOMAIN, _version(m.group(2)))
    if "flickr.com/commons" in text:
        return License(NO_KNOWN_RESTRICTIONS)
    if re.search(r"wiki(pedia|media)\.org/wiki/.*public[_ ]domain", text):
        return License(PUBLIC_DOMAIN)
    return None


@functools.lru_cache(maxsize=65536)  # a corpus repeats a few dozen spellings millions of times
def normalize_license(raw: str | None) -> License | None:
    """The licence a name or URL means, or None when it is not recognised (never guessed)."""
    text = unicodedata.normalize("NFKC", raw or "").strip().lower()
    if not text:
        return None
    if "://" in text or text.startswith("www.") or "creativecommons.org" in text:
        return _from_url(text)
    if (m := re.search(r"\(([^()]+)\)", text)) and (inner := normalize_license(m.group(1))) is not None:
        return inner  # Flickr's "Attribution 2.0 Generic (CC BY 2.0)": the short name in brackets
    text = re.sub(r"[‐-―_/,;()]+|-", " ", text)
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\bcc\s*0\b|\bcc zero\b", "cc0", text)
    version = None
    if m := _VERSION.search(text):
        head, tail = text[:m.start()].split(), text[m.end():].split()
        port = tail.pop(0) if tail and re.fullmatch(r"[a-z]{2}", tail[0]) and tail[0] not in _CC_TOKENS else None
        version, text = _version(m.group(1), port), " ".join(head + tail)
    for phrase, word in _PHRASES:
        text = text.replace(phrase, word)
    tokens = [t2 for t in text.split() if (t2 := _WORDS.get(t, t))]
    name = " ".join(tokens)
    if name in ("cc0", "cc cc0", "cc0 public domain dedication", "cc0 universal", "cc0 public domain"):
        return License(CC0, version)
    if name in _PUBLIC_DOMAIN_NAMES or name.replace("cc ", "", 1) in _PUBLIC_DOMAIN_NAMES:
        return License(PUBLIC_DOMAIN, version)
    if name in _NO_KNOWN_NAMES:
        return License(NO_KNOWN_RESTRICTIONS)
    if tokens and tokens[0] == "cc":
        tokens = tokens[1:]
    family = _cc_family(tokens) if tokens and tokens[0] == "by" else None
    return License(family, version) if family else None


class LicenseConfig(StrictModel):
    """Which licences may enter the corpus; ``licenses: null`` in the build config turns the check off."""

    allow: list[str] = Field(
        default_factory=lambda: list(GPIC_ALLOWED), min_length=1,
        description="Accepted licences (GPIC §2.1 by default: CC BY, CC0, Public Domain, No known restrictions). "
                    "Spellings and URLs are normalised; an entry without a version accepts every version.")
    use_url: bool = Field(True, description="Read license_url: the licence when the name is empty, and a check "
                                            "on the name when both are given (an unrecognised name is never "
                                            "replaced by its URL).")
    on_conflict: Literal["filter", "stricter"] = Field(
        "filter", description="A recognised name that disagrees with a recognised URL. filter (default): the record "
                              "is filtered as license_conflict. stricter: it is judged on both statements and kept "
                              "only when the allow-list accepts each; receipts count it as a conflict either way.")

    @field_validator("allow")
    @classmethod
    def _entries_are_licences(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if normalize_license(v) is None]
        if bad:
            raise ValueError(f"not a recognised licence: {bad}; known families: "
                             f"{[*CC_BY_FAMILIES, CC0, PUBLIC_DOMAIN, NO_KNOWN_RESTRICTIONS]}")
        return value

    def allowed(self) -> list[License]:
        """The allow-list normalised (sorted, duplicates merged): what fingerprints and receipts record."""
        found = {lic for v in self.allow if (lic := normalize_license(v)) is not None}
        return sorted(found, key=lambda lic: (lic.family, lic.version or ""))


@dataclass(frozen=True)
class Resolution:
    """What a record's licence statements come to: ``found`` when they agree (or only one
    was given), ``conflict`` (name, URL) when both are recognised and disagree, and the
    raw statement that was not recognised, if any."""

    found: License | None = None
    conflict: tuple[License, License] | None = None
    unrecognised: str | None = None


def _agree(a: License, b: License) -> License | None:
    """The licence two statements both mean, or None: one family, and versions that are
    equal or that one leaves open or only ports (``3.0`` beside ``3.0 DE``); the more
    specific statement wins."""
    if a.family != b.family:
        return None
    if a.version is None or b.version is None or a.version == b.version:
        return a if b.version is None else b
    if a.version.split()[0] == b.version.split()[0]:
        return a if len(a.version) > len(b.version) else b
    return None


def resolve_license(name: str | None, url: str | None, use_url: bool = True) -> Resolution:
    """Read a record's licence name and (when ``use_url``) URL as described in the module
    docstring: the URL only fills an empty name, and never overrides a name."""
    name, url = (name or "").strip(), (url or "").strip() if use_url else ""
    by_name, by_url = normalize_license(name), normalize_license(url)
    if name and by_name is None:
        return Resolution(unrecognised=f"licence name {name[:200]!r}")
    if not name:
        return Resolution(by_url, unrecognised=f"licence url {url[:200]!r}" if url and by_url is None else None)
    if by_url is None or by_name is None:
        return Resolution(by_name)
    agreed = _agree(by_name, by_url)
    return Resolution(agreed) if agreed is not None else Resolution(conflict=(by_name, by_url))


def license_reason(name: str | None, url: str | None, cfg: LicenseConfig | None) -> str:
    """"" when the record may be used, else its filter reason; no config: everything passes."""
    if cfg is None:
        return ""
    if not (name or "").strip() and not (cfg.use_url and (url or "").strip()):
        return LICENSE_MISSING
    res = resolve_license(name, url, cfg.use_url)
    if res.unrecognised is not None:
        return f"{LICENSE_NOT_ALLOWED}: unrecognised {res.unrecognised}"
    allowed = cfg.allowed()
    if res.conflict is not None:
        by_name, by_url = res.conflict
        if cfg.on_conflict == "filter":
            return f"{LICENSE_CONFLICT}: name {by_name} vs url {by_url}"
        refused = [lic for lic in res.conflict if not any(lic.accepted_by(entry) for entry in allowed)]
        return f"{LICENSE_NOT_ALLOWED}: {refused[0]} (name {by_name} vs url {by_url})" if refused else ""
    found = res.found  # recognised, no conflict
    if found is not None and any(found.accepted_by(entry) for entry in allowed):
        return ""
    return f"{LICENSE_NOT_ALLOWED}: {found}"


def license_family(name: str | None, url: str | None) -> str:
    """The family a record's licence counts under in receipts: ``missing``, ``unrecognised``
    and ``conflict`` (a name and a URL that disagree) besides the families. A property of
    the input, read with its URL whatever the settings, so a partition's counts do not
    depend on settings that change no verdict (the unit's fingerprint holds verdicts)."""
    if not (name or "").strip() and not (url or "").strip():
        return "missing"
    res = resolve_license(name, url)
    if res.conflict is not None:
        return "conflict"
    return res.found.family if res.found else "unrecognised"

def license_section(lic: LicenseConfig | None, ingest_infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The receipt's licence section: the allow-list as normalised, how name/URL conflicts
    are resolved and how many input records had one, and the input records per licence
    family (what was filtered, and why, is in the counts by reason)."""
    families: Counter[str] = Counter()
    for info in ingest_infos:
        families.update(info.get("licenses", {}))
    return {"allow": [str(a) for a in lic.allowed()] if lic else None, "use_url": lic.use_url if lic else None,
            "on_conflict": lic.on_conflict if lic else None, "conflicts": families.get("conflict", 0),
            "input_by_family": dict(sorted(families.items()))}
