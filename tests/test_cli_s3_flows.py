"""The subcommands that run on a built corpus, on a real S3 server, run as users run them:
the console script in a subprocess, credentials and endpoint given once in the environment
(``AWS_*``), no key or secret in the config file, every input and output on ``s3://``.

Each run is compared with the same work done locally: the flow's function in this process
on local copies of the same inputs (the corpus is built once, locally, and copied to S3).
Data files are equal byte for byte; markers, receipts and reports once the roots they name
are replaced by their roles (see :func:`same_outputs`). Before the preflight fix (a
top-level ``retries`` in the probe's s3fs options) each of these commands stopped at exit 2.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.cli_s3 import corpusforge, hashes, local_tree, s3_env, s3_tree
from tests.s3server import ACCESS_KEY, SECRET_KEY

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(600)]

BUCKET = "corpusforge-flows"
CORPUS = f"s3://{BUCKET}/corpus"
# A tiny random-init DINOv2 (as tests/test_stats_flows.py): real code, seconds on a CPU.
DINO = {"name": "dinov2", "arch": "vit_small_patch14_dinov2", "random_init": True, "image_size": 28}
# One torch thread on both sides: float32 features differ in their last bits between thread
# counts (a Dask worker process has 1, this process as many as there are cores).
RUNTIME = {"batch_size": 16, "torch_threads": 1}
MODEL_ID = "dinov2_vits14_gpic_eval_s28"
TEXT = (".json", ".md", ".html")  # outputs that may name their roots
# work files that list input files with their stamps: an ETag on S3, size, times and inode locally
STAMPED = "work/prompts/listing/"
DIGEST = re.compile(r"\b[0-9a-f]{64}\b|\b[0-9a-f]{32}\b")  # SHA-256s and fingerprints in text files
THREADS = {"n_workers": 1, "threads_per_worker": 2, "processes": False}  # tasks in the CLI's process: no worker start
PROCESS = {"n_workers": 1, "processes": True}  # tasks (and their S3 stores) pickled to a worker process, as by default


def test_the_model_id_is_its_spec_s():
    from tasks.shared.features.config import ModelSpec

    assert ModelSpec.model_validate(DINO).model_id == MODEL_ID


@pytest.fixture(scope="module")
def env(s3, prefect_server) -> dict[str, str]:
    return s3_env(s3, prefect_server)


@pytest.fixture(scope="module")
def fs(s3):
    import s3fs

    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    fs.mkdir(BUCKET)
    return fs


def named_roots(text: str, roots: dict[str, str]) -> str:
    """``text`` with each root (longest first) replaced by its role: receipts, markers and
    reports name where they read and wrote, and that is all that may differ."""
    for root in sorted(roots, key=len, reverse=True):
        text = text.replace(root, roots[root])
    return text


def same_outputs(remote: dict[str, bytes], local: dict[str, bytes], remote_roots: dict[str, str],
                 local_roots: dict[str, str]) -> None:
    """The same files, data files with the same bytes. Text files (.json, .md, .html) are
    compared with their roots replaced by their roles and digests masked: markers and
    receipts hold digests of inputs that include their URIs; every data file those digests
    describe is compared byte for byte here. The run log (work/run/) differs by its timings, a
    listing of input files (:data:`STAMPED`) by their stamps: its other columns are compared."""
    assert sorted(remote) == sorted(local)
    for name in local:
        if name.startswith("work/run/"):
            continue
        if name.startswith(STAMPED):
            rows_a, rows_b = (pq.read_table(io.BytesIO(x)).drop_columns(["stamp"]) for x in (remote[name], local[name]))
            assert rows_a.equals(rows_b), name
            continue
        if name.endswith("receipt_outputs.parquet"):  # hashes of every output: text files name their roots
            rows_a, rows_b = (pq.read_table(io.BytesIO(x)).to_pylist() for x in (remote[name], local[name]))
            assert [r["path"] for r in rows_a] == [r["path"] for r in rows_b], name
            assert [r for r in rows_a if not r["path"].endswith(TEXT)] == \
                [r for r in rows_b if not r["path"].endswith(TEXT)], name
            continue
        a, b = remote[name], local[name]
        if name.endswith(TEXT):
            a, b = (DIGEST.sub("<digest>", named_roots(x.decode(), roots)).encode()
                    for x, roots in ((a, remote_roots), (b, local_roots)))
        assert a == b, name


def cli(command: str, config: dict[str, Any], env: dict[str, str], folder: Path) -> dict[str, Any]:
    """``corpusforge COMMAND --config c.yaml`` as a user types it; its JSON result."""
    path = folder / f"{command}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    text = path.read_text()
    assert ACCESS_KEY not in text and SECRET_KEY not in text and "storage_options" not in text  # env only
    proc = subprocess.run([corpusforge(), command, "--config", str(path)], env=env, capture_output=True, text=True,
                          timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The in-process runs on one torch thread, as the CLI runs (RUNTIME, OMP_NUM_THREADS): a
    cached model does not set its runtime's thread count again. The session's is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(sample_corpus, fs, tmp_path_factory) -> SimpleNamespace:
    """The sample corpus (160 records) built locally in this process, and the same bytes copied to S3."""
    from flows.build_corpus import BuildConfig, build

    root = tmp_path_factory.mktemp("cli-s3-flows")
    build(BuildConfig.model_validate({
        "source": str(sample_corpus), "out": str(root / "corpus"), "input": {"partition_size": 40},
        "staging": {"shard_size": 40}, "splits": {"shard_size": 20, "val": 0.1, "test": 0.15}}))
    fs.put(str(root / "corpus"), f"{BUCKET}/corpus", recursive=True)
    assert hashes(s3_tree(fs, CORPUS)) == hashes(local_tree(root / "corpus"))
    captions = {r["key"]: r["caption"] for r in pq.read_table(sample_corpus / "metadata.parquet").to_pylist()}
    return SimpleNamespace(root=root, local=root / "corpus", captions=captions)


def staging(corpus: SimpleNamespace) -> list[str]:
    from corpusforge.contract import completed_units
    from corpusforge.layout import STAGING_TARS
    from corpusforge.storage import Store

    return completed_units(Store(str(corpus.local)), STAGING_TARS, ".tar")


# ---- features, reference statistics, evaluation ----------------------------------------------

def test_extract_features(corpus, fs, env):
    from flows.extract_features import ExtractFeaturesConfig, extract

    features = {"models": [DINO], "dtype": "float32", "runtime": RUNTIME}
    result = cli("extract-features", {"corpus": CORPUS, "features": features, "dask": THREADS}, env, corpus.root)
    local = extract(ExtractFeaturesConfig.model_validate(
        {"corpus": str(corpus.local), "features": features, "dask": THREADS}))
    assert result["models"][MODEL_ID]["ok"] == local["models"][MODEL_ID]["ok"] > 100
    assert result["models"][MODEL_ID]["computed"] == local["models"][MODEL_ID]["computed"] == len(staging(corpus))
    folder = f"features/{MODEL_ID}"
    assert hashes(s3_tree(fs, f"{CORPUS}/{folder}")) == hashes(local_tree(corpus.local / folder))


def test_reference_stats(corpus, fs, env):
    from flows.reference_stats import ReferenceStatsFlowParams, reference_stats
    from tasks.stats.reference import stats_path

    settings = {"splits": ["test"], "model": DINO, "runtime": RUNTIME, "sample": {"max_rows": 50},
                "metrics": {"k": 2, "mmd_subsets": 3, "mmd_subset_size": 5}}
    result = cli("reference-stats", {"corpus": CORPUS, **settings, "dask": THREADS}, env, corpus.root)
    local = reference_stats(ReferenceStatsFlowParams.model_validate({"corpus": str(corpus.local), **settings}))
    assert result["n"] == local["n"] and result["n"]["test"] > 10
    assert result["extraction"]["models"][MODEL_ID]["skipped"] == len(staging(corpus))  # extract-features' files
    stem = stats_path("test", MODEL_ID)
    for ext in (".npz", ".features.npy"):
        assert fs.cat_file(f"{CORPUS}/{stem}{ext}") == (corpus.local / (stem + ext)).read_bytes(), ext
    side = json.loads(fs.cat_file(f"{CORPUS}/{stem}.json"))
    assert side == json.loads(named_roots((corpus.local / f"{stem}.json").read_text(), {str(corpus.local): CORPUS}))


def test_evaluate(corpus, fs, env):
    from flows.evaluate import EvaluateConfig, evaluate_flow
    from tasks.stats.reference import stats_path
    from tests.test_stats_flows import write_generated

    write_generated(corpus.root / "gen")
    fs.put(str(corpus.root / "gen"), f"{BUCKET}/gen", recursive=True)
    npz = stats_path("test", MODEL_ID) + ".npz"
    settings = {"model": DINO, "runtime": RUNTIME, "chunk_size": 3, "dask": THREADS,
                "metrics": {"k": 2, "mmd_subsets": 3, "mmd_subset_size": 5, "prdc_max_samples": None}}
    result = cli("evaluate", {"generated": [f"s3://{BUCKET}/gen"], "reference": f"{CORPUS}/{npz}",
                              "out": f"s3://{BUCKET}/eval", **settings}, env, corpus.root)
    local = evaluate_flow(EvaluateConfig.model_validate({"generated": [str(corpus.root / "gen")],
                                                         "reference": str(corpus.local / npz),
                                                         "out": str(corpus.root / "eval"), **settings}))
    assert result["generated"]["embedded"] == local["generated"]["embedded"] == 12
    assert result["generated"]["errors"] == local["generated"]["errors"] == 1  # the broken image in the tar
    assert result["metrics"] == local["metrics"] and np.isfinite(result["metrics"]["fd"])
    saved = json.loads(fs.cat_file(f"{BUCKET}/eval/metrics.json"))
    assert saved["metrics"] == local["metrics"]
    assert saved["reference"]["provenance"]["manifest_sha256"] == local["reference"]["provenance"]["manifest_sha256"]


# ---- a new corpus version, contamination, prompt qualification -----------------------------

def test_near_dedup(corpus, fs, env):
    from flows.near_dedup import NearDedupFlowParams, near_dedup

    result = cli("near-dedup", {"source": CORPUS, "out": f"s3://{BUCKET}/v2", "dask": PROCESS}, env, corpus.root)
    local = near_dedup(NearDedupFlowParams.model_validate(
        {"source": str(corpus.local), "out": str(corpus.root / "v2"), "dask": PROCESS}))
    assert result["decisions"] == local["decisions"] and result["decisions"]["images"] > 100
    same_outputs(s3_tree(fs, f"s3://{BUCKET}/v2"), local_tree(corpus.root / "v2"),
                 {CORPUS: "<source>", f"s3://{BUCKET}/v2": "<out>"},
                 {str(corpus.local): "<source>", str(corpus.root / "v2"): "<out>"})
    lineage = json.loads(fs.cat_file(f"{BUCKET}/v2/lineage.json"))
    assert lineage["derived_from"] == CORPUS
    manifest = [n for n in s3_tree(fs, f"s3://{BUCKET}/v2") if n.startswith("manifest/")]
    assert sum(pq.read_metadata(io.BytesIO(fs.cat_file(f"{BUCKET}/v2/{n}"))).num_rows for n in manifest) == 160


def test_contamination(corpus, fs, env):
    from flows.contamination import ContaminationConfig, contamination
    from tests.contamination_data import write_eval_set

    planted = write_eval_set(corpus.root / "bench", corpus.local, corpus.captions, 4, 4, 4, n_corrupt=1)
    fs.put(str(corpus.root / "bench"), f"{BUCKET}/bench", recursive=True)

    def config(corpus_root: str, bench: str, out: str) -> dict[str, Any]:
        return {"corpus": corpus_root, "out": out, "judge": {}, "dask": PROCESS,
                "eval_set": {"source": f"{bench}/bench.parquet", "text_fields": ["question", "answer"],
                             "answer_field": "answer", "category_field": "category", "chunk_size": 8}}

    result = cli("contamination", config(CORPUS, f"s3://{BUCKET}/bench", f"s3://{BUCKET}/scan"), env, corpus.root)
    local = contamination(ContaminationConfig.model_validate(
        config(str(corpus.local), str(corpus.root / "bench"), str(corpus.root / "scan"))))
    images = result["results"]["images"]
    assert (images["flagged"], images["embedded"], images["image_errors"]) == (len(planted), 12, 1)
    remote_roots = {CORPUS: "<corpus>", f"s3://{BUCKET}/bench": "<bench>", f"s3://{BUCKET}/scan": "<out>"}
    local_roots = {str(corpus.local): "<corpus>", str(corpus.root / "bench"): "<bench>",
                   str(corpus.root / "scan"): "<out>"}
    assert (named_roots(json.dumps(result, sort_keys=True), remote_roots)
            == named_roots(json.dumps(local, sort_keys=True, default=str), local_roots))
    same_outputs(s3_tree(fs, f"s3://{BUCKET}/scan"), local_tree(corpus.root / "scan"), remote_roots, local_roots)
    receipt = json.loads(fs.cat_file(f"{BUCKET}/scan/contamination/receipt.json"))
    assert receipt["corpus"]["root"] == CORPUS
    assert list(receipt["benchmark"]["input_files_sha256"]) == [f"s3://{BUCKET}/bench/bench.parquet"]


def test_qualify_prompts(corpus, fs, env):
    from flows.prompt_qualification import PromptQualificationConfig, qualify_prompts
    from tests.test_prompt_qualification import LOW_VARIANCE, _config_data, write_inputs

    inputs = write_inputs(corpus.root / "inputs")
    fs.put(str(corpus.root / "inputs"), f"{BUCKET}/inputs", recursive=True)
    on_s3 = {k: f"s3://{BUCKET}/inputs/{p.relative_to(corpus.root / 'inputs')}" for k, p in inputs.items()}
    # The text model has no thread setting and its float32 embeddings depend on torch's thread
    # count: one thread on both sides (in the CLI's process: OMP_NUM_THREADS, read by torch at start).
    cli("qualify-prompts", _config_data(CORPUS, on_s3, f"s3://{BUCKET}/qualified", dask=THREADS),
        {**env, "OMP_NUM_THREADS": "1"}, corpus.root)
    qualify_prompts(PromptQualificationConfig.model_validate(
        _config_data(corpus.local, inputs, corpus.root / "qualified", dask=THREADS)))
    same_outputs(s3_tree(fs, f"s3://{BUCKET}/qualified"), local_tree(corpus.root / "qualified"),
                 {CORPUS: "<corpus>", f"s3://{BUCKET}/inputs": "<inputs>", f"s3://{BUCKET}/qualified": "<out>"},
                 {str(corpus.local): "<corpus>", str(corpus.root / "inputs"): "<inputs>",
                  str(corpus.root / "qualified"): "<out>"})
    table = pq.read_table(io.BytesIO(fs.cat_file(f"{BUCKET}/qualified/qualification/prompts.parquet"))).to_pylist()
    flagged = {r["prompt_id"] for r in table if r["status"] == "valid" and json.loads(r["variance_flags"])}
    assert flagged == LOW_VARIANCE
