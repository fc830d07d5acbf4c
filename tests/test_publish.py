"""Publishing a version whole, and builds that must not publish (issue 30).

A reader follows docs/release.md: it reads ``current.json`` once, then that version's
shards (``datasets.load_dataset`` on the folder, ``webdataset`` over its tars) and manifest
(``pyarrow.dataset``). Rebuilds of a finished output are killed at several points while
readers loop: every read must see exactly one version, whole. The builds run as users run
them: the CLI as a subprocess, its tasks in its own process (so a kill ends the build).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml

from corpusforge.faults import ENV, ONCE_ENV
from corpusforge.layout import MANIFEST_DIR
from tasks.release.files import CURRENT, RELEASE_DIR
from tasks.report.files import CHANGES_MD
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
            self.stopped.wait(1)  # the builds share two cores with it


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


@pytest.mark.long
def test_readers_see_one_whole_version_while_rebuilds_are_killed(source, env, tmp_path):
    from flows.build_corpus import BuildConfig, build as build_in_process

    out = tmp_path / "out"
    old = build_in_process(BuildConfig.model_validate(config(source, out)))["published"]["version"]  # the first version
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
    # Killed at a random moment of a further rebuild (seeded).
    proc = start(reseeded, tmp_path, env)
    time.sleep(random.Random(30).uniform(2, 12))  # a CLI rebuild here takes 15-30 s
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
    assert len(readers.seen) >= 5, readers.seen
    assert set(readers.seen) <= {old, *(p.name for p in (out / "versions").iterdir())}
    assert read_published(out, tmp_path / "hf") == new


# ---- diff and CHANGES.md count the release shards ------------------------------------------


def tars(out: Path) -> dict[str, str]:
    """SHA-256 per release tar, read from the files themselves (the oracle)."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((out / RELEASE_DIR).rglob("*.tar"))}


def shard_line(old: dict[str, str], new: dict[str, str]) -> str:
    rewritten = sum(1 for p in set(old) & set(new) if old[p] != new[p])
    return f"{rewritten} rewritten, {len(set(new) - set(old))} added, {len(set(old) - set(new))} removed."


def test_diff_and_changes_count_rewritten_added_and_removed_shards(source, tmp_path, cli):
    """One output rebuilt after an append, a caption edit and a deletion; after each,
    ``corpusforge diff`` of the copy kept before and the rebuilt root, and the root's own
    CHANGES.md, count exactly the tars whose bytes changed, appeared and went."""
    from flows.build_corpus import BuildConfig, build

    src = tmp_path / "src"
    shutil.copytree(source, src)
    rows = pq.read_table(source / "metadata.parquet").to_pylist()
    out = tmp_path / "out"
    cfg = BuildConfig.model_validate({**config(src, out), "dask": {}})

    def rebuild(table: list[dict]) -> tuple[str, str, str]:
        old = tmp_path / f"old-{len(list(tmp_path.glob('old-*')))}"
        shutil.copytree(out, old)
        pq.write_table(pa.Table.from_pylist(table), src / "metadata.parquet")
        build(cfg)
        diff = subprocess.run([*cli, "diff", str(old), str(out), "--out", str(tmp_path / "diff")],
                              capture_output=True, text=True, timeout=300)
        assert diff.returncode == 0, diff.stderr[-3000:]
        return (shard_line(tars(old), tars(out)), (tmp_path / "diff" / CHANGES_MD).read_text(),
                (out / CHANGES_MD).read_text())

    pq.write_table(pa.Table.from_pylist(rows[:120]), src / "metadata.parquet")
    build(cfg)
    appended = rebuild(rows)
    key = kept_keys(out / MANIFEST_DIR)[0]
    edited = rebuild([{**r, "caption": r["caption"] + " Edited."} if r["key"] == key else r for r in rows])
    deleted = rebuild(rows[40:])
    for (line, *accounts), expect in ((appended, ("added",)), (edited, ()), (deleted, ("removed",))):
        for account in accounts:
            assert f"\n{line}\n" in account, (line, account)
        counts = dict(zip(("rewritten", "added", "removed"), (int(w) for w in line.split()[::2])))
        assert counts["rewritten"] > 0 and all(counts[k] > 0 for k in expect), line
    assert edited[0] == "1 rewritten, 0 added, 0 removed."  # the one tar holding the caption


# ---- a release that must not be published ----------------------------------------------------


def test_an_empty_release_fails_in_one_line_and_publishes_nothing(env, tmp_path):
    """Three images without licences: all filtered. Today's rc 0 with ``{"filtered": 3}``
    published an empty corpus; now the build exits 1 with one line, and the receipt says why."""
    from PIL import Image

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        Image.new("RGB", (64, 64), (40 * i, 90, 200)).save(src / f"{i}.png")
    cfg = config(src, tmp_path / "out")
    proc = build(cfg, tmp_path, env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (  # the flow's log (the detail) comes before it
        "corpusforge build: error: the release would be empty: no input record was kept (the receipt counts them by "
        f"reason); not published: no version of {tmp_path / 'out'} is published")
    assert 'flows/cli.py", line' not in proc.stderr, proc.stderr[-3000:]
    receipt = json.loads((tmp_path / "out" / "receipt.json").read_text())
    assert receipt["refused"].startswith("the release would be empty") and receipt["counts"]["by_status"] == {
        "filtered": 3}
    assert not (tmp_path / "out" / CURRENT).exists() and not (tmp_path / "out" / "versions").exists()


def test_a_shrinking_release_is_refused_and_the_previous_version_stays(source, tmp_path):
    from flows.build_corpus import BuildConfig, build as build_in_process
    from tasks.release.versions import ReleaseRefused

    src = tmp_path / "src"
    shutil.copytree(source, src)
    rows = pq.read_table(source / "metadata.parquet").to_pylist()
    out = tmp_path / "out"
    cfg = {**config(src, out), "dask": {}}
    build_in_process(BuildConfig.model_validate(cfg))
    before = json.loads((out / CURRENT).read_text())
    pq.write_table(pa.Table.from_pylist(rows[:60]), src / "metadata.parquet")
    with pytest.raises(ReleaseRefused) as refused:
        build_in_process(BuildConfig.model_validate(cfg))
    shrunk = kept_keys(out / MANIFEST_DIR)
    assert str(refused.value) == (
        f"the release would shrink from {before['samples']} to {len(shrunk)} samples "
        f"({1 - len(shrunk) / before['samples']:.0%} fewer; splits.max_shrink allows 50%); not published: "
        f"{out / CURRENT} still names version {before['version']}")
    assert json.loads((out / "receipt.json").read_text())["refused"] == str(refused.value).split("; not")[0]
    assert json.loads((out / CURRENT).read_text()) == before
    assert read_published(out, tmp_path / "hf") == before["version"]  # whole, as published
    cfg["splits"] = {**cfg["splits"], "max_shrink": 0.8}  # the operator allows it
    assert build_in_process(BuildConfig.model_validate(cfg))["published"]["samples"] == len(shrunk)
