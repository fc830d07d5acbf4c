"""The record statuses every stage shares.

Every input record ends in the manifest exactly once, with a status and a reason.
Stages attach facts to records by ``(part, row)``: the ingest partition and the row's
position in it, which is also the record's place in input order. The schemas of the
tables that carry records are in :mod:`corpusforge.layout`.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    KEPT = "kept"
    FILTERED = "filtered"
    EXACT_DUPLICATE = "exact_duplicate"
    NEAR_DUPLICATE = "near_duplicate"
    ERROR = "error"
