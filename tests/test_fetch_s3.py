"""A URL-list build on S3, as users run it: ``corpusforge build`` in a subprocess, its output and
its ``fetch.store`` in SeaweedFS on loopback, the images from the loopback hosts (which count
every request). Host units, the outcomes kept in the store and the ledgers all go through S3."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from urllib.parse import quote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.cli_s3 import corpusforge, hashes, s3_env, s3_tree
from tests.http_hosts import write_images

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1200)]

BUCKET = "corpusforge-fetch"
UA = "corpusforge/1.0 (+https://example.org/bot; bot@example.org)"
CLOCK = "2026-01-02T03:04:05Z"
A, B = "127.0.0.70", "127.0.0.71"  # B's robots.txt disallows img3.jpg


def _rows(h, n: int) -> tuple[list[dict], dict[str, str]]:
    """``n`` URL rows (every one past the planted cases an image on A or B) and each key's
    expected outcome (status/reason-code)."""
    plan = [("nolicence", h.url(A, "/img/img0.jpg"), "filtered/license_not_allowed"),
            ("gone", h.url(A, "/status/404/x"), "error/http_status"),
            ("noai", h.url(A, "/xrobots/noai/img1.jpg"), "filtered/opted_out"),
            ("robotsno", h.url(B, "/img/img3.jpg"), "filtered/robots_disallowed"),
            ("metadata", h.url(A, "/to/" + quote("http://169.254.169.254/", safe="")), "error/blocked_address"),
            ("html", h.url(A, "/html/x"), "error/not_an_image")]
    plan += [(f"ok{i}", h.url((A, B)[i % 2], f"/img/img{i}.jpg"), "kept") for i in range(4, 4 + n - len(plan))]
    rows = [{"key": k, "url": u, "license": "All rights reserved" if k == "nolicence" else "CC BY 4.0",
             "license_url": "https://creativecommons.org/licenses/by/4.0/", "attribution": f"author of {k}",
             "caption": f"a photo {k}"} for k, u, _ in plan]
    return rows, {k: want for k, _, want in plan}


def _build(env: dict[str, str], folder: Path, rows: list[dict], out: str, store: str) -> None:
    """``corpusforge build`` over ``rows`` (a local URL list) into ``out``, fetching into ``store``."""
    source = folder / f"urls-{len(rows)}" / "urls.parquet"
    source.parent.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), source)
    config = folder / f"{out.rsplit('/', 1)[1]}.yaml"
    config.write_text(yaml.safe_dump({
        "fetch": {"user_agent": UA, "allow_private_networks": True, "store": store, "retries": 0, "threads": 4},
        "input": {"partition_size": 8}, "validation": {"min_side": 1}, "features": {"models": []},
        "near_dedup": None, "eval_captions": None, "splits": {"val": 0, "test": 0, "shard_size": 50},
        "dask": {"n_workers": 2}}))
    proc = subprocess.run([corpusforge(), "build", "--source", str(source), "--out", out, "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _paths(rows: list[dict]) -> list[str]:
    return sorted(urlsplit(r["url"]).path for r in rows)


def _images_asked(h) -> list[str]:
    """The image paths requested (once each: a URL asked twice shows twice)."""
    return sorted(p for reqs in h.seen()["requests"].values() for p, _ in reqs if p.startswith("/img/"))


def _outputs(fs, root: str) -> dict[str, str]:
    """The SHA-256 of every manifest and shard file under ``root``."""
    fs.invalidate_cache()  # written by other processes
    return hashes({name: data for name, data in s3_tree(fs, root).items() if name.startswith(("manifest/", "shards/"))})


def test_url_list_build_on_s3_fetches_once_and_a_grown_export_only_its_new_urls(
        tmp_path, s3, prefect_server, http_hosts):
    import s3fs

    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    fs.mkdir(BUCKET)
    env = s3_env(s3, prefect_server, CORPUSFORGE_FETCH_CLOCK=CLOCK)
    out, store = f"s3://{BUCKET}/corpus", f"s3://{BUCKET}/store"
    write_images(tmp_path / "images", 28)
    hosts = {A: {"robots": "allow"}, B: {"robots": "disallow:/img/img3.jpg"}}
    with http_hosts(tmp_path, hosts, tmp_path / "images", latency_ms=5) as h:
        rows, want = _rows(h, 16)
        _build(env, tmp_path, rows, out, store)
        fs.invalidate_cache()
        manifest = [r for name, data in s3_tree(fs, out).items() if name.startswith("manifest/")
                    for r in pq.read_table(io.BytesIO(data)).to_pylist()]
        assert {r["key"]: f"{r['status']}/{r['reason'].split(':')[0]}" if r["reason"] else r["status"]
                for r in manifest} == want and len(manifest) == len(rows)
        assert fs.find(f"{BUCKET}/store/fetch/blobs") and not fs.exists(f"{BUCKET}/corpus/fetch")

        h.reset()  # a rerun: every outcome (and each origin's robots.txt) is in the store
        _build(env, tmp_path, rows, out, store)
        assert not h.seen()["requests"]

        h.reset()  # the export grew by a partition: only its URLs are requested
        grown, _ = _rows(h, 24)
        _build(env, tmp_path, grown, out, store)
        assert _images_asked(h) == _paths(grown[len(rows):])

        h.reset()  # a fresh build of the grown export, with its own store: the same manifest and shards
        _build(env, tmp_path, grown, f"s3://{BUCKET}/fresh", f"s3://{BUCKET}/fresh-store")
        assert _images_asked(h) == _paths([r for r in grown if r["key"].startswith("ok")])
    assert _outputs(fs, out) == _outputs(fs, f"s3://{BUCKET}/fresh")
