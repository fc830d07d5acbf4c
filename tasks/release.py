"""Release shards: the kept records, placed by :mod:`tasks.splits`, read back from staging.

:func:`plan_release_files` gathers every staged record's fate (kept, or removed as a
near-duplicate by the graph stage when it ran), plans splits/shards/tiers for the kept
ones and writes two kinds of small plan files:

* ``work/release/{split}-{shard}.parquet`` — the samples of one release shard in order,
  with where each lies in staging and the shard's tier (one task per release shard reads it);
* ``work/late/{part}.parquet`` — per ingest partition, the facts decided after staging
  (staging shard, near-duplicate decision, component, split, shard, tier), joined into
  the manifest by row.

A release shard's fingerprint holds its plan file's bytes and the SHA-256 of each staging
member it copies, so a caption edited in staging reaches exactly the release tar holding it.

This planning step holds the kept records' small metadata (key, strata, component) in
one process: about 100 bytes per record, ~10 GB at 100M images.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa

from corpusforge.contract import prune, run_unit, unit_fingerprint
from corpusforge.faults import fault_point
from corpusforge.layout import (GPIC_JSON_FIELDS, LATE_DIR, LATE_SCHEMA, RELEASE_DIR, RELEASE_PLAN_DIR,
                                RELEASE_PLAN_SCHEMA, captions_path, decisions_path, late_path, part_name,
                                release_plan_path, release_shard_name,
                                release_tar, staging_index, staging_records, staging_tar)
from corpusforge.records import Status
from corpusforge.storage import Store
from corpusforge.tarshard import Sample, write_tar
from corpusforge.version import code_version
from tasks.release_image import COPIED, FORMAT_OF_EXT, member_for, pillow_version, reencode, resolve_rule
from tasks.splits import SPLITS, SplitConfig, held_out_sizes, plan_release, tiers_of
from tasks.staging import sample_json


def gpic_json(meta: dict[str, Any], caption: str, tiers: list[str]) -> bytes:
    """A sample's JSON in GPIC's release format: exactly its field names and types (strings
    never null: a missing value is ""; ``split`` is the list of tiers holding the sample)."""
    text = {f: str(meta.get(f) or "") for f in ("retrieved_at", "license", "license_url", "attribution",
                                                "key", "caption_type")}
    values = {**text, "img_width": int(meta["width"]), "img_height": int(meta["height"]),
              "split": list(tiers), "caption": caption}
    return json.dumps({f: values[f] for f in GPIC_JSON_FIELDS}, ensure_ascii=False,
                      separators=(",", ":")).encode()


def release_sample(key: str, data: dict[str, bytes], split: str, tiers: list[str], release_ext: str,
                   encoding: str, layout: str, captioned: dict[str, Any] | None = None) -> Sample:
    """One release sample from its staged members. Default layout: image, .txt, .json (the
    staged JSON plus split, tiers and the image member's true format); gpic: .json first,
    then the image, caption inside the JSON. ``captioned`` (a release-plan row): when the
    captioning stage ran, its caption replaces the staged one and its type and origin go
    into the JSON."""
    staged_ext = next(e for e in data if e not in ("txt", "json"))
    image = reencode(data[staged_ext], encoding)
    meta = json.loads(data["json"])
    text = data["txt"]
    extra: dict[str, Any] = {}
    if captioned and captioned.get("caption_origin"):
        extra = {"caption_type": captioned["caption_type"], "caption_origin": captioned["caption_origin"]}
        if captioned.get("caption") is not None:
            text = captioned["caption"].encode("utf-8")
    if layout == "gpic":
        meta.update(caption_type=extra.get("caption_type", meta.get("caption_type")))
        return Sample(key, {"json": gpic_json(meta, text.decode("utf-8"), tiers), release_ext: image})
    extra.update(split=split, tiers=tiers, format=FORMAT_OF_EXT[release_ext])
    return Sample(key, {release_ext: image, "txt": text, "json": sample_json(meta, extra)})


def _decisions(store: Store, shard: str) -> dict[str, dict[str, Any]]:
    return {d["key"]: d for d in store.read_parquet(decisions_path(shard)).to_pylist()}


def staged_records(store: Store, shards: list[str], source: Store, near_dedup: bool,
                   captions: bool = False) -> list[dict[str, Any]]:
    """Every staged record (from ``source``) with its near-duplicate decision (from ``store``,
    when the near-duplicate stage ran: then every record must have one) and, when the
    captioning stage ran, its caption row (every surviving record must have one)."""
    records = []
    for shard in shards:
        decisions = _decisions(store, shard) if near_dedup else {}
        captioned = {c["key"]: c for c in store.read_parquet(captions_path(shard)).to_pylist()} if captions else {}
        for r in source.read_parquet(staging_records(shard)).to_pylist():
            if near_dedup and r["key"] not in decisions:
                raise ValueError(f"no near-duplicate decision for {r['key']} of staging shard {shard}")
            d = decisions.get(r["key"], {})
            r.update(staging_shard=shard, status=d.get("status", Status.KEPT.value), reason=d.get("reason") or "",
                     duplicate_of=d.get("duplicate_of"), component_id=d.get("component_id"),
                     component_size=d.get("component_size"), max_similarity=d.get("max_similarity"))
            if captions and r["status"] == Status.KEPT.value:
                c = captioned.get(r["key"])
                if c is None:
                    raise ValueError(f"no caption row for {r['key']} of staging shard {shard}")
                r.update({f: c[f] for f in ("caption", "caption_type", "caption_origin", "vlm_model",
                                            "vlm_answers")})
                if c["status"] != Status.KEPT.value:
                    r.update(status=c["status"], reason=c["reason"])
            r["group"] = r["component_id"] if r["component_id"] is not None else f"{r['part']}:{r['row']}"
            records.append(r)
    return records


def plan_release_files(store: Store, shards: list[str], cfg: SplitConfig, near_dedup: bool,
                       source: Store | None = None, captions: bool = False) -> dict[str, Any]:
    """Plan splits/shards/tiers and write the plan files; return each release shard's size,
    caption mix, plan digest and staging shards, and each partition's late-facts digest.

    ``source`` holds the staging shards (default ``store``; another corpus version's root
    when a near-dedup pass writes a new version)."""
    records = staged_records(store, shards, source or store, near_dedup, captions)
    kept = [r for r in records if r["status"] == Status.KEPT.value]
    placements = plan_release(kept, cfg)
    rule = resolve_rule((r["ext"] for r in kept), cfg.layout, cfg.image_format)
    per_shard: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    late: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        p = placements.get(r["key"])
        image: dict[str, Any] = {"release_ext": None, "image_encoding": None}
        if p is not None:
            image = dict(zip(("release_ext", "image_encoding"), member_for(r["ext"], cfg.layout, rule,
                                                                         cfg.jpeg_quality)))
            per_shard[(p.split, p.shard)].append({**r, **image, "position": p.position, "tier": p.tier})
        late[r["part"]].append({
            **r, **image, "split": p.split if p else None, "tier": p.tier if p else None,
            "shard": release_shard_name(p.split, p.shard, cfg.layout) if p else None})
    plans = {}
    for (split, shard), members in sorted(per_shard.items()):
        members.sort(key=lambda m: m["position"])
        name = release_shard_name(split, shard, cfg.layout)
        plans[name] = store.write_parquet(release_plan_path(name),
                                          pa.Table.from_pylist(members, schema=RELEASE_PLAN_SCHEMA))
    prune(store, RELEASE_PLAN_DIR, plans)
    late_digests = {}
    for part, rows in sorted(late.items()):
        rows.sort(key=lambda r: r["row"])
        late_digests[part] = store.write_parquet(late_path(part), pa.Table.from_pylist(rows, schema=LATE_SCHEMA))
    prune(store, LATE_DIR, {part_name(p) for p in late_digests})
    for split in SPLITS:
        prune(store, f"{RELEASE_DIR}/{split}", {release_shard_name(sp, s, cfg.layout) for (sp, s) in per_shard
                                                 if sp == split})
    name_of = {key: release_shard_name(*key, cfg.layout) for key in per_shard}
    return {
        "shards": {name_of[(sp, s)]: {"split": sp, "index": s, "count": len(m),
                                      "caption_type": dict(sorted(Counter(r["caption_type"] for r in m).items())),
                                      "image_ext": dict(sorted(Counter(r["release_ext"] for r in m).items()))}
                   for (sp, s), m in sorted(per_shard.items())},
        "plans": {name_of[(sp, s)]: {"sha256": plans[name_of[(sp, s)]],
                                     "staging": sorted({r["staging_shard"] for r in m})}
                  for (sp, s), m in sorted(per_shard.items())},
        "late": late_digests,
        "removed_near_duplicates": len(records) - len(kept),  # (and, with captioning, its filters)
        "split_rule": held_out_sizes(len(kept), cfg)[2],
        "images": {"layout": cfg.layout, "image_format": cfg.image_format, "rule": rule,
                   "encodings": dict(sorted(Counter(m["image_encoding"] for ms in per_shard.values()
                                                    for m in ms).items()))},
    }


def write_release_shard(store: Store, split: str, shard: int, cfg: SplitConfig, plan: dict[str, Any],
                        source: Store | None = None) -> dict[str, Any]:
    """Write one release shard from staging (in ``source``, default ``store``) with ranged reads.

    ``plan``: the shard's plan digest and staging shards (from :func:`plan_release_files`).
    The fingerprint holds the plan and the SHA-256 of every staging member it copies (from
    the staging indexes), so it is skipped unless one of its own samples changed."""
    source = source or store
    name = release_shard_name(split, shard, cfg.layout)
    entries = store.read_parquet(release_plan_path(name)).to_pylist()
    members: dict[str, dict[str, dict[str, tuple[int, int, str]]]] = {}
    for staged in plan["staging"]:
        found: dict[str, dict[str, tuple[int, int, str]]] = defaultdict(dict)
        for m in source.read_parquet(staging_index(staged)).to_pylist():
            found[m["key"]][m["ext"]] = (m["offset"], m["size"], m["sha256"])
        members[staged] = found
    copied = [[e["key"], sorted((ext, sha) for ext, (_, _, sha) in members[e["staging_shard"]][e["key"]].items())]
              for e in entries]
    reencodes = any(e["image_encoding"] != COPIED for e in entries)
    fp = unit_fingerprint("release", code_version(__name__),
                          [cfg.tiers, cfg.layout, pillow_version() if reencodes else None], [plan["sha256"], copied])
    tar = release_tar(split, shard, cfg.layout)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        def samples():
            for i, entry in enumerate(entries):
                if i == 1:
                    fault_point("release.write", name)  # tests only: off unless CORPUSFORGE_FAULT
                staged = entry["staging_shard"]
                spans = members[staged][entry["key"]]
                start = min(o for o, _, _ in spans.values())
                end = max(o + s for o, s, _ in spans.values())
                blob = source.read_range(staging_tar(staged), start, end - start)
                data = {ext: blob[o - start:o - start + s] for ext, (o, s, _) in spans.items()}
                yield release_sample(entry["key"], data, split, tiers_of(entry["tier"], cfg), entry["release_ext"],
                                     entry["image_encoding"], cfg.layout, captioned=entry)

        with store.atomic_write(tar) as f:
            result = write_tar(f, samples())
        return {tar: result.sha256}, {"shard": name, "count": result.count, "bytes": result.bytes}

    return run_unit(store, tar, fp, compute)
