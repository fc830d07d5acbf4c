"""The ground floor every flow shares for its receipt and its output root: one identity
(flow name, code version, redacted config) and one "output overlaps input" check."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from corpusforge.receipts import flow_receipt
from corpusforge.storage import overlaps, require_separate
from corpusforge.version import code_version


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("/data/corpus", "/data/corpus", True),
    ("/data/corpus/", "/data/corpus", True),
    ("/data/corpus/v2", "/data/corpus", True),  # inside
    ("/data", "/data/corpus", True),  # around
    ("/data/corpus2", "/data/corpus", False),  # a shared prefix is not a parent
    ("/data/a/../corpus/x", "/data/corpus", True),  # compared as absolute paths
    ("s3://bucket/corpus/v2", "s3://bucket/corpus", True),
    ("s3://bucket/corpus2", "s3://bucket/corpus", False),
    ("s3://data/corpus", "/data/corpus", False),  # remote and local never overlap
])
def test_overlaps(a, b, expected):
    assert overlaps(a, b) is expected and overlaps(b, a) is expected


def test_require_separate_names_what_and_why():
    require_separate("/out", [("corpus", "/corpus"), ("source", "s3://b/out")])
    with pytest.raises(ValueError, match=r"^output root /corpus/scan overlaps the corpus /corpus: nothing read is "
                                         r"ever written to$"):
        require_separate("/corpus/scan", [("source", "/src"), ("corpus", "/corpus")])
    with pytest.raises(ValueError, match="overlaps the source /src: choose an --out outside it$"):
        require_separate("/src/out", [("source", "/src")], "choose an --out outside it")


class _Cluster(BaseModel):
    n_workers: int = 2


class _Options(BaseModel):
    key: str = "AKIA"
    secret: str = "s"
    endpoint_url: str = "http://x"


class _Config(BaseModel):
    out: str = "/out"
    storage_options: _Options = _Options()
    dask: _Cluster = _Cluster()


def test_flow_receipt_identity_fields():
    receipt = flow_receipt("near-dedup", ("tasks.release.publish",), _Config(), counts={"records": 3})
    assert receipt["corpusforge"] == "near-dedup"
    assert receipt["code_version"] == code_version("tasks.release.publish")
    assert receipt["config"] == {"out": "/out", "dask": {"n_workers": 2},
                                 "storage_options": {"key": "***", "secret": "***", "endpoint_url": "http://x"}}
    assert receipt["counts"] == {"records": 3}
    assert "dask" not in flow_receipt("x", ("tasks.release.publish",), _Config(), config_exclude={"dask"})["config"]
    with pytest.raises(ValueError, match="identity"):
        flow_receipt("x", ("tasks.release.publish",), _Config(), code_version="mine")


def test_a_receipt_hides_credentials_and_only_them():
    """A build's receipt shows its input.columns mapping (``key`` names the key column there)
    and a judge's max_tokens, and hides every credential: storage options' key and secret, a
    chat endpoint's api_key. The same rule keeps them out of the flow's parameters."""
    from corpusforge.secrets import find_secrets
    from flows.build_corpus import BuildConfig

    config = BuildConfig.model_validate({
        "source": "/src", "out": "/out", "input": {"columns": {"key": "id", "caption": "text"},
                                                    "storage_options": {"key": "AKIA", "secret": "s"}},
        "storage_options": {"secret_block": "creds", "client_kwargs": {"aws_secret_access_key": "x"}},
        "captioning": {"endpoint": {"base_url": "http://vlm", "model": "m", "api_key": "sk-1"}}})
    shown = flow_receipt("build-corpus", ("tasks.release.publish",), config)["config"]
    assert shown["input"]["columns"] == {"key": "id", "caption": "text"}
    assert shown["input"]["storage_options"] == {"key": "***", "secret": "***"}
    assert shown["storage_options"] == {"secret_block": "creds", "client_kwargs": {"aws_secret_access_key": "***"}}
    assert shown["captioning"]["endpoint"]["api_key"] == "***"
    assert sorted(find_secrets(config.model_dump(mode="json"))) == [
        ("captioning", "endpoint", "api_key"), ("input", "storage_options", "key"),
        ("input", "storage_options", "secret"), ("storage_options", "client_kwargs", "aws_secret_access_key")]
    assert find_secrets({"judge": {"max_tokens": 128}, "columns": {"key": "id"}}) == {}


def test_every_receipt_names_its_prefect_flow():
    """The identity string is the Prefect flow's name (one spelling: "build-corpus", not "build_corpus")."""
    from corpusforge.receipts import BUILD_FLOW
    from flows import build_corpus, contamination, near_dedup, prompt_qualification

    assert build_corpus.build_corpus.name == BUILD_FLOW == "build-corpus"
    assert near_dedup.near_dedup_flow.name == near_dedup.FLOW == "near-dedup"
    assert contamination.contamination_flow.name == contamination.FLOW == "contamination"
    assert prompt_qualification.prompt_qualification_flow.name == prompt_qualification.FLOW == "qualify-prompts"
