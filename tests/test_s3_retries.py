"""S3 retries on the real loopback server (issue 14, scenario 9): transient errors (503
SlowDown, 500, a dropped connection) are retried with exponential backoff and the
operation succeeds; access denied is not retried and surfaces at once naming the path.

The faults are real HTTP answers on the wire from ``tests/faultproxy.py`` in front of
SeaweedFS, so botocore's retry code runs as in production. Only botocore's jitter is made
reproducible (``random.seed``), so the delays can be checked against their formula."""

from __future__ import annotations

import itertools
import random
import time

import pytest
import s3fs
from botocore.retries import standard

from corpusforge.storage import S3_MAX_ATTEMPTS, S3_RETRIES, Store
from tests.faultproxy import fault_proxy

pytestmark = [pytest.mark.scenario(9), pytest.mark.s3, pytest.mark.timeout(120)]

BUCKET = "cf-retries"


@pytest.fixture
def proxied(s3):
    """(storage options through a fault proxy, the proxy) for a bucket on the real server."""
    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    with fault_proxy(s3["client_kwargs"]["endpoint_url"]) as proxy:
        options = dict(s3, client_kwargs=dict(s3["client_kwargs"], endpoint_url=proxy.endpoint),
                       skip_instance_cache=True)
        yield options, proxy


def test_the_retry_rule_is_explicit():
    store = Store(f"s3://{BUCKET}/out", {"key": "k", "secret": "s"})
    assert store.fs.config_kwargs["retries"] == S3_RETRIES == {"mode": "standard", "total_max_attempts": 5}
    own = Store(f"s3://{BUCKET}/out", {"config_kwargs": {"retries": {"mode": "legacy", "max_attempts": 2}}})
    assert own.fs.config_kwargs["retries"] == {"mode": "legacy", "max_attempts": 2}  # a user's choice wins
    assert "config_kwargs" not in Store("local-folder").storage_options


def test_transient_errors_are_retried_with_exponential_backoff(proxied, monkeypatch):
    options, proxy = proxied
    seed = 1
    jitter = random.Random(seed)
    # botocore standard mode: before retry n (n = 1, 2, ...) it waits random() * 2**(n-1) s
    expected = [jitter.random() * 2**n for n in range(3)]
    assert expected == sorted(expected)  # the seed was picked so the delays grow
    # The backoff draws from the process-wide random.random by default, which other threads
    # of a full test session also draw from; give it its own seeded generator instead (its
    # default argument, bound when botocore was imported) before the client is made.
    backoff = standard.ExponentialBackoff.__init__
    monkeypatch.setattr(backoff, "__defaults__", (20, random.Random(seed).random, None, None))
    store = Store(f"s3://{BUCKET}/out", options)
    store.exists("warm-up")  # open the connection pool before timing anything
    proxy.fail("/out/slow.parquet", ["503", "500", "503"])
    store.write_bytes("slow.parquet", b"payload")
    puts = [(t, o) for t, m, o in proxy.seen("/out/slow.parquet") if m == "PUT"]
    assert [o for _, o in puts] == [503, 500, 503, 200]  # three retries, the last one through
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(puts)]
    for gap, delay in zip(gaps, expected, strict=True):
        assert delay - 0.02 <= gap <= delay + 0.75, (gaps, expected)  # slack: a loaded machine
    assert gaps == sorted(gaps)
    assert store.read_bytes("slow.parquet") == b"payload"

    # a read through dropped connections and a SlowDown also succeeds
    proxy.fail("/out/slow.parquet", ["drop", "503", "drop"])
    assert store.read_bytes("slow.parquet") == b"payload"
    assert [o for _, _, o in proxy.seen("/out/slow.parquet")][-5:-1] == ["drop", 503, "drop", 200]


def test_persistent_slowdown_gives_up_after_the_configured_attempts(proxied):
    options, proxy = proxied
    options = dict(options, config_kwargs={"retries": {"mode": "standard", "total_max_attempts": 2}})
    store = Store(f"s3://{BUCKET}/out", options)
    proxy.fail("/out/never.json", ["500"] * 50)
    with pytest.raises(OSError):
        store.write_bytes("never.json", b"{}")
    # s3fs does not retry a 500 on its own: exactly the configured attempts
    assert [o for _, m, o in proxy.seen("/out/never.json") if m == "PUT"] == [500, 500]
    assert S3_MAX_ATTEMPTS == 5


@pytest.mark.parametrize("bad", [{"secret": "wrong-secret"}, {"key": "nobody"}], ids=["bad-secret", "unknown-key"])
def test_access_denied_is_not_retried_and_names_the_path(proxied, bad):
    options, proxy = proxied
    Store(f"s3://{BUCKET}/out", options).write_bytes("secret.json", b"{}")
    denied = Store(f"s3://{BUCKET}/out", dict(options, **bad))
    for action, rel in ((lambda: denied.read_bytes("secret.json"), "secret.json"),
                        (lambda: denied.write_bytes("new.json", b"{}"), "new.json")):
        before = len(proxy.seen(f"/out/{rel}"))
        start = time.monotonic()
        with pytest.raises(PermissionError, match=f"access denied to s3://{BUCKET}/out/{rel}"):
            action()
        assert time.monotonic() - start < 30  # no backoff sleeps (5 retries would add ~2 s each); the count is below
        assert [o for _, _, o in proxy.seen(f"/out/{rel}")][before:] == [403]  # one request, no retry
    assert not s3fs.S3FileSystem(**options).exists(f"{BUCKET}/out/new.json")
