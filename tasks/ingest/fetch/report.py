"""The receipt's ``fetch`` section: a URL list's outcomes by reason and the figures per host
(URLs requested, requests, bytes received, 429 answers, seconds waited), summed over the fetch
units' markers (each unit keeps its own; nothing is re-read)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any


def fetch_section(infos: list[dict[str, Any]]) -> dict[str, Any]:
    by_outcome: Counter[str] = Counter()
    hosts: dict[str, Counter[str]] = defaultdict(Counter)
    waited: Counter[str] = Counter()
    for info in infos:
        by_outcome.update(info["by_outcome"])
        for host, figures in info["hosts"].items():
            hosts[host].update({k: v for k, v in figures.items() if k != "seconds_waited"})
            waited[host] += figures["seconds_waited"]
    return {"urls": sum(i["urls"] for i in infos), "fetched": sum(i["fetched"] for i in infos),
            "pending": sum(i["pending"] for i in infos), "by_outcome": dict(sorted(by_outcome.items())),
            "hosts": {h: {**dict(sorted(c.items())), "seconds_waited": round(waited[h], 1)}
                      for h, c in sorted(hosts.items())}}
