"""What a run reports (tasks/report/): the receipt, the reports, the run log and the changes
since the previous version. Other stages and the flows read these through this module.

::

    receipt.json, report.md, report.html
    receipt_outputs.parquet            (path, sha256) of every output file, from the markers
    CHANGES.md, changes.parquet        what changed since the version this root held before (or --previous)
    work/previous/records.parquet, receipt.json, receipt_outputs.parquet   that earlier version's
                                       records, kept before a build replaces them (tasks/report/changes.py)
    work/run/stage_times.{json,md}     the latest run's wall-clock seconds per stage and work done: not
                                       deterministic, so under work/ (outside every output hash)
"""

from __future__ import annotations

import pyarrow as pa

RECEIPT = "receipt.json"
RECEIPT_OUTPUTS = "receipt_outputs.parquet"  # every output file's SHA-256, beside receipt.json (tasks/report/receipt.py)
REPORT = "report.md"

RUN_LOG = "work/run/stage_times.json"  # the latest run's stage seconds (tasks/report/run_log.py)
RUN_LOG_MD = "work/run/stage_times.md"
REPORT_HTML = "report.html"  # the same report, self-contained, with charts (tasks/report/report_html.py)

CHANGES_MD = "CHANGES.md"  # what changed since the previous version (tasks/report/changes.py)
CHANGES_TABLE = "changes.parquet"
PREVIOUS_DIR = "work/previous"  # the version a build replaces, read before it does
PREVIOUS_RECORDS = f"{PREVIOUS_DIR}/records.parquet"
PREVIOUS_RECEIPT = f"{PREVIOUS_DIR}/receipt.json"
PREVIOUS_OUTPUTS = f"{PREVIOUS_DIR}/receipt_outputs.parquet"  # its output list: the release shards it shipped
CHANGES_SCHEMA = pa.schema([
    ("key", pa.string()), ("source_path", pa.string()), ("occurrence", pa.int64()), ("change", pa.string()),
    ("fields", pa.string()),
    *[(f"{side}_{c}", t) for side in ("old", "new") for c, t in (
        ("status", pa.string()), ("reason", pa.string()), ("split", pa.string()), ("shard", pa.string()),
        ("caption", pa.string()), ("sha256", pa.string()))],
])

RECEIPT_OUTPUTS_SCHEMA = pa.schema([("path", pa.string()), ("sha256", pa.string())])
