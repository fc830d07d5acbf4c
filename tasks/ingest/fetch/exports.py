"""Adapters from the two real exports GPIC crawled to a URL list's rows (``url``, ``license``,
``license_url``, ``attribution``, ``key``, ``source``, ``source_id``, ``page_url``, ``caption``,
``sha1``): the Wikimedia Commons API's ``imageinfo`` with ``extmetadata``, and Flickr's photo
search results with the licence table the user fetched (``flickr.photos.licenses.getInfo``), so
a licence id is never mapped from a table hard-coded here alone."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Any

TAG = re.compile(r"<[^>]+>")


def plain_text(value: str | None) -> str:
    """HTML (Commons' Artist and Credit fields) as plain text: tags stripped, entities decoded."""
    return " ".join(html.unescape(TAG.sub(" ", value or "")).split())


def commons_rows(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one Commons API response page (``prop=imageinfo&iiprop=url|sha1|extmetadata``),
    in page-id order: LicenseShortName, LicenseUrl, Artist and Credit (HTML stripped) and the
    ImageDescription as caption."""
    rows = []
    pages = response.get("query", {}).get("pages", {})
    for page in sorted(pages.values() if isinstance(pages, dict) else pages, key=lambda p: p.get("pageid", 0)):
        for info in page.get("imageinfo") or []:
            meta = {k: (v or {}).get("value") for k, v in (info.get("extmetadata") or {}).items()}
            credit = [t for t in (plain_text(meta.get("Artist")), plain_text(meta.get("Credit"))) if t]
            rows.append({"url": info.get("url"), "sha1": info.get("sha1"), "page_url": info.get("descriptionurl"),
                         "source": "wikimedia", "source_id": str(page.get("pageid")),
                         "key": f"wm{page.get('pageid')}", "license": plain_text(meta.get("LicenseShortName")) or None,
                         "license_url": meta.get("LicenseUrl"), "attribution": "; ".join(credit) or None,
                         "caption": plain_text(meta.get("ImageDescription")) or None})
    return rows


def flickr_rows(photos: Iterable[dict[str, Any]], licenses: Iterable[dict[str, Any]],
                size: str = "url_o") -> list[dict[str, Any]]:
    """Rows from Flickr search results (``extras=license,owner_name,url_o,…``) and the licence
    table ``flickr.photos.licenses.getInfo`` returned (ids 0–10 and the CC 4.0 ids): each photo's
    licence id becomes that table's name and URL; an id the table lacks is left unnamed (and so
    filtered as ``license_missing``)."""
    table = {str(entry["id"]): entry for entry in licenses}
    rows = []
    for photo in photos:
        entry = table.get(str(photo.get("license")), {})
        owner = photo.get("ownername") or photo.get("owner")
        rows.append({"url": photo.get(size), "source": "flickr", "source_id": str(photo.get("id")),
                     "key": f"fl{photo.get('id')}", "license": entry.get("name"),
                     "license_url": entry.get("url") or None,
                     "attribution": f"{photo.get('title') or 'photo'} by {owner} on Flickr" if owner else None,
                     "page_url": f"https://www.flickr.com/photos/{photo.get('owner')}/{photo.get('id')}",
                     "caption": photo.get("title") or None})
    return rows
