"""Every path under the output root and every schema that more than one stage reads.

Stages import their paths and shared schemas from here and nothing from each other, so
a newcomer finds any file's writer and readers by grepping one name. Data folders hold
only data: completion markers live in a parallel ``_markers/`` tree (see
:mod:`corpusforge.contract`) and temporary files start with ``.``, so
``pyarrow.dataset.dataset("OUT/graph/edges")``, DuckDB globs and ``webdataset`` read
every folder as it is.

::

    work/input/{part}.parquet          normalised input rows (table/folder sources)
    work/ingest/{part}.parquet         one row per input record, facts from its bytes
    work/hashes/{part}.parquet         (bucket, sha256, key, part, row, pixels) of valid records
    work/keys/{part}.parquet           (bucket, key, part, row) of every record with a safe key
    work/keydup/{bucket}.parquet       records reusing an earlier key
    work/exact/{bucket}.parquet        byte-identical copies and what they duplicate
    work/resolved/{part}.parquet       ingest rows with key/exact-dedup decisions folded in
    work/release/{split}-{n}.parquet   the samples of one release shard, in order
    work/late/{part}.parquet           facts decided after staging, joined into the manifest
    work/graph/found/{shard}.parquet   pairs one staging shard's graph queries found (reused by reruns)
    staging/tars/{shard}.tar           staged samples (image, txt, json) in input order
    staging/index/{shard}.parquet      member offsets of the tar (ranged reads)
    staging/records/{shard}.parquet    one row per staged sample, in shard order
    features/{model}/vectors/{shard}.npy       [n_ok, dim] rows in shard order
    features/{model}/keys/{shard}.parquet      key, sha256, ok, error per image of the shard
    graph/index/…, graph/recall/{shard}, graph/edges/{shard},
    graph/decisions/{shard}, graph/nodes.json, graph/summary.json, graph/collision/, graph/calibration/
    shards/{split}/{split}-{n}.tar     release shards
    manifest/part-{part}.parquet       one row per input record: its fate and the reason
    stats/{group}-{model}.{npz,features.npy,json}, stats/oracle.json
    receipt.json, report.md
    _markers/{path}.json               completion marker of the unit whose main output is {path}
"""

from __future__ import annotations

import pyarrow as pa

MARKERS = "_markers"

# ---- folders that hold exactly the current plan's units ------------------------------
INPUT_DIR = "work/input"
INGEST_DIR = "work/ingest"
HASHES_DIR = "work/hashes"
KEYS_DIR = "work/keys"
KEYDUP_DIR = "work/keydup"
EXACT_DIR = "work/exact"
RESOLVED_DIR = "work/resolved"
RELEASE_PLAN_DIR = "work/release"
LATE_DIR = "work/late"
STAGING_TARS = "staging/tars"
STAGING_INDEX = "staging/index"
STAGING_RECORDS = "staging/records"
FEATURES_DIR = "features"
GRAPH_DIR = "graph"
GRAPH_FOUND = "work/graph/found"  # query results: a cache of the rerun, not an output
GRAPH_RECALL = "graph/recall"
GRAPH_EDGES = "graph/edges"
GRAPH_DECISIONS = "graph/decisions"
RELEASE_DIR = "shards"
MANIFEST_DIR = "manifest"
STATS_DIR = "stats"

RECEIPT = "receipt.json"
REPORT = "report.md"
LINEAGE = "lineage.json"


def part_name(part: int) -> str:
    return f"{part:06d}"


def bucket_name(bucket: int) -> str:
    return f"{bucket:04d}"


def input_path(part: int) -> str:
    return f"{INPUT_DIR}/{part_name(part)}.parquet"


def ingest_path(part: int) -> str:
    return f"{INGEST_DIR}/{part_name(part)}.parquet"


def hashes_path(part: int) -> str:
    return f"{HASHES_DIR}/{part_name(part)}.parquet"


def keys_table_path(part: int) -> str:
    return f"{KEYS_DIR}/{part_name(part)}.parquet"


def keydup_path(bucket: int) -> str:
    return f"{KEYDUP_DIR}/{bucket_name(bucket)}.parquet"


def exact_path(bucket: int) -> str:
    return f"{EXACT_DIR}/{bucket_name(bucket)}.parquet"


def resolved_path(part: int) -> str:
    return f"{RESOLVED_DIR}/{part_name(part)}.parquet"


def late_path(part: int) -> str:
    return f"{LATE_DIR}/{part_name(part)}.parquet"


def staging_tar(shard: str) -> str:
    return f"{STAGING_TARS}/{shard}.tar"


def staging_index(shard: str) -> str:
    return f"{STAGING_INDEX}/{shard}.parquet"


def staging_records(shard: str) -> str:
    return f"{STAGING_RECORDS}/{shard}.parquet"


def features_dir(model_id: str) -> str:
    return f"{FEATURES_DIR}/{model_id}"


def feature_vectors(model_id: str, shard: str) -> str:
    return f"{FEATURES_DIR}/{model_id}/vectors/{shard}.npy"


def feature_keys(model_id: str, shard: str) -> str:
    return f"{FEATURES_DIR}/{model_id}/keys/{shard}.parquet"


GRAPH_INDEX_DIR = "graph/index"
GRAPH_INDEX = "graph/index/index.faiss"
GRAPH_RECALL_IDS = "graph/index/recall_ids.npy"
GRAPH_RECALL_VECTORS = "graph/index/recall_vectors.npy"
GRAPH_NODES = "graph/nodes.json"
GRAPH_SUMMARY = "graph/summary.json"
GRAPH_COMPONENTS_REPORT = "graph/components_report.json"
GRAPH_RECALL_SUMMARY = "graph/recall.json"


def found_path(shard: str) -> str:
    return f"{GRAPH_FOUND}/{shard}.parquet"


def recall_path(shard: str) -> str:
    return f"{GRAPH_RECALL}/{shard}.parquet"


def edges_path(shard: str) -> str:
    return f"{GRAPH_EDGES}/{shard}.parquet"


def decisions_path(shard: str) -> str:
    return f"{GRAPH_DECISIONS}/{shard}.parquet"


def release_shard_name(split: str, shard: int) -> str:
    return f"{split}-{shard:06d}"


def release_plan_path(name: str) -> str:
    return f"{RELEASE_PLAN_DIR}/{name}.parquet"


def release_tar(split: str, shard: int) -> str:
    return f"{RELEASE_DIR}/{split}/{release_shard_name(split, shard)}.tar"


def manifest_path(part: int) -> str:
    return f"{MANIFEST_DIR}/part-{part_name(part)}.parquet"


# ---- shared schemas ------------------------------------------------------------------
_INPUT_COLUMNS = ["key", "path", "caption", "caption_type", "source", "license", "license_url",
                  "attribution", "retrieved_at", "extra"]
INPUT_SCHEMA = pa.schema([(c, pa.string()) for c in _INPUT_COLUMNS])

# Facts known after ingest: one row per input record, no image bytes.
INGEST_SCHEMA = pa.schema([
    ("part", pa.int32()),
    ("row", pa.int32()),
    ("key", pa.string()),
    ("source_path", pa.string()),     # where the bytes came from (path, URI or tar#member)
    ("source_offset", pa.int64()),    # byte offset of the data inside a source tar, else -1
    ("sha256", pa.string()),
    ("bytes", pa.int64()),
    ("format", pa.string()),          # Pillow format: JPEG, PNG, WEBP
    ("ext", pa.string()),             # extension the image is stored under: jpg, png, webp
    ("width", pa.int32()),            # after EXIF orientation
    ("height", pa.int32()),
    ("caption", pa.string()),
    ("caption_type", pa.string()),
    ("source", pa.string()),
    ("license", pa.string()),
    ("license_url", pa.string()),
    ("attribution", pa.string()),
    ("retrieved_at", pa.string()),
    ("status", pa.string()),          # kept (so far), filtered or error
    ("reason", pa.string()),
])

HASH_SCHEMA = pa.schema([("bucket", pa.int32()), ("sha256", pa.string()), ("key", pa.string()),
                         ("part", pa.int32()), ("row", pa.int32()), ("pixels", pa.int64())])
KEY_SCHEMA = pa.schema([("bucket", pa.int32()), ("key", pa.string()),
                        ("part", pa.int32()), ("row", pa.int32())])
DUPLICATE_SCHEMA = pa.schema([("part", pa.int32()), ("row", pa.int32()), ("duplicate_of", pa.string())])
RESOLVED_SCHEMA = INGEST_SCHEMA.append(pa.field("duplicate_of", pa.string()))

STAGING_RECORDS_SCHEMA = pa.schema([RESOLVED_SCHEMA.field(c) for c in (
    "key", "part", "row", "sha256", "width", "height", "source", "caption_type", "ext", "bytes")])
FEATURE_KEYS_SCHEMA = pa.schema([("key", pa.string()), ("sha256", pa.string()), ("ok", pa.bool_()),
                                 ("error", pa.string())])

EDGE_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("similarity", pa.float32())])
# Pairs one shard's queries found, addressed by (shard, row) so they stay valid while the
# shards they point at are unchanged (dst_digest: the vectors' digest they were found in).
FOUND_SCHEMA = pa.schema([("src_row", pa.int32()), ("dst_shard", pa.string()), ("dst_row", pa.int32()),
                          ("dst_digest", pa.string()), ("similarity", pa.float32())])
NEAR_DECISION_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("duplicate_of", pa.string()),
    ("component_id", pa.int64()),
    ("component_size", pa.int32()),
    ("max_similarity", pa.float32()),
])

RELEASE_PLAN_SCHEMA = pa.schema([("key", pa.string()), ("staging_shard", pa.string()), ("tier", pa.string())])
LATE_SCHEMA = pa.schema([
    ("row", pa.int32()), ("staging_shard", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("duplicate_of", pa.string()), ("component_id", pa.int64()), ("component_size", pa.int32()),
    ("max_similarity", pa.float32()), ("split", pa.string()), ("shard", pa.string()), ("tier", pa.string()),
])

MANIFEST_SCHEMA = pa.schema([
    *[INGEST_SCHEMA.field(n) for n in (
        "key", "source_path", "sha256", "bytes", "format", "width", "height",
        "caption_type", "source", "license", "status", "reason")],
    ("duplicate_of", pa.string()),
    ("split", pa.string()),
    ("shard", pa.string()),
    ("tier", pa.string()),            # smallest tier containing the sample (nested tiers)
    ("staging_shard", pa.string()),
    ("component_id", pa.int64()),
    ("component_size", pa.int32()),
    ("max_similarity", pa.float32()),
    ("part", pa.int32()),
    ("row", pa.int32()),
])
