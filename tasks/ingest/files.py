"""Ingest's and exact deduplication's files (tasks/ingest/): the normalised input, the fetch
ledger and store, the ingest rows, the spilled bytes and the dedup exchange. Staging, the release
and the report read these through this module; the ingest row schema, which the manifest's
derives from, is corpusforge/layout.py's.

::

    work/input/{part}.parquet          normalised input rows (table/folder sources)
    work/.listing/{lister}-{n}.parquet a folder source's entries while it is planned (removed after): the
                                       listing spilled, for DuckDB to sort and match sidecars out of core
    work/fetch_plan.parquet            a URL list's host units: (part, unit) of every partition that has URLs
                                       in a host unit, sorted (tasks/ingest/fetch/hostunits.py)
    work/fetch_units/{unit}.parquet    one host unit's URLs to request: (part, row, url, sha1, host) by host
    work/fetch_outcomes/{unit}.parquet one host unit's outcome of each of its URLs, by (part, row)
    work/fetch/{part}.parquet          a URL-list partition's fetch ledger: one row per input row, its
                                       outcome, URL, HTTP status, opt-out rule and evidence (tasks/ingest/fetch/)
    fetch/blobs/{sha[:2]}/{sha256}     fetched bytes, content-addressed (under OUT, or fetch.store)
    fetch/urls/{h[:2]}/{h}.json        the final outcome of one URL (h: SHA-256 of the URL): never fetched again;
                                       a JSON line of a batch, hard-linked under each of its URLs' names
    fetch/origins/{h}.json             robots.txt and /.well-known/tdmrep.json of one origin, as fetched
    work/ingest/{part}.parquet         one row per input record, facts from its bytes
    work/spill/{part}.bin              the valid records' image bytes as ingest read them, concatenated
                                       (staging copies from here: the source is read once)
    work/hashes/{part}.parquet         (bucket, sha256, key, part, row, pixels) of valid records
    work/keys/{part}.parquet           (bucket, key, part, row) of every record with a safe key
    work/dedup/keys/{group}.parquet    the key rows of a group of partitions, one row group per bucket
    work/dedup/hashes/{group}.parquet  the hash rows of a group (reused keys dropped), one row group per bucket
    work/keydup/{bucket}.parquet       records reusing an earlier key, one row group per partition group
    work/exact/{bucket}.parquet        byte-identical copies and what they duplicate, one row group per group
    work/resolved/{part}.parquet       ingest rows with key/exact-dedup decisions folded in
"""

from __future__ import annotations

import pyarrow as pa

from corpusforge.layout import part_name

INPUT_DIR = "work/input"
INGEST_DIR = "work/ingest"
FETCH_LEDGER_DIR = "work/fetch"
FETCH_PLAN = "work/fetch_plan.parquet"
# partitions per row group of the fetch plan and of a host unit's outcomes: a partition's ledger
# reads only the row groups of its own block, not the whole file
FETCH_PARTS_PER_ROW_GROUP = 256
FETCH_UNITS_DIR = "work/fetch_units"
FETCH_OUTCOMES_DIR = "work/fetch_outcomes"
SPILL_DIR = "work/spill"
HASHES_DIR = "work/hashes"
KEYS_DIR = "work/keys"
DEDUP_KEYS_DIR = "work/dedup/keys"
DEDUP_HASHES_DIR = "work/dedup/hashes"
KEYDUP_DIR = "work/keydup"
EXACT_DIR = "work/exact"
RESOLVED_DIR = "work/resolved"

LISTING_SPILL_DIR = "work/.listing"  # a folder source's listing while it is planned (tasks/ingest/sources.py)


def bucket_name(bucket: int) -> str:
    return f"{bucket:04d}"


def input_path(part: int) -> str:
    return f"{INPUT_DIR}/{part_name(part)}.parquet"


def listing_spill_path(lister: str, n: int) -> str:
    return f"{LISTING_SPILL_DIR}/{lister}-{n:06d}.parquet"


def fetch_ledger_path(part: int) -> str:
    return f"{FETCH_LEDGER_DIR}/{part_name(part)}.parquet"


def fetch_unit_name(unit: int) -> str:
    return f"{unit:06d}"


def fetch_unit_path(unit: int) -> str:
    return f"{FETCH_UNITS_DIR}/{fetch_unit_name(unit)}.parquet"


def fetch_outcomes_path(unit: int) -> str:
    return f"{FETCH_OUTCOMES_DIR}/{fetch_unit_name(unit)}.parquet"


# The fetch store (tasks/ingest/fetch/), under OUT or ``fetch.store``: shared by every build that names it.
def fetch_blob_path(sha256: str) -> str:
    return f"fetch/blobs/{sha256[:2]}/{sha256}"


def fetch_url_path(url_sha256: str) -> str:
    return f"fetch/urls/{url_sha256[:2]}/{url_sha256}.json"


def fetch_origin_path(origin_sha256: str) -> str:
    return f"fetch/origins/{origin_sha256}.json"


def ingest_path(part: int) -> str:
    return f"{INGEST_DIR}/{part_name(part)}.parquet"


def spill_path(part: int) -> str:
    return f"{SPILL_DIR}/{part_name(part)}.bin"


def hashes_path(part: int) -> str:
    return f"{HASHES_DIR}/{part_name(part)}.parquet"


def keys_table_path(part: int) -> str:
    return f"{KEYS_DIR}/{part_name(part)}.parquet"


def dedup_group_name(group: int) -> str:
    return f"{group:06d}"


def dedup_keys_path(group: int) -> str:
    return f"{DEDUP_KEYS_DIR}/{dedup_group_name(group)}.parquet"


def dedup_hashes_path(group: int) -> str:
    return f"{DEDUP_HASHES_DIR}/{dedup_group_name(group)}.parquet"


def keydup_path(bucket: int) -> str:
    return f"{KEYDUP_DIR}/{bucket_name(bucket)}.parquet"


def exact_path(bucket: int) -> str:
    return f"{EXACT_DIR}/{bucket_name(bucket)}.parquet"


def resolved_path(part: int) -> str:
    return f"{RESOLVED_DIR}/{part_name(part)}.parquet"


_INPUT_COLUMNS = ["key", "path", "url", "caption", "caption_type", "source", "license", "license_url",
                  "attribution", "retrieved_at", "extra", "warning",  # warning: a sidecar that was not usable
                  "sidecars"]  # folder input: an image's sidecar extensions ("txt,json"), read at ingest
INPUT_SCHEMA = pa.schema([(c, pa.string()) for c in _INPUT_COLUMNS])

HASH_SCHEMA = pa.schema([("bucket", pa.int32()), ("sha256", pa.string()), ("key", pa.string()),
                         ("part", pa.int32()), ("row", pa.int32()), ("pixels", pa.int64())])
KEY_SCHEMA = pa.schema([("bucket", pa.int32()), ("key", pa.string()),
                        ("part", pa.int32()), ("row", pa.int32())])
DUPLICATE_SCHEMA = pa.schema([("part", pa.int32()), ("row", pa.int32()), ("duplicate_of", pa.string())])

# A URL-list partition's fetch ledger (work/fetch/{part}.parquet): one row per input row, in order.
# ``outcome``: fetched, not_requested (the licence or the URL refused it before any request),
# deferred (Retry-After beyond the cap, the host's circuit open: tried again next run), or the
# manifest's status/reason code (filtered/robots_disallowed, error/http_status, …).
FETCH_LEDGER_SCHEMA = pa.schema([
    ("row", pa.int32()), ("url", pa.string()), ("host", pa.string()), ("outcome", pa.string()),
    ("detail", pa.string()), ("final", pa.bool_()), ("http_status", pa.int32()), ("opt_out_rule", pa.string()),
    ("evidence", pa.string()), ("sha256", pa.string()), ("bytes", pa.int64()), ("retrieved_at", pa.string()),
    ("requests", pa.int32()), ("status_429", pa.int32()), ("wait_seconds", pa.float64()),
    ("bytes_received", pa.int64()),
])

# A host unit's URLs (work/fetch_units/{unit}.parquet): the rows that would be requested, by host,
# then in input order; and which host units each partition's rows went to (work/fetch_plan.parquet).
FETCH_UNIT_SCHEMA = pa.schema([("part", pa.int32()), ("row", pa.int32()), ("url", pa.string()),
                               ("sha1", pa.string()), ("host", pa.string())])
FETCH_PLAN_SCHEMA = pa.schema([("part", pa.int32()), ("unit", pa.int32())])
# A host unit's outcomes (work/fetch_outcomes/{unit}.parquet): the ledger's columns and the partition.
FETCH_OUTCOMES_SCHEMA = pa.schema([("part", pa.int32()), *FETCH_LEDGER_SCHEMA])
