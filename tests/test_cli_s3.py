"""`corpusforge build` on a real S3 server, run as users run it: the console script in a
subprocess, credentials and endpoint given once in the environment (``AWS_*``), nothing
about them in the config file.

A build from ``s3://`` to ``s3://`` equals a local build of the same input; a rerun into
the same S3 output changes nothing and recomputes nothing; storage that cannot be used is
one line naming the cause — connection refused, access denied, no such bucket — checked
by what the line says, not by its prefix (a TypeError that refused every S3 URI once
passed a prefix check).
"""

from __future__ import annotations

import json
import socket
import subprocess

import pyarrow.parquet as pq
import pytest

from corpusforge.contract import step_path
from tasks.release.files import CURRENT, VERSIONS_DIR
from tasks.report.files import CHANGES_MD, CHANGES_TABLE, PREVIOUS_DIR, RECEIPT_OUTPUTS, RUN_LOG, RUN_LOG_MD
from tasks.report.changes import DIFF_VERSIONS
from tests.cli_s3 import corpusforge, hashes, local_tree, s3_env, s3_tree
from tests.test_build_e2e import computed_units

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

CONFIG = """\
input: {partition_size: 40}
staging: {shard_size: 40}
splits: {shard_size: 20, val: 0.1, test: 0.15}
dask: {n_workers: 2, processes: true}
"""
BUCKET = "corpusforge-cli"
# Outputs that name where they were built (source and output roots): compared without those fields.
NAMES_ITS_ROOTS = {"receipt.json", "report.md", "report.html", "CHANGES.md"}


def run(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([corpusforge(), *args], env=env, capture_output=True, text=True, timeout=timeout)


def without_roots(receipt: dict) -> dict:
    for key in ("source", "out"):
        receipt["config"].pop(key)
        receipt.pop(key, None)
    receipt.pop("outputs", None)  # hashes of files compared one by one below
    receipt.pop("input_snapshot_sha256")  # of the input as listed: locations and stamps (ETag vs inode, ctime)
    return receipt


@pytest.fixture(scope="module")
def builds(s3, sample_corpus, prefect_server, tmp_path_factory):
    """The same input built locally and from S3 to S3, each by the CLI; then a rerun into S3."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    fs.mkdir(BUCKET)
    fs.put(str(sample_corpus), f"{BUCKET}/source", recursive=True)
    root = tmp_path_factory.mktemp("cli-s3")
    config = root / "c.yaml"
    config.write_text(CONFIG)
    env = s3_env(s3, prefect_server)
    local = run(["build", "--source", str(sample_corpus), "--out", str(root / "local"), "--config", str(config)], env)
    assert local.returncode == 0, local.stderr[-3000:]
    remote = run(["build", "--source", f"s3://{BUCKET}/source", "--out", f"s3://{BUCKET}/corpus",
                  "--config", str(config)], env)
    assert remote.returncode == 0, remote.stderr[-3000:]
    fs.invalidate_cache()  # the builds wrote in other processes
    first = s3_tree(fs, f"{BUCKET}/corpus")
    rerun = run(["build", "--source", f"s3://{BUCKET}/source", "--out", f"s3://{BUCKET}/corpus",
                 "--config", str(config)], env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    fs.invalidate_cache()
    again = s3_tree(fs, f"{BUCKET}/corpus")
    return {"local": local_tree(root / "local"), "s3": first, "rerun": again,
            "roots": {"local": f"{sample_corpus}/", "s3": f"s3://{BUCKET}/source/"},
            "rerun_work": json.loads(again[RUN_LOG]), "env": env, "local_root": root / "local", "fs": fs}


def manifest_rows(files: dict[str, bytes], source_root: str) -> list[dict]:
    """Every manifest row in order, ``source_path`` relative to the source root (the one
    column that says where the input lay: a local path or an ``s3://`` URI)."""
    rows = [r for name in sorted(files) if name.startswith("manifest/") and name.endswith(".parquet")
            for r in pq.read_table(pa_buffer(files[name])).to_pylist()]
    for r in rows:
        r["source_path"] = (r["source_path"] or "").removeprefix(source_root)
    return rows


def test_s3_to_s3_build_equals_the_local_build(builds):
    # The published version's name digests its files, the manifest (which names the source) too.
    local, remote = (unversioned(builds[b]) for b in ("local", "s3"))
    assert sorted(remote) == sorted(local)
    # Byte for byte: everything but what names the roots (receipt, reports, the manifest's
    # source_path and so the output list's hashes of those files and the version's name) and
    # the run's own records.
    rooted = {n for n in local if n in NAMES_ITS_ROOTS or n.startswith(("manifest/", f"{VERSIONS_DIR}/v/manifest/"))
              or n in (RECEIPT_OUTPUTS, CURRENT)}
    pointers = [json.loads(t[CURRENT]) for t in (local, remote)]
    assert [p["shards"] for p in pointers] == [f"{VERSIONS_DIR}/{p['version']}/shards" for p in pointers]
    for files in (local, remote):  # the published version is the working copies, whole (server-side copies on S3)
        released = {n: b for n, b in files.items() if n.startswith(("shards/", "manifest/"))}
        assert {n: files[f"{VERSIONS_DIR}/v/{n}"] for n in released} == released
    same = {n for n in local if n not in rooted and not n.startswith(("work/", "_markers/"))}
    assert {n: h for n, h in hashes(remote).items() if n in same} == {n: h for n, h in hashes(local).items() if n in same}
    rows = manifest_rows(local, builds["roots"]["local"])
    assert len(rows) == 160 and rows == manifest_rows(remote, builds["roots"]["s3"])
    assert all(not r["source_path"].startswith(("/", "s3://")) for r in rows)
    listed = [pq.read_table(pa_buffer(t[RECEIPT_OUTPUTS])).to_pylist() for t in (local, remote)]
    assert [r["path"] for r in listed[0]] == [r["path"] for r in listed[1]]
    assert [r for r in listed[0] if r["path"] in same] == [r for r in listed[1] if r["path"] in same]
    ra, rb = (without_roots(json.loads(t["receipt.json"])) for t in (local, remote))
    assert ra == rb


def unversioned(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` with the published version's folder named ``versions/v``."""
    version = json.loads(files[CURRENT])["version"]
    return {n.replace(f"{VERSIONS_DIR}/{version}/", f"{VERSIONS_DIR}/v/", 1): b for n, b in files.items()}


def test_rerun_into_the_same_s3_output_equals_it_and_recomputes_nothing(builds):
    first, again = builds["s3"], dict(builds["rerun"])
    changes = pq.read_table(pa_buffer(again.pop(CHANGES_TABLE)))  # against the version the root held
    account = again.pop(CHANGES_MD).decode()
    assert changes.num_rows == 0 and "Records: 0 added, 0 removed, 0 changed" in account
    assert "0 rewritten, 0 added, 0 removed" in account  # release shards
    kept = [f"{PREVIOUS_DIR}/receipt.json", f"{PREVIOUS_DIR}/records.parquet",  # each build keeps its version
            f"{PREVIOUS_DIR}/receipt_outputs.parquet"]
    assert set(kept) <= set(first)
    assert sorted(again) == sorted([*first, step_path(DIFF_VERSIONS.name)])  # the diff: a first build has none
    assert {n for n in first if first[n] != again[n]} <= {RUN_LOG, RUN_LOG_MD}  # the stage times of this run
    assert computed_units(builds["rerun_work"]) == {} and builds["rerun_work"]["images_embedded"] == 0


def test_diff_between_a_local_and_an_s3_version_reads_and_writes_s3(builds):
    """`corpusforge diff` of the local build (old) and the S3 build (new) of the same input,
    written to S3: no record, shard or licence count differs (where the input lay is not a
    change of the corpus)."""
    out = f"s3://{BUCKET}/diff"
    result = run(["diff", str(builds["local_root"]), f"s3://{BUCKET}/corpus", "--out", out], builds["env"])
    assert result.returncode == 0, result.stderr[-3000:]
    fs = builds["fs"]
    fs.invalidate_cache()
    account = fs.cat_file(f"{BUCKET}/diff/{CHANGES_MD}").decode()
    assert "Records: 0 added, 0 removed, 0 changed" in account and "0 rewritten, 0 added, 0 removed" in account
    assert pq.read_table(pa_buffer(fs.cat_file(f"{BUCKET}/diff/{CHANGES_TABLE}"))).num_rows == 0


def pa_buffer(data: bytes):
    import pyarrow as pa

    return pa.BufferReader(data)


# ---- storage that cannot be used: one line, exit 2, the cause named ------------------------

def closed_port() -> int:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("corpusforge build: error: ")
    return lines[0]


@pytest.mark.scenario(14)
def test_dead_endpoint_names_the_refused_connection(s3, prefect_server, tmp_path):
    env = s3_env(s3, prefect_server, AWS_ENDPOINT_URL=f"http://127.0.0.1:{closed_port()}")
    line = one_line_error(run(["build", "--source", f"s3://{BUCKET}/source", "--out", str(tmp_path / "o")], env))
    assert "cannot reach the storage of source" in line and "connection refused" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.scenario(14)
def test_wrong_keys_name_access_denied(s3, prefect_server, sample_corpus, tmp_path):
    env = s3_env(s3, prefect_server, AWS_SECRET_ACCESS_KEY="not-the-secret")
    line = one_line_error(run(["build", "--source", str(sample_corpus), "--out", f"s3://{BUCKET}/denied"], env))
    assert f"output root s3://{BUCKET}" in line and "access denied" in line
    assert "SignatureDoesNotMatch" in line or "signature" in line.lower()


@pytest.mark.scenario(14)
def test_missing_bucket_is_named(s3, prefect_server, sample_corpus):
    env = s3_env(s3, prefect_server)
    line = one_line_error(run(["build", "--source", str(sample_corpus), "--out", "s3://no-such-bucket/corpus"], env))
    assert "no such bucket s3://no-such-bucket" in line
