"""The near-duplicate graph stage's files (tasks/graph/): paths and schemas. Downstream
stages (captions, release, report) import this module, and no other of the stage.

::

    work/graph/found/{shard}.parquet   pairs one staging shard's graph queries found (reused by reruns)
    work/graph/routed/{shard}.parquet  the valid found pairs a merge group owns, {shard} its first owner
                                       shard: written by the one routing task (tasks/graph/edges.py)
    work/graph/shards.parquet          the stage's shard table (node offsets, feature digests): read by
                                       its tasks, which get only its SHA-256 as a parameter
    work/graph/digests/{kind}.parquet  one digest per staging shard, in node order, of the graph files
                                       of a kind (edges, records, verified) that the one-off graph tasks
                                       fingerprint: written once by the stage, passed as its SHA-256
    work/graph/regions/{shard}.npy     each picture's whole frame and 70 % windows as compact layout
                                       coefficients (float16 [n, 26, 63]; tasks/graph/crops.py)
    work/graph/index/trained.faiss     an IVF index's trained, empty index (quantiser, codebooks)
    work/graph/index/blocks/{shard}.ivf   the inverted lists of a block of staging shards from {shard} on,
                                       added to the trained index (merged into graph/index/index.ivfdata)
    graph/index/index.faiss            the near-duplicate index; for IVF without its inverted lists, which are
    graph/index/index.ivfdata          in FAISS's on-disk format here (memory-mapped by the query tasks)
    graph/index/recall_{ids,vectors}.npy, graph/recall/{shard}, graph/edges/{shard}, graph/review/{shard},
    graph/crops/{shard}, graph/verified/{shard}, graph/decisions/{shard}, graph/nodes.json, graph/summary.json,
    graph/components_report.json, graph/collision/, graph/calibration/
"""

from __future__ import annotations

import pyarrow as pa

GRAPH_DIR = "graph"
GRAPH_WORK = "work/graph"  # the graph stage's rerun state: removed with graph/ when near-dedup is off
GRAPH_FOUND = "work/graph/found"  # query results: a cache of the rerun, not an output
GRAPH_ROUTED = "work/graph/routed"  # found pairs by owning merge group (tasks/graph/edges.py: Merge)
GRAPH_SHARD_TABLE = "work/graph/shards.parquet"  # shared by the graph tasks (tasks/graph/nodes.py)
GRAPH_DIGESTS_DIR = "work/graph/digests"  # per-shard digest lists of the one-off graph tasks (tasks/graph/nodes.py)
GRAPH_RECALL = "graph/recall"
GRAPH_EDGES = "graph/edges"
GRAPH_DECISIONS = "graph/decisions"
GRAPH_VERIFIED = "graph/verified"  # geometric verification of review-band pairs (tasks/graph/verify.py)
GRAPH_REVIEW = "graph/review"  # review-band pairs chosen for verification, per owner shard (tasks/graph/review.py)
GRAPH_REGIONS = "work/graph/regions"  # whole-frame and window layouts per shard (tasks/graph/crops.py)
GRAPH_CROPS = "graph/crops"  # off-centre crop candidates per query shard, verified with the review's pairs

GRAPH_INDEX_DIR = "graph/index"
GRAPH_INDEX = "graph/index/index.faiss"
GRAPH_INDEX_LISTS = "graph/index/index.ivfdata"  # an IVF index's inverted lists (tasks/graph/ondisk.py)
GRAPH_INDEX_WORK = "work/graph/index"
GRAPH_INDEX_TRAINED = "work/graph/index/trained.faiss"
GRAPH_INDEX_BLOCKS = "work/graph/index/blocks"
GRAPH_RECALL_IDS = "graph/index/recall_ids.npy"
GRAPH_RECALL_VECTORS = "graph/index/recall_vectors.npy"
GRAPH_NODES = "graph/nodes.json"
GRAPH_SUMMARY = "graph/summary.json"
GRAPH_COMPONENTS_REPORT = "graph/components_report.json"
LINEAGE = "lineage.json"  # a graph derived from a built corpus: which corpus, shards, config (tasks/graph/derived.py)


def index_block_path(first_shard: str) -> str:
    return f"{GRAPH_INDEX_BLOCKS}/{first_shard}.ivf"


def found_path(shard: str) -> str:
    return f"{GRAPH_FOUND}/{shard}.parquet"


def routed_path(first_shard: str) -> str:
    return f"{GRAPH_ROUTED}/{first_shard}.parquet"


def recall_path(shard: str) -> str:
    return f"{GRAPH_RECALL}/{shard}.parquet"


def edges_path(shard: str) -> str:
    return f"{GRAPH_EDGES}/{shard}.parquet"


def verified_path(shard: str) -> str:
    return f"{GRAPH_VERIFIED}/{shard}.parquet"


def review_path(shard: str) -> str:
    return f"{GRAPH_REVIEW}/{shard}.parquet"


def regions_path(shard: str) -> str:
    return f"{GRAPH_REGIONS}/{shard}.npy"


def crops_path(shard: str) -> str:
    return f"{GRAPH_CROPS}/{shard}.parquet"


def graph_digests_path(kind: str) -> str:
    return f"{GRAPH_DIGESTS_DIR}/{kind}.parquet"


def decisions_path(shard: str) -> str:
    return f"{GRAPH_DECISIONS}/{shard}.parquet"


EDGE_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("similarity", pa.float32())])
# Review-band pairs of one owner shard's edge file and their geometric verification.
VERIFIED_SCHEMA = pa.schema([
    ("src", pa.int64()), ("dst", pa.int64()), ("key_a", pa.string()), ("key_b", pa.string()),
    ("sha_a", pa.string()), ("sha_b", pa.string()), ("similarity", pa.float32()), ("keypoints", pa.int32()),
    ("matches", pa.int32()), ("inliers", pa.int32()), ("score", pa.float32()), ("overlap", pa.float32()),
    ("agreement", pa.float32()), ("agreeing", pa.float32()),
    ("parallax", pa.float32()),  # share of agreeing tiles that agree only shifted (tasks/graph/verify.py)
    ("colourless", pa.bool_()), ("verified", pa.bool_()),
    ("region", pa.float32()),  # a crop candidate's region score (tasks/graph/crops.py); null for a review pair
    ("mirrored", pa.bool_()),  # verified against the second picture mirrored (a model not flip-symmetric)
])
# Off-centre crop candidates of one query shard: src is the query (the crop), region the best
# score of its whole frame among dst's windows, similarity the pair's global score.
CROP_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("similarity", pa.float32()),
                         ("region", pa.float32())])
# The graph stage's shard table: one row per staging shard in node-id order.
SHARD_TABLE_SCHEMA = pa.schema([("shard", pa.string()), ("start", pa.int64()), ("stop", pa.int64()),
                                ("features", pa.string())])
# A digest per staging shard in node-id order (edges, records or verified files of the graph stage).
SHARD_DIGESTS_SCHEMA = pa.schema([("shard", pa.string()), ("digest", pa.string())])
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
