"""Rebuilds that are always right: a rerun into an existing output equals a fresh build.

One output folder lives through a scheduled build's history — rows appended, a caption
edited, an image's bytes replaced, rows deleted, settings and code changed, near-dedup
switched off. After each change the rerun's output must be byte for byte what a fresh
build of the same input and config writes into a new folder, and each stage must have
recomputed only the units the change affects (counted from the run's work log).

On local disk the builds run in-process (the stages' plain functions, no Dask): the same
code a flow runs, minus the scheduling, which ``test_build_e2e.py`` and the kill test below
cover. On S3 (the loopback SeaweedFS) the cases marked ``both`` run again as an operator's
scheduled build does: the source uploaded, every rerun by the ``corpusforge`` CLI in a
subprocess with a Dask worker process, so the flow process reads what another process
wrote (an s3fs listing cache once served it stale ETags, and reruns failed). The first S3
build is killed mid-run and resumed, and the append's rerun loses its worker mid-stage:
each rerun must succeed on its first attempt and equal a fresh build of the same input.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import corpusforge.version as version
from corpusforge.faults import ENV as FAULT_ENV
from corpusforge.faults import ONCE_ENV as FAULT_ONCE_ENV
from corpusforge.layout import MARKERS
from tasks.report.files import RUN_LOG
from corpusforge.plans import ACTIONS
from flows.build_corpus import BuildConfig, build, plan_run
from tests.cli_s3 import corpusforge, s3_env
from tests.output_tree import tree

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

N_SOURCE = 240     # records written by the generator
N_START = 216      # rows in the table at the first build; the rest are "appended" later
# On S3 (every rerun a CLI process): half the corpus in smaller units, no statistics.
N_SOURCE_S3, N_START_S3 = 120, 108
S3_SETTINGS = {"input": {"partition_size": 20}, "staging": {"shard_size": 12}, "reference_stats": None,
               "dask": {"n_workers": 1, "processes": True}}
COMPARED = ("staging", "features", "graph", "shards", "manifest", "stats")


def base_config(source: Path, out: Path, **changes) -> dict:
    data = {
        "source": str(source), "out": str(out),
        "input": {"partition_size": 40},
        "staging": {"shard_size": 24},
        "splits": {"shard_size": 20, "val": 0.1, "test": 0.15},
        "near_dedup": {"collision": {"fractions": [0.25, 0.5, 1.0]}},
        "reference_stats": {"splits": ["test"], "model": {
            "name": "dinov2", "arch": "vit_small_patch14_dinov2", "image_size": 28, "random_init": True}},
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


class History:
    """The source table, one output folder rerun after every change, fresh builds beside it."""

    def __init__(self, root: Path, corpus: Path, n_start: int = N_START):
        self.root = root
        self.source = root / "source"
        shutil.copytree(corpus, self.source)
        self.rows = pq.read_table(corpus / "metadata.parquet").to_pylist()
        self.out = root / "out"
        self.fresh_count = 0
        # settings the later cases keep (set by the cases that change them); a case run
        # alone starts from the first build's config
        self.base_changes: dict = {}
        self.write_rows(self.rows[:n_start])

    def write_rows(self, rows: list[dict]) -> None:
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(rows), self.source / "metadata.parquet")
        self.current = rows

    def staging_images(self) -> dict[str, str]:
        folder = self.out / MARKERS / "staging" / "tars"
        return {p.name.split(".")[0]: json.loads(p.read_text())["info"]["images"] for p in folder.glob("*.json")}

    def config(self, out: str, **changes) -> BuildConfig:
        return BuildConfig.model_validate(base_config(self.source, out, **changes))

    def rerun(self, **changes) -> dict:
        """Plan, then rerun into the lived-in folder and check the plan against what it did;
        build fresh elsewhere, assert equal bytes; return the work log."""
        self.changes = changes
        config = self.config(str(self.out), **changes)
        before = self.markers()
        plan = plan_run(config)
        assert self.markers() == before, "plan wrote under the output root"
        old_records = records_of(self.out)
        work = self.build(config)
        check_plan(plan, work, set(before), set(self.markers()))
        assert changes_of(self.out) == reference_changes(old_records, records_of(self.out))
        self.fresh_count += 1
        fresh = self.root / f"fresh-{self.fresh_count}"
        fresh_work = self.build_fresh(changes, fresh)
        got, want = tree(self.out), tree(fresh)
        assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
        assert [k for k in got if got[k] != want[k]] == []
        assert any(k.startswith("stats/") for k in got) or config.reference_stats is None
        shutil.rmtree(fresh)
        return {"rerun": work, "fresh": fresh_work}

    def markers(self) -> dict[str, tuple[int, int]]:
        return tree_with_markers(self.out)

    def build(self, config: BuildConfig) -> dict:
        """The rerun into the lived-in output: its work log."""
        return build(config)["work"]

    def build_fresh(self, changes: dict, fresh: Path) -> dict:
        """A fresh build of the same input and config into ``fresh`` (a local folder): its work log."""
        return build(self.config(str(fresh), **changes))["work"]

    def worker_lost(self, point: str) -> contextlib.AbstractContextManager:
        """The builds inside lose a Dask worker process at ``point`` (:mod:`corpusforge.faults`);
        in-process builds have none to lose (``test_worker_kills.py`` covers local clusters)."""
        return contextlib.nullcontext()


class S3History(History):
    """The same history with source and output on the loopback S3 server: every build into
    the lived-in output is ``corpusforge build`` in a subprocess (credentials only in
    ``AWS_*``, one Dask worker process), every fresh build an in-process build into its own
    S3 prefix. ``source`` and ``out`` stay local folders for the cases to edit and read:
    the source is uploaded before each build, each output mirrored back after it."""

    BUCKET = "corpusforge-matrix"

    def __init__(self, root: Path, corpus: Path, s3: dict, prefect_api: str):
        import s3fs

        self.fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True, use_listings_cache=False)
        self.fs.mkdir(self.BUCKET)
        self.uri = {"source": f"s3://{self.BUCKET}/source", "out": f"s3://{self.BUCKET}/out"}
        self.env = s3_env(s3, prefect_api)
        self.fault: dict[str, str] = {}  # CORPUSFORGE_FAULT* for the next CLI build
        super().__init__(root, corpus, N_START_S3)
        self.cli_config = root / "config.json"

    def config(self, out: str, **changes) -> BuildConfig:
        data = base_config(self.source, out, **{**S3_SETTINGS, **changes})
        return BuildConfig.model_validate({**data, "source": self.uri["source"]})

    def upload(self) -> None:
        self.fs.put(f"{self.source}/", self.uri["source"], recursive=True)

    def markers(self) -> dict[str, tuple[int, int]]:
        """Every object under the output with its size and ETag."""
        root = self.uri["out"].removeprefix("s3://")
        return {p[len(root) + 1:]: (info["size"], info["ETag"]) for p, info in self.fs.find(root, detail=True).items()}

    def mirror(self, uri: str, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.fs.get(f"{uri}/", f"{folder}/", recursive=True)

    def start_cli(self, config: BuildConfig) -> subprocess.Popen:
        data = config.model_dump(mode="json")
        for key in ("source", "out"):
            data.pop(key)
        self.cli_config.write_text(json.dumps(data))
        argv = [corpusforge(), "build", "--source", self.uri["source"], "--out", self.uri["out"],
                "--config", str(self.cli_config)]
        return subprocess.Popen(argv, env={**self.env, **self.fault}, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def build(self, config: BuildConfig) -> dict:
        proc = self.start_cli(config)
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-4000:]  # the first attempt succeeds
        self.mirror(self.uri["out"], self.out)
        return json.loads((self.out / RUN_LOG).read_text())

    def build_fresh(self, changes: dict, fresh: Path) -> dict:
        uri = f"s3://{self.BUCKET}/{fresh.name}"
        with aws_env(self.env):
            work = build(self.config(uri, **changes))["work"]
        self.mirror(uri, fresh)
        self.fs.rm(uri, recursive=True)
        return work

    def rerun(self, **changes) -> dict:
        self.upload()
        with aws_env(self.env):  # the plan and the fresh build read the server in this process
            return super().rerun(**changes)

    @contextlib.contextmanager
    def worker_lost(self, point: str):
        fired = self.root / "faults-fired"
        fired.mkdir(exist_ok=True)
        self.fault = {FAULT_ENV: f"{point}@*", FAULT_ONCE_ENV: str(fired)}
        try:
            yield
        finally:
            self.fault = {}
        assert (fired / point).exists(), f"no worker reached {point}: the fault was not injected"


@contextlib.contextmanager
def aws_env(env: dict[str, str]):
    """This process's environment with the S3 server's ``AWS_*`` settings (an in-process build)."""
    saved = {k: os.environ.get(k) for k in env if k.startswith("AWS_")}
    os.environ.update({k: env[k] for k in saved})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tree_with_markers(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time (markers and work too)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


# The plan's stages and the run log's work counts they predict.
PLAN_WORK = {"ingest": ("ingest",), "exact_dedup": ("exact_dedup",), "resolve": ("resolve",),
             "staging": ("staging",), "graph": ("graph",), "release": ("publish", "release_shards"),
             "manifest": ("publish", "manifest_parts")}
# Folders whose removed markers are the plan's deletions, per exactly planned stage.
PLAN_FOLDERS = {"ingest": "work/ingest", "resolve": "work/resolved", "staging": "staging/tars"}


def work_counts(work: dict) -> tuple[int, int]:
    """(computed, skipped) over a work log entry: counts, nested counts, or one unit's action."""
    if isinstance(work, str):
        return int(work == "computed"), int(work == "skipped")
    if isinstance(work, dict) and "computed" in work:
        return work["computed"], work["skipped"]
    pairs = [work_counts(v) for v in work.values() if isinstance(v, dict | str)] if isinstance(work, dict) else []
    return sum(c for c, _ in pairs), sum(s for _, s in pairs)


def check_plan(plan: dict, work: dict, markers_before: set[str], markers_after: set[str]) -> None:
    """What the plan said equals what the run did: exactly where every unit's action was
    known, and as a superset where a unit waits on upstream output (the run recomputes at
    least the certain ones and at most those plus the uncertain ones)."""
    maybe = ACTIONS["maybe"]
    for stage in plan["stages"]:
        name, counts = stage["stage"], stage["counts"]
        path = ("features", name.split(".", 1)[1]) if name.startswith("features.") else PLAN_WORK.get(name)
        if name == "features.removed" or path is None:
            continue
        entry = work
        for p in path:
            entry = entry.get(p, {}) if isinstance(entry, dict) else {}
        done, skipped = work_counts(entry)
        if counts[maybe] == 0 and not stage["units_may_be_added"]:
            if name in ("graph", "release", "manifest"):  # judged per stage: skipped whole, or not
                assert done == 0, (name, stage["counts"], entry)
            else:
                assert (done, skipped) == (counts["recompute"], counts["skip"]), (name, stage["counts"], entry)
        else:
            assert done >= counts["recompute"], (name, stage["counts"], entry)
            if not stage["units_may_be_added"]:
                assert done <= counts["recompute"] + counts[maybe], (name, stage["counts"], entry)
        deleted = {u["unit"] for u in stage["units"] if u["action"] == "delete"}
        folder = PLAN_FOLDERS.get(name) or (f"features/{name.split('.', 1)[1]}/vectors"
                                            if name.startswith("features.") else None)
        if folder and not stage["units_may_be_added"]:
            prefix = f"{MARKERS}/{folder}/"
            removed = {m[len(prefix):].split(".", 1)[0] for m in markers_before - markers_after
                       if m.startswith(prefix) and m.endswith(".json")}
            assert deleted == removed, (name, deleted, removed)


def records_of(root: Path) -> dict[tuple, dict]:
    """A version's records by (key, relative source path, occurrence), read with pyarrow alone: the
    independent reference for tasks/report/changes.py's DuckDB join."""
    captioned = {r["key"]: r["caption"] for p in sorted((root / "work" / "release").glob("*.parquet"))
                 for r in pq.read_table(p, columns=["key", "caption"]).to_pylist() if r["caption"] is not None}
    inputs = {(r["part"], r["row"]): r["caption"] for p in sorted((root / "work" / "resolved").glob("*.parquet"))
              for r in pq.read_table(p, columns=["part", "row", "caption"]).to_pylist()}
    rows = sorted(pq.read_table(root / "manifest").to_pylist(), key=lambda r: (r["part"], r["row"]))
    source = json.loads((root / "receipt.json").read_text())["source"].rstrip("/")
    folder = os.path.dirname(source) if source.endswith((".parquet", ".jsonl", ".csv")) else source
    seen: dict[tuple, int] = {}
    out = {}
    for r in rows:  # a record's source path counts relative to its version's source root
        ident = (r["key"], os.path.relpath(r["source_path"], folder) if r["source_path"] else None)
        seen[ident] = seen.get(ident, 0) + 1
        out[(*ident, seen[ident])] = {"status": r["status"], "reason": r["reason"], "split": r["split"],
                                      "shard": r["shard"], "sha256": r["sha256"],
                                      "caption": (r["status"] == "kept" and captioned.get(r["key"]))
                                      or inputs.get((r["part"], r["row"]))}
    return out


def reference_changes(old: dict[tuple, dict], new: dict[tuple, dict]) -> list[tuple]:
    """(key, source path, occurrence, change, changed fields, old values, new values), sorted."""
    fields = ("status", "reason", "split", "shard", "caption", "sha256")
    out = []
    for ident in sorted(set(old) | set(new), key=lambda i: (i[0] or "", i[1] or "", i[2])):
        a, b = old.get(ident), new.get(ident)
        if a is None or b is None:
            out.append((*ident, "added" if a is None else "removed", None,
                        tuple((a or {}).get(f) for f in fields), tuple((b or {}).get(f) for f in fields)))
        elif differ := [f for f in fields if a[f] != b[f]]:
            out.append((*ident, "changed", ",".join(differ), tuple(a[f] for f in fields),
                        tuple(b[f] for f in fields)))
    return out


def changes_of(root: Path) -> list[tuple]:
    """changes.parquet in the reference's shape."""
    fields = ("status", "reason", "split", "shard", "caption", "sha256")
    return [(r["key"], r["source_path"], r["occurrence"], r["change"], r["fields"],
             tuple(r[f"old_{f}"] for f in fields), tuple(r[f"new_{f}"] for f in fields))
            for r in pq.read_table(root / "changes.parquet").to_pylist()]


def computed(work: dict, *path: str) -> int:
    for p in path:
        work = work[p]
    return work["computed"] if isinstance(work, dict) else int(work == "computed")


@pytest.fixture(scope="module", params=["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.s3_matrix])])
def history(request, tmp_path_factory, prefect_server) -> History:
    from sample_corpus import write_sample_corpus

    corpus = tmp_path_factory.mktemp("matrix-corpus")
    write_sample_corpus(str(corpus), n=N_SOURCE if request.param == "local" else N_SOURCE_S3, seed=3)
    root = tmp_path_factory.mktemp(f"matrix-{request.param}")
    if request.param == "s3":
        return s3_history(S3History(root, corpus, request.getfixturevalue("s3"), prefect_server))
    h = History(root, corpus)
    config = h.config(str(h.out))
    plan = plan_run(config)
    assert not h.out.exists(), "plan created the output root"
    first = plan["stages"][:3]  # ingest, exact dedup, resolve: every unit new, nothing else certain
    assert [s["stage"] for s in first] == ["ingest", "exact_dedup", "resolve"]
    assert all(s["counts"]["recompute"] == len(s["units"]) > 0 for s in first), first
    work = build(config)["work"]
    assert computed(work, "features", "wfd") >= 6, work  # enough shards for the counts below to mean something
    return h


def s3_history(h: S3History) -> S3History:
    """The first S3 build, killed (SIGKILL to the CLI's process group) once its first staging
    shard is marked done; its rerun succeeds on the first attempt and equals a fresh build."""
    h.upload()
    config = h.config(h.uri["out"])
    proc = h.start_cli(config)
    markers = f"{h.uri['out']}/{MARKERS}/staging/tars".removeprefix("s3://")
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and not h.fs.exists(markers):
        time.sleep(0.2)
    assert proc.poll() is None, "the first build ended before staging: cannot kill it there"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not h.fs.exists(f"{h.uri['out']}/receipt.json")
    work = h.build(config)
    assert computed(work, "features", "wfd") >= 6, work
    fresh = h.root / "fresh-0"
    with aws_env(h.env):
        h.build_fresh({}, fresh)
    assert tree(h.out) == tree(fresh)
    shutil.rmtree(fresh)
    return h


def local_only(case):
    """A case of the local matrix only (the S3 matrix runs the cases an operator's scheduled
    build meets, within the suite's time budget)."""
    return pytest.mark.parametrize("history", ["local"], indirect=True)(case)


# The cases run in order on one history: each starts from the previous one's output.

@local_only
def test_unchanged_rerun_recomputes_nothing(history):
    work = history.rerun()["rerun"]
    for stage in ("ingest", "exact_dedup", "resolve", "staging"):
        assert computed(work, stage) == 0, (stage, work)
    assert computed(work, "features", "wfd") == 0 and computed(work, "graph", "queries") == 0
    assert computed(work, "publish", "release_shards") == 0 and computed(work, "publish", "manifest_parts") == 0


@local_only
def test_every_output_folder_reads_as_it_is(history):
    """Markers live outside the data folders: dataset readers and webdataset take them whole."""
    import pyarrow.dataset as ds
    import webdataset as wds

    for folder in ("graph/edges", "graph/decisions", "graph/recall", "manifest", "staging/records",
                   "staging/index", "features/wfd/keys"):
        assert ds.dataset(history.out / folder, format="parquet").count_rows() > 0, folder
    staged = sum(1 for tar in (history.out / "staging" / "tars").glob("*.tar")
                 for _ in wds.WebDataset(str(tar), shardshuffle=False))
    assert staged == ds.dataset(history.out / "staging" / "records").count_rows()
    assert sum(1 for _ in wds.WebDataset(sorted(str(p) for p in (history.out / "shards").rglob("*.tar")),
                                         shardshuffle=False)) > 0


def test_append_ten_percent_of_rows_embeds_and_queries_only_the_new_shards(history):
    before = history.staging_images()
    history.write_rows(history.rows)
    with history.worker_lost("features.start"):
        result = history.rerun()
    work, fresh = result["rerun"], result["fresh"]
    after = history.staging_images()
    changed = {s for s, d in after.items() if before.get(s) != d}
    assert 1 <= len(changed) <= 3 < len(after), (changed, len(after))
    assert computed(work, "features", "wfd") == len(changed)
    assert computed(work, "graph", "queries") == len(changed)
    assert work["images_embedded"] < 0.4 * fresh["images_embedded"], (work, fresh)


def test_edit_one_caption_recomputes_no_feature(history):
    rows = [dict(r) for r in history.current]
    target = next(r for r in rows[50:] if r.get("caption"))
    target["caption"] = target["caption"] + " (edited)"
    history.write_rows(rows)
    work = history.rerun()["rerun"]
    assert computed(work, "ingest") == 1 and computed(work, "staging") == 1
    assert computed(work, "features", "wfd") == 0 and computed(work, "graph", "queries") == 0
    assert computed(work, "publish", "release_shards") == 1
    released = [json.loads(p.read_text()) for p in (history.out / MARKERS / "shards").rglob("*.json")]
    assert released  # the caption reached a release tar (byte equality with the fresh build checks which)


def test_replace_one_images_bytes_at_the_same_path(history):
    rows = history.current
    victim = next(r for r in rows[60:] if (history.source / r["path"]).suffix in (".jpg", ".png")
                  and (history.source / r["path"]).stat().st_size > 1000)
    donor = next(r for r in rows[100:] if r["path"] != victim["path"] and (history.source / r["path"]).suffix
                 == (history.source / victim["path"]).suffix)
    path = history.source / victim["path"]
    shutil.copyfile(history.source / donor["path"], path)
    os.utime(path, ns=(time.time_ns(), time.time_ns()))
    work = history.rerun()["rerun"]
    assert computed(work, "ingest") == 1
    assert 1 <= computed(work, "features", "wfd") <= 2
    manifest = {r["key"]: r for r in pq.read_table(history.out / "manifest").to_pylist()}
    assert manifest[victim["key"]]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


@local_only
def test_replace_an_images_bytes_keeping_its_size_and_mtime(history):
    """``touch -r`` after an edit: size and mtime say nothing changed; ctime and inode do."""
    rows = history.current
    victim = next(r for r in rows[80:] if (history.source / r["path"]).suffix == ".jpg"
                  and (history.source / r["path"]).is_file())
    path = history.source / victim["path"]
    size, before = path.stat().st_size, path.stat()
    donor = next(history.source / r["path"] for r in rows if (history.source / r["path"]).suffix == ".jpg"
                 and (history.source / r["path"]).stat().st_size < size)
    data = donor.read_bytes()
    path.write_bytes(data + b"\0" * (size - len(data)))  # bytes after a JPEG's end are ignored
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == size and path.stat().st_mtime_ns == before.st_mtime_ns
    work = history.rerun()["rerun"]
    assert computed(work, "ingest") == 1
    manifest = {r["key"]: r for r in pq.read_table(history.out / "manifest").to_pylist()}
    assert manifest[victim["key"]]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_delete_rows_changes_only_the_shards_they_were_in(history):
    rows = [r for i, r in enumerate(history.current) if i not in (70, 71, 150)]
    history.write_rows(rows)
    work = history.rerun()["rerun"]
    assert 1 <= computed(work, "features", "wfd") <= 4


def test_change_partition_size_recomputes_no_feature(history):
    work = history.rerun(input={"partition_size": 100})["rerun"]
    assert computed(work, "features", "wfd") == 0 and computed(work, "graph", "queries") == 0
    assert not (history.out / "manifest" / "part-000003.parquet").exists()


@local_only
def test_change_a_validation_threshold(history):
    history.rerun(input={"partition_size": 100}, validation={"min_side": 300})


@local_only
def test_add_a_feature_model_computes_only_that_model(history):
    extra = {"name": "dinov2", "arch": "vit_small_patch14_dinov2", "image_size": 28, "random_init": True,
             "preprocessing": "dinov2_eval"}
    changes = dict(input={"partition_size": 100}, validation={"min_side": 300},
                   features={"models": [{"name": "wfd"}, extra]})
    work = history.rerun(**changes)["rerun"]
    assert computed(work, "features", "wfd") == 0 and computed(work, "graph", "queries") == 0
    [added] = [m for m in work["features"] if m != "wfd"]
    assert computed(work, "features", added) == len(history.staging_images())
    history.base_changes = changes


@local_only
def test_change_the_near_duplicate_pair_threshold_reruns_only_decisions(history):
    changes = {**history.base_changes, "near_dedup": {"pair_removal_above": 0.95,
                                                      "collision": {"fractions": [0.25, 0.5, 1.0]}}}
    work = history.rerun(**changes)["rerun"]
    assert computed(work, "graph", "queries") == 0 and computed(work, "graph", "index") == 0
    assert computed(work, "graph", "decisions") == 1
    history.base_changes = changes


@local_only
def test_change_the_split_seed_reshuffles_release_only(history):
    changes = {**history.base_changes, "splits": {"seed": 7}}
    work = history.rerun(**changes)["rerun"]
    assert computed(work, "features", "wfd") == 0 and computed(work, "graph", "queries") == 0
    assert computed(work, "publish", "release_shards") > 0
    history.base_changes = changes


@local_only
def test_edit_a_comment_in_one_stage_module_reruns_only_that_stage(history, monkeypatch, tmp_path):
    original = version._module_file

    def with_comment(module: str):
        path = original(module)
        if module != "tasks.release.shards":
            return path
        edited = tmp_path / "release.py"
        edited.write_bytes(path.read_bytes() + b"\n# a comment\n")
        return edited

    monkeypatch.setattr(version, "_module_file", with_comment)
    version.code_version.cache_clear()
    try:
        work = history.rerun(**history.base_changes)["rerun"]
    finally:
        version.code_version.cache_clear()
    assert computed(work, "publish", "release_shards") > 0
    for stage in ("ingest", "exact_dedup", "resolve", "staging"):
        assert computed(work, stage) == 0, (stage, work)
    assert all(computed(work, "features", m) == 0 for m in work["features"])
    assert computed(work, "graph", "queries") == 0 and computed(work, "graph", "decisions") == 0
    assert computed(work, "publish", "manifest_parts") == 0


@local_only
def test_change_the_staging_shard_size(history):
    history.rerun(**{**history.base_changes, "staging": {"shard_size": 50}})


@local_only
def test_switch_near_dedup_off(history):
    history.rerun(**{**history.base_changes, "near_dedup": None})
    assert not (history.out / "graph").exists() and not (history.out / "work" / "graph").exists()
    manifest = pq.read_table(history.out / "manifest").to_pylist()
    assert not any(r["status"] == "near_duplicate" for r in manifest)


@pytest.mark.scenario(1)
@pytest.mark.long
@pytest.mark.parametrize("stage_marker", ["staging/tars", "features/wfd/vectors", "shards/train"])
def test_build_killed_at_a_stage_then_rerun_equals_a_fresh_build(stage_marker, sample_corpus, tmp_path,
                                                                  prefect_server, cli):
    """SIGKILL to the CLI's whole process group once a stage has finished its first unit."""
    out = tmp_path / "killed"
    config = tmp_path / "config.yaml"
    data = base_config(sample_corpus, out, dask={"n_workers": 2, "processes": True})
    data.pop("source"), data.pop("out"), data.pop("reference_stats")
    config.write_text(json.dumps(data))
    argv = [*cli, "build", "--source", str(sample_corpus), "--out", str(out), "--config", str(config)]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PREFECT_API_URL": prefect_server})
    marker_dir = out / MARKERS / stage_marker
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None and not any(marker_dir.glob("*.json")):
        time.sleep(0.2)
    assert proc.poll() is None, f"the build ended before {stage_marker} started: cannot kill it there"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "receipt.json").exists()
    cfg = {**data, "source": str(sample_corpus), "out": str(out), "dask": {"n_workers": 1, "processes": False}}
    build(BuildConfig.model_validate(cfg))
    fresh = tmp_path / "fresh"
    build(BuildConfig.model_validate({**cfg, "out": str(fresh)}))
    assert tree(out) == tree(fresh)
    assert not [p for p in out.rglob("*.part")], "a killed writer's temp file stayed in the finished build"
