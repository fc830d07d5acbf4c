"""Ingest one partition: read each record's bytes once, hash, validate, spill the valid ones.

Output per partition (written atomically, marker last; paths in tasks/ingest/files.py):

* ``work/spill/{part}.bin`` — the image bytes of every valid record, concatenated in input
  order (``spill_offset`` and ``spill_xxh3``, a fast checksum, in the ingest row). Staging
  copies its shards from these spills, so the source is read once in a build; it checks each
  record's bytes against ``spill_xxh3`` and takes the SHA-256 from here;
* ``work/ingest/{part}.parquet`` — one row per input record in input order
  (:data:`corpusforge.records.INGEST_SCHEMA`), status ``kept`` (so far), ``filtered`` or ``error``;
* ``work/hashes/{part}.parquet`` and ``work/keys/{part}.parquet`` — the bucketed tables of exact
  deduplication (keys bucketed case-folded, so keys differing only in case meet in one bucket).

Fingerprint: the partition's digest (its chunk's bytes, or the tar's stamp), the stamp of every
image file and sidecar the chunk names (so bytes replaced at the same path are re-read;
sidecars are read here, not while planning), the validation settings, the bucket count, this
stage's code version and the licence verdicts (per row for a table partition, else the
allow-list itself: docs/ingest.md, licences). A record whose licence is not allowed is
``filtered`` before its image is read. A URL-list partition (kind 'urls') reads its fetch ledger
(``work/fetch/{part}.parquet``, :mod:`tasks.ingest.fetch.unit`) instead of paths: a fetched
URL's bytes come from the fetch store by their SHA-256, any other outcome is the record's status
and reason; its fingerprint holds the ledger's digest in place of file stamps.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import unicodedata
from collections import Counter
from collections.abc import Iterator
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from corpusforge.contract import Unit, UnitResult, must_compute, require_marker, run_unit, unit_fingerprint
from corpusforge.layout import INGEST_SCHEMA
from tasks.ingest.files import fetch_blob_path, fetch_ledger_path, ingest_path, spill_path
from corpusforge.records import Status
from corpusforge.storage import Store, file_stamp, is_remote, with_s3_defaults
from corpusforge.tarshard import HashingWriter, is_safe_key, iter_tar_samples
from corpusforge.version import code_version
from tasks.ingest.exact_dedup import write_dedup_tables
from tasks.ingest.licenses import LicenseConfig, license_family, license_reason
from tasks.ingest.sources import (IMAGE_EXTS, METADATA_COLUMNS, Partition, SourceConfig, parse_sidecar, read_sidecars,
                                  sidecar_locations, source_split_of)
from tasks.shared.inputs import InputRefused, allowed_roots, read_input, resolve_input, tar_member_reason
from tasks.shared.validate import ValidationConfig, validate_image


def derived_key(locator: str) -> str:
    """A safe key for a record that has none: a hash of where it came from."""
    return "k" + hashlib.sha256(locator.encode()).hexdigest()[:20]


# Invisible characters in a caption that change how it reads or displays without showing:
# format characters (Cf: bidi overrides and isolates such as U+202E, zero-width spaces, the
# BOM, soft hyphens), except the zero-width (non-)joiners U+200C/U+200D, which spell words in
# Persian and Indic scripts and join emoji sequences.
_KEPT_FORMAT = "\u200c\u200d"
_SEPARATORS = ("Zl", "Zp")  # U+2028 line and U+2029 paragraph separator: become newlines


def _caption_note(kind: str, verb: str, caption: str, chars: list[str], tail: str = "") -> str:
    count = sum(caption.count(c) for c in chars)
    return f"{kind}: {verb} {count} ({', '.join(f'U+{ord(c):04X}' for c in chars)}){tail}"


def clean_caption(record: dict[str, Any]) -> None:
    """Strip control characters (NUL, ESC, DEL, C1…; tab and newline stay) and invisible format
    characters (bidi overrides, zero-width spaces; :data:`_KEPT_FORMAT` stay) from a record's
    caption, and turn line and paragraph separators into newlines: all would ship verbatim
    into the release's ``.txt`` and JSON otherwise. One warning on the record per kind, naming
    what was removed."""
    caption = record.get("caption")
    if not caption:
        return
    category = {c: unicodedata.category(c) for c in set(caption)}
    control = sorted(c for c, cat in category.items() if cat == "Cc" and c not in "\t\n")
    invisible = sorted(c for c, cat in category.items() if cat == "Cf" and c not in _KEPT_FORMAT)
    separators = sorted(c for c, cat in category.items() if cat in _SEPARATORS)
    notes = [_caption_note(kind, verb, caption, chars, tail) for kind, verb, chars, tail in (
        ("caption_control_characters", "removed", control, ""),
        ("caption_format_characters", "removed", invisible, ""),
        ("caption_line_separators", "replaced", separators, " with a newline")) if chars]
    if not notes:
        return
    dropped = set(control) | set(invisible)
    record["caption"] = "".join("\n" if c in separators else c for c in caption if c not in dropped)
    note = "; ".join(notes)
    record["warning"] = f"{record['warning']}; {note}" if record.get("warning") else note


def _blank(part: int, row: int) -> dict[str, Any]:
    record = {name: None for name in INGEST_SCHEMA.names}
    record.update(part=part, row=row, source_offset=-1, spill_offset=-1, status=Status.ERROR.value, reason="")
    return record


_VALID_BYTES = "_valid_bytes"  # a kept record's bytes, carried from the reader to the spill, never stored


def _judge(record: dict[str, Any], data: bytes, cfg: ValidationConfig, scores: dict[str, Any]) -> None:
    """Fill hash, size and validation facts of ``record`` from its bytes."""
    verdict = validate_image(data, cfg, scores)
    whole = len(data) <= cfg.max_bytes  # an oversized file was read only up to the limit
    record.update(sha256=hashlib.sha256(data).hexdigest() if whole else None,
                  bytes=len(data) if whole else None, status=verdict.status.value,
                  reason=verdict.reason, format=verdict.format, ext=verdict.ext,
                  width=verdict.width, height=verdict.height)
    if record["status"] == Status.KEPT.value and whole:
        record[_VALID_BYTES] = data


def chunk_rows(part: Partition, store: Store) -> list[dict[str, Any]]:
    """The normalised rows of a rows partition: its chunk lies under the output root
    (``work/input``), so it is opened with the output's storage options, not the source's."""
    with fsspec.open(part.uri, "rb", **with_s3_defaults(part.uri, store.storage_options)) as f:
        return pq.read_table(f).to_pylist()


def _stamp(location: str, src: SourceConfig) -> str:
    try:
        fs, path = fsspec.core.url_to_fs(location, **src.storage_options)
        return file_stamp(fs, path, content=src.verify == "content")
    except (OSError, ValueError) as exc:
        return f"unreadable: {type(exc).__name__}"


def image_stamps(part: Partition, src: SourceConfig, store: Store) -> list[str | None]:
    """The stamp of every image file a rows partition names (None: unsafe or missing path),
    each followed by its sidecars' stamps (folder input reads them at ingest)."""
    if part.kind != "rows":
        return []
    stamps: list[str | None] = []
    roots = allowed_roots(part.base, src.allow_roots)
    for meta in chunk_rows(part, store):
        if meta.get("sidecars"):
            stamps += [_stamp(s, src) for s in sidecar_locations(_sidecar_base(part, meta), meta["sidecars"])]
        location, _ = resolve_input(part.base, meta.get("path") or "", roots)
        stamps.append(None if location is None else _stamp(location, src))
    return stamps


def _sidecar_base(part: Partition, meta: dict[str, Any]) -> str:
    """The image location a folder row's sidecars are named after (the listing's own path)."""
    return posixpath.join(part.base, meta["path"])


def license_verdicts(part: Partition, store: Store, lic: LicenseConfig | None) -> list[str] | str | None:
    """What of the licence settings a partition's output depends on: each row's verdict
    for rows partitions, the normalised allow-list for a tar (its metadata is inside)."""
    if lic is None:
        return None
    rows = [] if part.kind == "tar" else chunk_rows(part, store)
    if part.kind == "tar" or any("json" in (m.get("sidecars") or "") for m in rows):
        return json.dumps([[str(a) for a in lic.allowed()], lic.use_url, lic.on_conflict])  # metadata outside the chunk
    verdicts = [license_reason(m.get("license"), m.get("license_url"), lic) for m in rows]
    return verdicts if any(verdicts) else None  # all pass: the same output as with no list


def _row_records(part: Partition, src: SourceConfig, val: ValidationConfig,
                 store: Store, lic: LicenseConfig | None) -> Iterator[dict[str, Any]]:
    rows = chunk_rows(part, store)
    roots = allowed_roots(part.base, src.allow_roots)
    for i, meta in enumerate(rows):
        record = _blank(part.index, i)
        record.update({c: meta.get(c) for c in METADATA_COLUMNS})
        record["warning"] = meta.get("warning")
        if meta.get("sidecars"):
            record.update(read_sidecars(_sidecar_base(part, meta), meta["sidecars"], src.storage_options))
        clean_caption(record)
        raw_path = meta.get("path") or ""
        record["source_path"] = raw_path
        record["key"] = record["key"] or derived_key(raw_path)  # the row's key, or its JSON sidecar's
        extra = json.loads(meta["extra"]) if meta.get("extra") else {}
        location, refusal = resolve_input(part.base, raw_path, roots)
        if not is_safe_key(record["key"]):
            record["reason"] = f"unsafe_key: {record['key']!r}"
        elif location is None:
            record["reason"] = refusal
        elif reason := license_reason(record["license"], record["license_url"], lic):
            record.update(status=Status.FILTERED.value, reason=reason, source_path=location)
        else:
            record["source_path"] = location
            try:
                data = read_input(location, roots, src.storage_options, val.max_bytes + 1, raw_path)
            except InputRefused as exc:
                record["reason"] = exc.reason
            except FileNotFoundError:
                record["reason"] = f"missing_file: {raw_path}"
            except (OSError, ValueError) as exc:
                record["reason"] = f"read_error: {type(exc).__name__}: {exc}"
            else:
                _judge(record, data, val, extra)
        yield record


def _url_records(part: Partition, src: SourceConfig, val: ValidationConfig, store: Store,
                 lic: LicenseConfig | None, fetched: Store) -> Iterator[dict[str, Any]]:
    """A URL list's records: each row's fetch outcome, and the fetched bytes validated. The URL
    is kept (manifest, ledger); ``retrieved_at`` is the fetch time."""
    rows = chunk_rows(part, store)
    ledger = store.read_parquet(fetch_ledger_path(part.index)).to_pylist()
    if len(ledger) != len(rows):
        raise ValueError(f"fetch ledger of partition {part.name} has {len(ledger)} rows for {len(rows)} inputs")
    for i, (meta, led) in enumerate(zip(rows, ledger, strict=True)):
        record = _blank(part.index, i)
        record.update({c: meta.get(c) for c in METADATA_COLUMNS})
        clean_caption(record)
        url = meta.get("url") or ""
        record.update(url=url or None, source_path=url, key=record["key"] or derived_key(url),
                      http_status=led["http_status"], opt_out_rule=led["opt_out_rule"])
        if not is_safe_key(record["key"]):
            record["reason"] = f"unsafe_key: {record['key']!r}"
        elif led["outcome"] == "fetched":
            record["retrieved_at"] = led["retrieved_at"]
            extra = json.loads(meta["extra"]) if meta.get("extra") else {}
            _judge(record, fetched.read_bytes(fetch_blob_path(led["sha256"])), val, extra)
        else:
            status, _, code = led["outcome"].partition("/")
            record.update(status=status, reason=f"{code}: {led['detail']}" if led["detail"] else code)
        yield record


def _tar_records(part: Partition, src: SourceConfig, val: ValidationConfig,
                 store: Store, lic: LicenseConfig | None) -> Iterator[dict[str, Any]]:
    with fsspec.open(part.uri, "rb", **with_s3_defaults(part.uri, src.storage_options)) as f:
        for i, sample in enumerate(iter_tar_samples(f)):
            record = _blank(part.index, i)
            record["source_path"] = f"{part.uri}#{sample.key}"
            meta: dict[str, Any] = {}
            if "json" in sample.members:
                meta, record["warning"] = parse_sidecar(sample.members["json"])
            key = meta.get("key") if isinstance(meta.get("key"), str) else sample.key.rsplit("/", 1)[-1]
            record["key"] = key
            record.update({c: str(meta[c]) for c in METADATA_COLUMNS[1:] if meta.get(c) is not None})
            if "txt" in sample.members:
                record["caption"] = sample.members["txt"].decode("utf-8", "replace").strip()
            clean_caption(record)
            record["source_split"] = source_split_of(part.uri)
            if isinstance(meta.get("split"), list):  # GPIC: the tiers holding the sample
                record["source_tiers"] = ",".join(str(t) for t in meta["split"])
            image_exts = sorted(e for e in sample.members if e in IMAGE_EXTS)
            if sample.error is not None:
                if not sample.error.reason.startswith("not a regular file"):
                    record["key"] = derived_key(record["source_path"])  # the name itself is not usable
                record["reason"] = tar_member_reason(sample.error.reason)
            elif not is_safe_key(key):
                record["reason"] = f"unsafe_key: {key!r}"
            elif not image_exts:
                record["reason"] = f"no_image_member: members {sorted(sample.members)}"
            elif reason := license_reason(record["license"], record["license_url"], lic):
                record.update(status=Status.FILTERED.value, reason=reason)
            else:
                ext = image_exts[0]
                record["source_path"] = f"{part.uri}#{sample.key}.{ext}"
                record["source_offset"] = sample.offsets[ext]
                _judge(record, sample.members[ext], val, meta)
            yield record


def fetched_digest(store: Store, part: Partition) -> str | None:
    """A URL-list partition's fetch ledger digest (its marker's), None for other partitions."""
    if part.kind != "urls":
        return None
    return require_marker(store, fetch_ledger_path(part.index), "the fetch of a URL list").digest


def ingest_key(store: Store, part: Partition, src: SourceConfig, val: ValidationConfig, n_buckets: int,
               lic: LicenseConfig | None, fetched: str | None = None) -> str:
    """The fingerprint of one partition's ingest (the run and ``corpusforge plan`` share it):
    settings, the partition's digest, every image's stamp (a URL list: its fetch ledger's digest,
    ``fetched``, or the one in ``store``'s marker) and each row's licence verdict."""
    inputs = [part.kind, part.base, part.digest, image_stamps(part, src, store), license_verdicts(part, store, lic)]
    if part.kind == "urls":
        inputs.append(fetched or fetched_digest(store, part))
    return unit_fingerprint("ingest", code_version("tasks.ingest.partition"),
                            [val.model_dump(mode="json"), n_buckets, sorted(src.allow_roots)], inputs)


def ingest_partition(store: Store, part: Partition, src: SourceConfig, val: ValidationConfig,
                     n_buckets: int, lic: LicenseConfig | None = None, fetched: Store | None = None) -> UnitResult:
    """Ingest one partition (skipped when its fingerprint is unchanged); return its marker.

    ``lic``: the licence allow-list (None: every licence passes, as before the check existed).
    ``fetched``: the fetch store a URL-list partition's bytes are read from (default ``store``).

    The flow probes it (:data:`INGEST_PARTITION`): its key reads the partition's chunk, a small
    table, and stats each image it names, never its bytes. Where a stamp is a request per image
    (a remote source) or reads the image (``verify: content``), the probe stops before the key
    and the check runs on the workers."""
    if part.kind == "rows" and (src.verify == "content" or is_remote(part.base)):
        must_compute()
    fp = ingest_key(store, part, src, val, n_buckets, lic)

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        def reader(*args: Any) -> Iterator[dict[str, Any]]:
            if part.kind == "urls":
                return _url_records(*args, fetched or store)
            return (_tar_records if part.kind == "tar" else _row_records)(*args)

        records = []
        with store.atomic_write(spill_path(part.index)) as f:
            spill = HashingWriter(f)
            for record in reader(part, src, val, store, lic):
                data = record.pop(_VALID_BYTES, None)
                if data is not None:  # streamed on: one record's bytes in memory at a time
                    record["spill_offset"] = spill.n
                    record["spill_xxh3"] = xxhash.xxh3_64_intdigest(data)
                    spill.write(data)
                records.append(record)
        outputs = {spill_path(part.index): spill.sha256, **write_dedup_tables(store, part.index, records, n_buckets),
                   ingest_path(part.index): store.write_parquet(ingest_path(part.index),
                                                                pa.Table.from_pylist(records, schema=INGEST_SCHEMA))}
        by_status = {s: sum(r["status"] == s for r in records) for s in sorted({r["status"] for r in records})}
        licenses = Counter(license_family(r["license"], r["license_url"]) for r in records)
        return outputs, {"part": part.index, "records": len(records), "by_status": by_status,
                         "licenses": dict(sorted(licenses.items()))}

    return run_unit(store, ingest_path(part.index), fp, compute)


INGEST_PARTITION = Unit(ingest_partition, "ingest-partition", probe=True)
