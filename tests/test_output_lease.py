"""One build per output (corpusforge/lease.py): two ``corpusforge build`` runs into one
output root, on local disk and on the loopback S3 server. The second exits 2 with one line
naming the first (host, pid, flow run, start); with ``--wait`` it waits and then succeeds.
The lease's own rules — a live holder refuses, a dead one is taken over, the lease is
given back on failure — are checked in-process on both stores."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from corpusforge.layout import OUTPUT_LEASE
from corpusforge.lease import STALE_SECONDS, OutputBusy, OutputLease, holding_output
from corpusforge.storage import Store
from tests.cli_s3 import ROOT, corpusforge, s3_env
from tests.operate import clean_env, stop

pytestmark = pytest.mark.timeout(600)

BUCKET = "corpusforge-lease"
# A quick build: no features, graph or statistics; Dask in the CLI's process.
CONFIG = {"dask": {"n_workers": 1, "processes": False}, "near_dedup": None, "features": {"models": []},
          "reference_stats": None, "input": {"partition_size": 40}, "splits": {"shard_size": 40}}


def _s3_store(s3: dict, name: str) -> Store:
    import s3fs

    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return Store(f"s3://{BUCKET}/{name}", s3)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def output(request, tmp_path, sample_corpus, prefect_server) -> dict:
    """Where the builds read and write, and the environment of their CLI processes."""
    if request.param == "local":
        return {"source": str(sample_corpus), "out": str(tmp_path / "out"), "store": Store(str(tmp_path / "out")),
                "env": clean_env(PREFECT_API_URL=prefect_server, PYTHONPATH=str(ROOT))}
    s3 = request.getfixturevalue("s3")
    store = _s3_store(s3, f"{tmp_path.name}/out")
    store.fs.put(f"{sample_corpus}/", f"{BUCKET}/{tmp_path.name}/source", recursive=True)
    return {"source": f"s3://{BUCKET}/{tmp_path.name}/source", "out": store.root, "store": store,
            "env": s3_env(s3, prefect_server)}


def _start(output: dict, config, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([corpusforge(), "build", "--source", output["source"], "--out", output["out"],
                             "--config", str(config), *extra], env=output["env"], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lease(store: Store) -> dict | None:
    return store.read_json(OUTPUT_LEASE) if store.exists(OUTPUT_LEASE) else None


@pytest.mark.long
def test_a_second_build_into_one_output_is_refused_naming_the_first_or_waits(output, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    store = output["store"]
    first = _start(output, config)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and first.poll() is None and not (_lease(store) or {}).get("flow_run"):
            time.sleep(0.2)  # the lease names the flow run once the flow has started
        holder = _lease(store)
        assert first.poll() is None and holder and holder["flow_run"], "the first build ended before its lease was seen"
        # Paused (its pid alive, its lease held) while the others start, so that on a loaded
        # machine it cannot finish before the second build has asked for the output.
        os.killpg(first.pid, signal.SIGSTOP)
        try:
            waiting = _start(output, config, "--wait")
            refused = subprocess.run([corpusforge(), "build", "--source", output["source"], "--out", output["out"],
                                      "--config", str(config)], env=output["env"], capture_output=True, text=True,
                                     timeout=120)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        assert refused.returncode == 2, refused.stderr[-3000:]
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr[-3000:]
        assert re.fullmatch(
            rf"corpusforge build: error: output root {re.escape(output['out'])} is being built by another build: "
            rf"host {re.escape(socket.gethostname())} pid {first.pid} \(flow run {re.escape(holder['flow_run'])}, "
            rf"started {holder['started']}; lease {re.escape(store.path(OUTPUT_LEASE))}\); wait for it with --wait",
            lines[0]), lines[0]
        assert re.fullmatch(r".+ \([0-9a-f-]{36}\)", holder["flow_run"]), holder  # name (id)
        _, err = first.communicate(timeout=400)
        assert first.returncode == 0, err[-3000:]
        _, err = waiting.communicate(timeout=400)
        assert waiting.returncode == 0, err[-3000:]
        assert err.startswith(f"corpusforge build: waiting for the build holding {output['out']}: host "
                              f"{socket.gethostname()} pid {first.pid}, started {holder['started']}\n"), err[:3000]
    finally:
        stop(first)
    assert _lease(store) is None  # given back at the end


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.integration])])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "out"))
    return _s3_store(request.getfixturevalue("s3"), f"{tmp_path.name}/out")


def test_a_live_holder_refuses_a_dead_one_is_taken_over_and_a_failed_build_gives_it_back(store):
    with holding_output(store, flow_run="first (1)") as held:
        with pytest.raises(OutputBusy, match=rf"host {socket.gethostname()} pid {os.getpid()} \(flow run first"):
            OutputLease(store).acquire()
        with holding_output(store) as again:  # the same process asking again reuses its lease
            assert again is held
    assert _lease(store) is None
    for holder, stale in [({"host": socket.gethostname(), "pid": _finished_pid()}, True),
                          ({"host": "elsewhere", "pid": 1, "refreshed_unix": time.time() - STALE_SECONDS - 1}, True),
                          ({"host": "elsewhere", "pid": 1, "refreshed_unix": time.time()}, False)]:
        store.write_json(OUTPUT_LEASE, {**holder, "started": "then", "token": "theirs"})
        if not stale:
            with pytest.raises(OutputBusy, match="host elsewhere pid 1 "):
                OutputLease(store).acquire()
            store.remove(OUTPUT_LEASE)
            continue
        with pytest.raises(RuntimeError, match="boom"), holding_output(store) as taker:
            assert _lease(store)["token"] == taker.holder["token"]  # taken over
            raise RuntimeError("boom")
        assert _lease(store) is None  # given back on failure too


def _finished_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_build_run_holds_its_outputs_concurrency_slot(prefect_server):
    """Deployment runs into one output queue in Prefect: a build flow run holds the slot of
    the output's global concurrency limit (created with limit 1) while it runs."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from corpusforge.cluster import output_concurrency, output_concurrency_name

    out = "s3://bucket/some/out"
    name = output_concurrency_name(out)

    def slots() -> tuple[int, int]:
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(name)
        return len(limit.active_slots) if isinstance(limit.active_slots, list) else limit.active_slots, limit.limit

    @flow
    def holding() -> tuple[int, int]:
        with output_concurrency(out):
            return slots()

    assert name == "output:s3:||bucket|some|out"
    assert holding() == (1, 1)
    assert slots() == (0, 1)
