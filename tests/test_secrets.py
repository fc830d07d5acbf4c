"""Credentials never travel as flow parameters: the server's copy of every flow run holds no
key; Secret blocks named in the config are resolved inside the run; a run whose parameters
carry a key refuses to start; and the output root's options apply to everything under it
(OUT/work/input included), with nothing repeated under input.storage_options."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from corpusforge.secrets import (find_secrets, held_secrets, refuse_inline_secrets, split_secrets,
                                 with_secrets)
from flows.build_corpus import BuildConfig

OPTIONS = {"key": "AKIAEXAMPLEKEYID", "secret": "very-secret-value",
           "client_kwargs": {"endpoint_url": "http://127.0.0.1:1", "region_name": "us-east-1"}}


def test_split_and_restore():
    config = BuildConfig(source="s3://b/src", out="s3://b/out", storage_options=OPTIONS)
    public, secrets = split_secrets(config)
    assert set(secrets) == {("storage_options", "key"), ("storage_options", "secret")}
    dumped = json.dumps(public.model_dump(mode="json"))
    assert "AKIAEXAMPLEKEYID" not in dumped and "very-secret-value" not in dumped
    assert public.storage_options["client_kwargs"] == OPTIONS["client_kwargs"]
    with held_secrets(secrets):
        assert with_secrets(public).storage_options == OPTIONS
    assert with_secrets(public).storage_options == public.storage_options  # held only for that run


def test_parameters_with_credentials_are_refused():
    config = BuildConfig(source="x", out="y", input={"storage_options": {"aws_secret_access_key": "s"}})
    with pytest.raises(ValueError, match="input.storage_options.aws_secret_access_key.*Secret block"):
        refuse_inline_secrets(config)
    refuse_inline_secrets(BuildConfig(source="x", out="y", storage_options={"secret_block": "s3-creds"}))
    assert not find_secrets({"storage_options": {"secret_block": "name", "anon": False}})


def test_secret_block_named_in_the_config_is_resolved_in_the_run(prefect_server):
    from prefect.blocks.system import Secret

    Secret(value={"key": "block-key", "secret": "block-secret"}).save("corpusforge-test-s3", overwrite=True)
    config = BuildConfig(source="x", out="s3://b/out",
                         storage_options={"secret_block": "corpusforge-test-s3",
                                          "client_kwargs": {"endpoint_url": "http://s3:9000"}})
    refuse_inline_secrets(config)  # a block's name is not a credential
    resolved = with_secrets(config)
    assert resolved.storage_options == {"key": "block-key", "secret": "block-secret",
                                        "client_kwargs": {"endpoint_url": "http://s3:9000"}}
    with pytest.raises(ValueError, match="not found"):
        with_secrets(config.model_copy(update={"storage_options": {"secret_block": "no-such-block"}}))


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.timeout(600)
def test_build_to_s3_keeps_keys_out_of_the_server(prefect_server, s3, tmp_path):
    """Keys only in the output root's options (the source is local): the build reads its
    own work/input chunks on S3 with them, and no flow or task run on the server has them."""
    import s3fs

    from flows.build_corpus import run_build
    from sample_corpus import write_sample_corpus

    write_sample_corpus(str(tmp_path / "source"), n=24, seed=1)
    fs = s3fs.S3FileSystem(**s3)
    if not fs.exists("cf-keys-check"):
        fs.mkdir("cf-keys-check")
    config = BuildConfig.model_validate({
        "source": str(tmp_path / "source"), "out": "s3://cf-keys-check/corpus", "storage_options": s3,
        "input": {"partition_size": 12}, "staging": {"shard_size": 12},
        "splits": {"shard_size": 10, "val": 0.1, "test": 0.15}, "dask": {"n_workers": 1, "processes": False}})
    result = run_build(config)
    assert result["counts"]["records"] == 24
    assert fs.exists("cf-keys-check/corpus/work/input/000000.parquet")
    assert fs.exists("cf-keys-check/corpus/report.html")
    runs = httpx.post(f"{prefect_server}/flow_runs/filter", json={"limit": 200}).json()
    mine = [r for r in runs if "cf-keys-check" in json.dumps(r["parameters"])]
    assert len(mine) == 2, "the build and its subflow"
    task_runs = httpx.post(f"{prefect_server}/task_runs/filter", json={
        "flow_runs": {"id": {"any_": [r["id"] for r in mine]}}, "limit": 200}).json()
    stored = json.dumps(mine) + json.dumps(task_runs)
    assert json.dumps(s3["key"]) not in stored and json.dumps(s3["secret"]) not in stored
    assert os.environ.get("PREFECT_API_URL") == prefect_server
