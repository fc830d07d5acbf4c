"""Release shards: the kept records, placed by :mod:`tasks.splits`, read back from staging.

:func:`plan_release_files` gathers every staged record's fate (kept, or removed as a
near-duplicate by the graph stage when it ran), plans splits/shards/tiers for the kept
ones and writes two kinds of small plan files:

* ``work/release/{split}-{shard}.parquet`` — the samples of one release shard in order,
  with where each lies in staging and the shard's tier (one task per release shard reads it);
* ``work/late/{part}.parquet`` — per ingest partition, the facts decided after staging
  (staging shard, near-duplicate decision, component, split, shard, tier), joined into
  the manifest by row.

This planning step holds the kept records' small metadata (key, strata, component) in
one process: about 100 bytes per record, ~10 GB at 100M images.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa

from corpusforge.hashing import fingerprint
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.tarshard import Sample, write_tar
from tasks.splits import SplitConfig, plan_release, tiers_of
from tasks.staging import sample_json

LATE_SCHEMA = pa.schema([
    ("row", pa.int32()), ("staging_shard", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("duplicate_of", pa.string()), ("component_id", pa.int64()), ("component_size", pa.int32()),
    ("max_similarity", pa.float32()), ("split", pa.string()), ("shard", pa.string()), ("tier", pa.string()),
])
PLAN_SCHEMA = pa.schema([("key", pa.string()), ("staging_shard", pa.string()), ("tier", pa.string())])


def release_shard_name(split: str, shard: int) -> str:
    return f"{split}-{shard:06d}"


def release_tar_path(split: str, shard: int) -> str:
    return f"shards/{split}/{release_shard_name(split, shard)}.tar"


def _decisions(store: Store, shard: str) -> dict[str, dict[str, Any]]:
    rel = f"graph/decisions/{shard}.parquet"
    if not store.exists(rel):
        return {}
    return {d["key"]: d for d in store.read_parquet(rel).to_pylist()}


def staged_records(store: Store, shards: list[str], source: Store) -> list[dict[str, Any]]:
    """Every staged record (from ``source``) with its near-duplicate decision (from ``store``)."""
    records = []
    for shard in shards:
        decisions = _decisions(store, shard)
        for r in source.read_parquet(f"staging/{shard}.records.parquet").to_pylist():
            d = decisions.get(r["key"], {})
            r.update(staging_shard=shard, status=d.get("status", Status.KEPT.value), reason=d.get("reason") or "",
                     duplicate_of=d.get("duplicate_of"), component_id=d.get("component_id"),
                     component_size=d.get("component_size"), max_similarity=d.get("max_similarity"))
            r["group"] = r["component_id"] if r["component_id"] is not None else f"{r['part']}:{r['row']}"
            records.append(r)
    return records


def plan_release_files(store: Store, shards: list[str], cfg: SplitConfig, source: Store | None = None
                       ) -> dict[str, Any]:
    """Plan splits/shards/tiers and write the plan files; return each release shard's size and caption mix.

    ``source`` holds the staging shards (default ``store``; another corpus version's root
    when a near-dedup pass writes a new version)."""
    records = staged_records(store, shards, source or store)
    kept = [r for r in records if r["status"] == Status.KEPT.value]
    placements = plan_release(kept, cfg)
    per_shard: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    late: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        p = placements.get(r["key"])
        if p is not None:
            per_shard[(p.split, p.shard)].append({**r, "position": p.position, "tier": p.tier})
        late[r["part"]].append({
            **r, "split": p.split if p else None, "tier": p.tier if p else None,
            "shard": release_shard_name(p.split, p.shard) if p else None})
    store.remove("work/release")
    for (split, shard), members in sorted(per_shard.items()):
        members.sort(key=lambda m: m["position"])
        store.write_parquet(f"work/release/{release_shard_name(split, shard)}.parquet",
                            pa.Table.from_pylist(members, schema=PLAN_SCHEMA))
    store.remove("work/late")
    for part, rows in sorted(late.items()):
        rows.sort(key=lambda r: r["row"])
        store.write_parquet(f"work/late/{part:06d}.parquet", pa.Table.from_pylist(rows, schema=LATE_SCHEMA))
    return {
        "shards": {release_shard_name(sp, s): {"split": sp, "index": s, "count": len(m),
                                               "caption_type": dict(sorted(Counter(r["caption_type"] for r in m).items()))}
                   for (sp, s), m in sorted(per_shard.items())},
        "removed_near_duplicates": len(records) - len(kept),
    }


def write_release_shard(store: Store, split: str, shard: int, cfg: SplitConfig, code_version: str,
                        source: Store | None = None) -> dict[str, Any]:
    """Write one release shard from staging (in ``source``, default ``store``) with ranged reads;
    skipped when complete."""
    source = source or store
    name = release_shard_name(split, shard)
    plan = store.read_parquet(f"work/release/{name}.parquet").to_pylist()
    fp = fingerprint("release", plan, cfg.model_dump(), code_version)
    rel = release_tar_path(split, shard)
    if (done := store.read_done(rel)) and done.get("fingerprint") == fp:
        return done
    index_cache: dict[str, dict[str, dict[str, tuple[int, int]]]] = {}

    def samples():
        for entry in plan:
            staging = entry["staging_shard"]
            if staging not in index_cache:
                members: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
                for m in source.read_parquet(f"staging/{staging}.index.parquet").to_pylist():
                    members[m["key"]][m["ext"]] = (m["offset"], m["size"])
                index_cache[staging] = members
            members = index_cache[staging][entry["key"]]
            start = min(o for o, _ in members.values())
            end = max(o + s for o, s in members.values())
            blob = source.read_range(f"staging/{staging}.tar", start, end - start)
            data = {ext: blob[o - start:o - start + s] for ext, (o, s) in members.items()}
            image_ext = next(e for e in data if e not in ("txt", "json"))
            meta = json.loads(data["json"])
            extra = {"split": split, "tiers": tiers_of(entry["tier"], cfg)}
            yield Sample(entry["key"], {image_ext: data[image_ext], "txt": data["txt"],
                                        "json": sample_json(meta, extra)})

    with store.atomic_write(rel) as f:
        result = write_tar(f, samples())
    info = {"fingerprint": fp, "shard": name, "count": result.count, "sha256": result.sha256, "bytes": result.bytes}
    store.mark_done(rel, info)
    return info
