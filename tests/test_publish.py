"""Publishing a version whole, and builds that must not publish (issue 30).

A reader follows docs/release.md: it reads ``current.json`` once, then that version's
shards (``datasets.load_dataset`` on the folder, ``webdataset`` over its tars) and manifest
(``pyarrow.dataset``). Rebuilds of a finished output are killed at several points while
readers loop: every read must see exactly one version, whole. The builds run as users run
them: the CLI as a subprocess, its tasks in its own process (so a kill ends the build).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml

from corpusforge.faults import ENV, ONCE_ENV
from corpusforge.layout import CURRENT, MANIFEST_DIR, RELEASE_DIR
from tests.cli_s3 import corpusforge
from tests.operate import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

THREADS = {"n_workers": 1, "threads_per_worker": 1, "processes": False}  # a kill of the CLI ends every task


def config(source: Path, out: Path, **splits) -> dict:
    return {"source": str(source), "out": str(out), "input": {"partition_size": 40},
            "staging": {"shard_size": 40}, "features": {"models": []}, "near_dedup": None,
            "splits": {"shard_size": 20, "val": 0.1, "test": 0.15, **splits}, "dask": THREADS}


def start(cfg: dict, folder: Path, env: dict[str, str], **extra: str) -> subprocess.Popen:
    path = folder / "build.yaml"
    cfg = dict(cfg)
    argv = ["--source", cfg.pop("source"), "--out", cfg.pop("out")]
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return subprocess.Popen([corpusforge(), "build", *argv, "--config", str(path)], env={**env, **extra},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def build(cfg: dict, folder: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess:
    return finish(start(cfg, folder, env, **extra))


def kept_keys(manifest: Path) -> list[str]:
    rows = ds.dataset(manifest, format="parquet").to_table(columns=["key", "status"]).to_pylist()
    return sorted(r["key"] for r in rows if r["status"] == "kept")


def tar_keys(shards: Path) -> list[str]:
    import webdataset as wds

    tars = sorted(str(p) for p in shards.rglob("*.tar"))
    return sorted(s["__key__"] for s in wds.WebDataset(tars, shardshuffle=False))


def read_published(out: Path, cache: Path) -> str:
    """One read as docs/release.md says: the pointer once, then only its version's folders.
    Returns the version read; fails unless the tars hold exactly the manifest's kept keys."""
    from datasets import load_dataset

    pointer = json.loads((out / CURRENT).read_text())
    shards, manifest = out / pointer["shards"], out / pointer["manifest"]
    kept = kept_keys(manifest)
    assert tar_keys(shards) == kept, pointer["version"]  # sorted lists: no key missing, none twice
    loaded = load_dataset(str(shards), cache_dir=str(cache))
    assert sorted(k for split in loaded.values() for k in split["__key__"]) == kept, pointer["version"]
    assert len(kept) == pointer["samples"]
    return pointer["version"]


class Readers(threading.Thread):
    """A reader in a loop until stopped: the versions each read saw, and the first failure."""

    def __init__(self, out: Path, cache: Path):
        super().__init__(daemon=True)
        self.out, self.cache = out, cache
        self.seen: list[str] = []
        self.failure: BaseException | None = None
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set() and len(self.seen) < 200:
            try:
                self.seen.append(read_published(self.out, self.cache))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.failure = exc
                return
            self.stopped.wait(0.5)  # the builds share two cores with it


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    from sample_corpus import write_sample_corpus

    src = tmp_path_factory.mktemp("publish") / "src"
    write_sample_corpus(str(src), n=160, seed=0)
    return src


@pytest.fixture(scope="module")
def env(prefect_server) -> dict[str, str]:
    from tests.cli_s3 import ROOT

    return clean_env(PREFECT_API_URL=prefect_server, PYTHONPATH=str(ROOT))


def test_readers_see_one_whole_version_while_rebuilds_are_killed(source, env, tmp_path):
    out = tmp_path / "out"
    started = time.monotonic()
    first = build(config(source, out), tmp_path, env)
    full = time.monotonic() - started
    print(f"first build {full:.1f} s")
    assert first.returncode == 0, first.stderr[-3000:]
    old = json.loads((out / CURRENT).read_text())["version"]
    readers = Readers(out, tmp_path / "hf")
    readers.start()
    reseeded = config(source, out, seed=1)  # every release shard and manifest part changes
    fired = tmp_path / "fired"
    fired.mkdir()
    # Killed after release shard 1 (the probe's case): the working copies are a mix, which is
    # what a reader of OUT/shards and OUT/manifest saw before versions were published.
    killed = build(reseeded, tmp_path, env, **{ENV: "release.write@train-000001", ONCE_ENV: str(fired)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert tar_keys(out / RELEASE_DIR) != kept_keys(out / MANIFEST_DIR)
    assert json.loads((out / CURRENT).read_text())["version"] == old
    # Killed with the new version linked but the pointer not yet switched.
    killed = build(reseeded, tmp_path, env, **{ENV: "release.publish@*", ONCE_ENV: str(fired)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert json.loads((out / CURRENT).read_text())["version"] == old
    # Killed at random moments of further rebuilds (seeded; bounded by the first build's time).
    rng = random.Random(30)
    for _ in range(2):
        proc = start(reseeded, tmp_path, env)
        time.sleep(rng.uniform(0.2, 0.8) * full)
        proc.kill()
        proc.communicate(timeout=60)
    done = build(reseeded, tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    new = json.loads((out / CURRENT).read_text())["version"]
    deadline = time.monotonic() + 60
    while readers.is_alive() and new not in readers.seen and time.monotonic() < deadline:
        time.sleep(0.2)  # until a read sees the new version
    readers.stopped.set()
    readers.join(timeout=120)
    if readers.failure is not None:
        raise readers.failure
    assert new != old and readers.seen[0] == old and readers.seen[-1] == new, readers.seen
    assert set(readers.seen) <= {old, *(p.name for p in (out / "versions").iterdir())}
    assert read_published(out, tmp_path / "hf") == new
