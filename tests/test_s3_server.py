"""The S3 test server itself: it must not depend on the disk it runs on."""

from __future__ import annotations

import pytest
import s3fs

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]


def test_the_server_takes_more_buckets_than_the_disk_has_free_gib(s3):
    """`weed mini` gave one volume slot per free GiB and each bucket takes one: with 16 GiB free
    the seventeenth bucket's first write failed with InternalError (CI, stop 41)."""
    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    for i in range(40):
        fs.mkdir(f"slot-{i}")
        fs.pipe(f"slot-{i}/object", b"x" * 1000)
    assert all(fs.cat(f"slot-{i}/object") == b"x" * 1000 for i in range(40))
