"""The reference statistics' and the evaluation's files (tasks/stats/): paths.

Under a corpus's output root::

    stats/{group}-{model}.{npz,features.npy,json}, stats/oracle.json
    stats/test_stats.npz               gpic-eval's dino_mu, dino_sigma, dino_embeddings (DINOv2 models)

An evaluation (tasks/stats/evaluate.py, flows/evaluate.py) writes under its own output folder,
beside the generated images' features/{model}/… (the feature stage's layout) unless a separate
feature store holds those: metrics.json and report.md, and the listing of the generated
images that the flow's units share (work/evaluate/listing.parquet: the flow holds only its
chunks' names).
"""

from __future__ import annotations

STATS_DIR = "stats"
GPIC_TEST_STATS = "stats/test_stats.npz"  # gpic-eval's reference file (tasks/stats/gpic_stats.py)
EVALUATION_METRICS = "metrics.json"  # FD, PRDC, MMD, the protocol and its deviations
EVALUATION_REPORT = "report.md"
GENERATED_LISTING = "work/evaluate/listing.parquet"  # chunk, name, kind, uri, stamp: one row group a chunk
