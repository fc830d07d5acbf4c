"""Every user error of the CLI is one clear line on stderr and exit code 2, printed before
any Prefect server or Dask cluster starts, with nothing written; and `corpusforge doctor`."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import resource
import time
from pathlib import Path

import pytest

from flows.cli import main


@pytest.fixture
def no_server_or_cluster(monkeypatch):
    """Starting a Prefect server or a Dask cluster fails the test."""
    import corpusforge.cluster as cluster

    def refuse(*_args, **_kwargs):
        raise AssertionError("a server or cluster was started before the user error was reported")

    monkeypatch.setattr(cluster, "prefect_api", refuse)
    monkeypatch.setattr(cluster, "task_runner", refuse)


@pytest.fixture
def source(tmp_path) -> Path:
    """A tiny valid source: one image in a folder."""
    from PIL import Image

    folder = tmp_path / "source"
    folder.mkdir()
    Image.new("RGB", (300, 300), (10, 20, 30)).save(folder / "a.jpg")
    return folder


def run_cli(capsys, args: list[str], out: Path | None = None) -> str:
    """Run the CLI in-process; assert the user-error contract; return the line."""
    before = sorted(out.parent.rglob("*")) if out is not None else None
    code = main(args)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert code == 2 and captured.out == ""
    assert lines[0].startswith(f"corpusforge {args[0]}: error: ")
    if out is not None:
        assert not out.exists(), "nothing is written"
        assert sorted(out.parent.rglob("*")) == before
    return lines[0]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.scenario(14)
def test_missing_argument_is_one_line(capsys, no_server_or_cluster):
    with pytest.raises(SystemExit) as info:
        main(["build", "--out", "x"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["corpusforge build: error: the following arguments are required: --source "
                   "(see corpusforge build --help)"]


@pytest.mark.scenario(14)
def test_missing_config_file(capsys, no_server_or_cluster, source, tmp_path):
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"),
                            "--config", str(tmp_path / "nope.yaml")], tmp_path / "o")
    assert "nope.yaml not found" in line


@pytest.mark.scenario(14)
def test_bad_yaml(capsys, no_server_or_cluster, source, tmp_path):
    cfg = write(tmp_path / "c.yaml", "splits: {val: 0.1\n  test: [\n")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert "not valid YAML at line" in line


@pytest.mark.scenario(14)
def test_unknown_key(capsys, no_server_or_cluster, source, tmp_path):
    cfg = write(tmp_path / "c.yaml", "splits: {shard_sise: 10}\n")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert "unknown key splits.shard_sise" in line and "shard_size" in line


@pytest.mark.scenario(14)
def test_wrong_type(capsys, no_server_or_cluster, source, tmp_path):
    cfg = write(tmp_path / "c.yaml", "staging: {shard_size: ten}\n")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert "staging.shard_size" in line and "'ten'" in line


@pytest.mark.scenario(14)
def test_missing_source(capsys, no_server_or_cluster, tmp_path):
    line = run_cli(capsys, ["build", "--source", str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
                   tmp_path / "o")
    assert "does not exist" in line and "metadata table" in line


@pytest.mark.scenario(14)
def test_output_inside_source(capsys, no_server_or_cluster, source):
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(source / "corpus")], source / "corpus")
    assert "overlaps the source" in line


@pytest.mark.scenario(14)
def test_unreachable_storage(capsys, no_server_or_cluster, source, tmp_path):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = write(tmp_path / "c.yaml", "storage_options: {key: k, secret: s, client_kwargs: "
                "{endpoint_url: 'http://127.0.0.1:%d'}}\n" % port)
    started = time.monotonic()
    line = run_cli(capsys, ["build", "--source", str(source), "--out", "s3://bucket/corpus", "--config", cfg])
    assert "cannot reach the storage of output root" in line and "connection refused" in line  # the cause, not a prefix
    assert time.monotonic() - started < 60


@pytest.mark.scenario(14)
def test_storage_without_credentials_says_so(capsys, no_server_or_cluster, source, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no lookup of an instance's role off this machine
    cfg = write(tmp_path / "c.yaml", "storage_options: {client_kwargs: {endpoint_url: 'http://127.0.0.1:9'}}\n")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", "s3://bucket/corpus", "--config", cfg])
    assert "output root s3://bucket" in line and "no credentials found" in line


def _learned_model_config(tmp_path: Path, weights: str) -> str:
    return write(tmp_path / "c.yaml", "features:\n  models:\n    - {name: wfd}\n"
                 f"    - {{name: sscd_disc_mixup{weights}}}\n")


@pytest.mark.scenario(14)
def test_missing_weights_file(capsys, no_server_or_cluster, source, tmp_path):
    cfg = _learned_model_config(tmp_path, f", weights: {{uri: '{tmp_path / 'sscd.pt'}', sha256: '{'0' * 64}'}}")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert "weights of sscd_disc_mixup refused" in line and "not found" in line


@pytest.mark.scenario(14)
def test_refused_weights_hash(capsys, no_server_or_cluster, source, tmp_path):
    (tmp_path / "sscd.pt").write_bytes(b"not the pinned bytes")
    cfg = _learned_model_config(tmp_path, f", weights: {{uri: '{tmp_path / 'sscd.pt'}', sha256: '{'0' * 64}'}}")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert "refused" in line and "does not match" in line


@pytest.mark.scenario(14)
def test_torchscript_not_allow_listed(capsys, no_server_or_cluster, source, tmp_path):
    data = b"pretend torchscript"
    (tmp_path / "sscd.pt").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    cfg = _learned_model_config(tmp_path, f", weights: {{uri: '{tmp_path / 'sscd.pt'}', sha256: '{sha}', "
                                          "format: torchscript}")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert "TorchScript is executable" in line and "torchscript_allowlist" in line


@pytest.mark.scenario(14)
def test_learned_model_without_weights(capsys, no_server_or_cluster, source, tmp_path):
    cfg = _learned_model_config(tmp_path, "")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert "has no weights" in line and "random_init" in line


@pytest.mark.scenario(14)
def test_flow_command_on_a_missing_corpus(capsys, no_server_or_cluster, tmp_path):
    cfg = write(tmp_path / "c.yaml", f"corpus: {tmp_path / 'nothing'}\n")
    line = run_cli(capsys, ["extract-features", "--config", cfg])
    assert line.startswith("corpusforge extract-features: error: corpus") and "does not exist" in line


@pytest.mark.scenario(14)
def test_the_issues_example_as_a_user_types_it(tmp_path, cli):
    """`corpusforge build --source /missing --out o`: one line, exit 2, no `o`, in seconds of
    CPU (wall time on a loaded machine says nothing about the command)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([*cli, "build", "--source", "/missing", "--out", "o"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "corpusforge build: error: source /missing does not exist: give a metadata table (.parquet/.jsonl/.csv), "
        "a folder of tars or a folder of images"]
    assert proc.stdout == "" and not (tmp_path / "o").exists()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 20


def test_doctor_reports_this_machine(capsys, tmp_path):
    cfg = write(tmp_path / "c.yaml", "features:\n  models:\n    - {name: wfd}\n"
                "    - {name: dinov2, arch: vit_small_patch14_dinov2, random_init: true}\n"
                "dask: {address: 'tcp://127.0.0.1:1'}\n")
    assert main(["doctor", "--config", cfg]) == 0
    out = capsys.readouterr().out
    for name in ("Python", "torch", "CUDA devices", "FAISS", "prefect", "Prefect API", "Dask scheduler"):
        assert any(line.startswith(name) for line in out.splitlines()), (name, out)
    assert "CPU build" in out or "GPU build" in out
    assert "RANDOM INIT" in out and "weight-free" in out
    assert "tcp://127.0.0.1:1: NOT REACHABLE" in out


def _empty_source(kind: str, tmp_path: Path) -> Path:
    """An input that holds no record, of each kind a user may give."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind == "folder":
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "sub").mkdir()
        return tmp_path / "empty"
    path = tmp_path / f"metadata.{kind.split('-')[0]}"
    if kind == "csv-header":
        path.write_text("key,path,caption\n")
    elif kind == "csv":
        path.write_text("")
    elif kind == "jsonl":
        path.write_text("\n\n")
    else:
        pq.write_table(pa.table({"key": pa.array([], pa.string()), "path": pa.array([], pa.string())}), path)
    return path


@pytest.mark.scenario(14)
@pytest.mark.parametrize("kind", ["folder", "csv-header", "csv", "jsonl", "parquet"])
def test_empty_source_is_a_user_error(capsys, no_server_or_cluster, tmp_path, kind):
    src = _empty_source(kind, tmp_path)
    line = run_cli(capsys, ["build", "--source", str(src), "--out", str(tmp_path / "o")], tmp_path / "o")
    assert f"corpusforge build: error: source {src}" in line
    assert "no input records" in line or "not a readable table" in line


@pytest.mark.scenario(14)
def test_empty_source_from_the_command_line(tmp_path, cli):
    """A header-only CSV as a user types it: one line, exit 2, nothing written, in seconds of
    CPU (counted, not timed: on a loaded machine the wall clock says little; a Prefect server
    or a Dask cluster would cost far more)."""
    src = _empty_source("csv-header", tmp_path)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([*cli, "build", "--source", str(src), "--out", "o"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"corpusforge build: error: source {src} holds no input records (table {src} has no rows): nothing to "
        "build; give a table with rows, a folder of tars or a folder of images"]
    assert proc.stdout == "" and not (tmp_path / "o").exists()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 20


@pytest.mark.scenario(14)
@pytest.mark.parametrize(("command", "config", "cause"), [
    ("near-dedup", "source: {corpus}\nout: {corpus}/v2\n", "overlaps the source corpus"),
    ("contamination", "corpus: {corpus}\nout: {corpus}/scan\n", "overlaps the corpus"),
])
def test_output_inside_what_a_flow_reads(capsys, no_server_or_cluster, tmp_path, command, config, cause):
    """Every flow's preflight refuses an output root inside what it reads (one check,
    corpusforge.storage.require_separate), before anything starts."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    cfg = write(tmp_path / "c.yaml", config.format(corpus=corpus))
    line = run_cli(capsys, [command, "--config", cfg], corpus / "x")
    assert cause in line


@pytest.mark.parametrize("setting, where", [
    ("near_dedup: {pair_removal_above: 2.5}", "near_dedup.pair_removal_above"),
    ("near_dedup: {component_link_above: 1.5}", "near_dedup.component_link_above"),
    ("near_dedup: {collision: {thresholds: [0.5, 1.5]}}", "near_dedup.collision.thresholds.1"),
    ("near_dedup: {calibration: {bins: [[0.9, 1.2]]}}", "near_dedup.calibration.bins.0.1"),
])
def test_a_similarity_threshold_outside_minus_one_to_one_is_one_line(capsys, no_server_or_cluster, source, tmp_path,
                                                                     setting, where):
    """No cosine similarity reaches 2.5: a threshold there would silently remove nothing."""
    cfg = write(tmp_path / "c.yaml", setting + "\n")
    line = run_cli(capsys, ["build", "--source", str(source), "--out", str(tmp_path / "o"), "--config", cfg],
                   tmp_path / "o")
    assert f"{where}: Input should be " in line and ("less than or equal to 1" in line
                                                     or "greater than or equal to -1" in line), line
