"""Staging's units planned before a run (``corpusforge plan``): its shards are cut from the
resolved partitions, so they are known exactly only when every partition's resolve skips;
otherwise the shards completed before are "recompute if upstream output changes" and the
stage may gain units. Kept apart from the unit's module, so that a change to planning
leaves staging's code version (its units' fingerprints) as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from corpusforge.contract import Marker, explain, read_marker
from corpusforge.layout import STAGING_TARS, staging_tar
from corpusforge.plans import StagePlan, deletions, unknown_units
from corpusforge.storage import Store
from tasks.staging.stage import images_digest, cut_staging, shard_table, staging_key


def plan_units(store: Store, resolved: Sequence[Marker | None], shard_size: int) -> list[StagePlan]:
    """The staging shards' units from the resolved partitions' markers (None: recomputed
    first). Its ``outputs``: each shard's images digest, what the feature units are keyed by."""
    staging = StagePlan("staging")
    if any(m is None for m in resolved):
        unknown_units(staging, store, STAGING_TARS, ".tar")
        return [staging]
    for shard in cut_staging([m.info for m in resolved if m is not None], shard_size):
        table = shard_table(store, shard)
        staging.add(shard.name, *explain(read_marker(store, staging_tar(shard.name)), staging_key(table)))
        staging.outputs[shard.name] = images_digest(table.to_pylist())
    deletions(staging, store, STAGING_TARS, ".tar", list(staging.outputs))
    return [staging]
