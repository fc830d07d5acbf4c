"""The URL-list sample (``corpusforge sample --urls``): the sample corpus's images served by the
loopback hosts (``sample_corpus/http_hosts.py``) and a URL list pointing at them, spread over
four hosts (127.0.0.2–5), with a build config whose ``fetch`` section may reach loopback."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import yaml

from sample_corpus.corpus import write_sample_corpus

HOSTS = [f"127.0.0.{i}" for i in range(2, 6)]
PORT = 18733
USER_AGENT = "corpusforge-sample/1.0 (+https://example.org/corpusforge-sample; sample@example.org)"


def write_url_sample(out_dir: str, n: int = 200, seed: int = 0, port: int = PORT) -> dict:
    """Write ``files/`` (the sample corpus), ``urls.parquet``, ``hosts.json`` and ``build.yaml``
    under ``out_dir``; return the sample corpus's counts."""
    out = Path(out_dir)
    files = out / "files"
    summary = write_sample_corpus(str(files), n=n, seed=seed)
    table = pq.read_table(files / "metadata.parquet")
    paths = table.column("path").to_pylist()
    urls = [f"http://{HOSTS[i % len(HOSTS)]}:{port}/img/{quote(p or '', safe='/')}" for i, p in enumerate(paths)]
    pq.write_table(table.drop(["path"]).append_column("url", [urls]), out / "urls.parquet")
    (out / "hosts.json").write_text(json.dumps({"images": str(files.resolve()), "port": port, "latency_ms": 0,
                                                "hosts": {h: {"robots": "allow"} for h in HOSTS}}, indent=2))
    (out / "build.yaml").write_text(yaml.safe_dump({
        "fetch": {"user_agent": USER_AGENT, "allow_private_networks": True},
        "features": {"models": []}, "near_dedup": None}, sort_keys=False))
    return summary
