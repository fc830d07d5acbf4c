"""The evaluation set, read once and staged in the corpus's own feature-stage layout.

A table (one row per item: id, image path, text fields), a folder of images (sidecar
``{stem}.txt`` = caption, ``{stem}.json`` = more fields) or WebDataset tars, only ever *read*.
Each chunk becomes a staging shard under ``OUT/eval/`` and ``eval/items/{chunk}.parquet``, so the
feature stage embeds it exactly as a corpus's shards (same decoder, models and fingerprint
rules) and the scans can check that both sides carry the same model fingerprint. One unit per
chunk, fingerprinted by its rows and a stamp of every file it reads; per-item SHA-256s are of
the bytes actually read.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from corpusforge.contract import (COMPUTED, SKIPPED, Marker, UnitKey, UnitResult, current_marker, explain,
                                  finish_unit, read_marker, unit_fingerprint)
from corpusforge.hashing import canonical_json, fingerprint
from corpusforge.layout import STAGING_RECORDS_SCHEMA, TABLE_SUFFIXES, staging_index, staging_records, staging_tar
from tasks.contamination.files import EVAL_ITEM_SCHEMA, eval_items_path
from corpusforge.storage import Store, uri_stamp, url_to_fs
from corpusforge.tarshard import Sample, iter_tar_samples, write_tar
from corpusforge.version import code_version
from tasks.contamination.config import EvalSetConfig
from tasks.shared.inputs import (allowed_roots, image_refusal, list_folder, read_image, read_input, resolve_input,
                                 tar_member_reason)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
CAPTION_FIELD = "caption"
_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"), (b"BM", "bmp"),
          (b"II*\x00", "tif"), (b"MM\x00*", "tif"))


@dataclass(frozen=True)
class EvalChunk:
    """One unit of the evaluation set: rows of a table, files of a folder, or one tar."""

    name: str
    kind: str                                   # table | folder | tar
    first_row: int                              # row of the first item (tables, folders; 0 in a tar)
    rows: tuple[dict[str, Any], ...] = ()       # table: id, image uri, fields; folder: id, uri, sidecars
    uri: str = ""                               # tar: the tar
    prefix: str = ""                            # tar: item ids are {prefix}/{key}
    base: str = ""                              # the folder its paths were resolved in (what may be read)
    error: str = ""                             # tar: why it may not be read (one error item)


@dataclass
class EvalCuts:
    kind: str
    name: str
    chunks: list[EvalChunk] = field(default_factory=list)
    input_files: list[str] = field(default_factory=list)   # every file read for the cuts (table, tars)


def item_key(item_id: str) -> str:
    return "e" + hashlib.sha256(item_id.encode()).hexdigest()[:20]


def sniff_ext(data: bytes) -> str:
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "bin"


def _as_text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str) \
        if isinstance(value, (dict, list)) else str(value)


def read_table(uri: str, options: dict[str, Any]) -> pa.Table:
    """A benchmark table (parquet, JSONL or CSV), every column as given."""
    with fsspec.open(uri, "rb", **options) as f:
        if uri.endswith(".parquet"):
            return pq.read_table(f)
        if uri.endswith(".csv"):
            return pacsv.read_csv(f, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
        return pajson.read_json(f)


def _wanted_fields(cfg: EvalSetConfig) -> list[str]:
    names = list(cfg.text_fields)
    for extra in (cfg.answer_field, cfg.category_field):
        if extra and extra not in names:
            names.append(extra)
    return names


def _folder_rows(root: str, cfg: EvalSetConfig) -> list[dict[str, Any]]:
    """A folder's images as rows, each resolved as the build resolves a listing's paths (a
    symlink out or a FIFO named like an image is that item's ``unsafe_path`` error); a
    ``{stem}.txt`` / ``{stem}.json`` sidecar is attached only when it may be read."""
    entries = [rel for rel, _ in list_folder(root, cfg.storage_options)]
    present = set(entries)
    roots = allowed_roots(root, cfg.allow_roots)
    rows = []
    for rel in entries:
        if not rel.lower().endswith(IMAGE_SUFFIXES):
            continue
        uri, error = resolve_input(root, rel, roots)
        stem = rel.rsplit(".", 1)[0]
        sidecars = {ext: resolve_input(root, f"{stem}.{ext}", roots)[0] if f"{stem}.{ext}" in present else None
                    for ext in ("txt", "json")}
        rows.append({"item_id": rel, "image_source": rel, "uri": uri, "error": error or None, **sidecars})
    return rows


def cut_eval_set(cfg: EvalSetConfig) -> EvalCuts:
    """List the items in a fixed order and cut them into chunks of ``cfg.chunk_size``."""
    so = cfg.storage_options
    fs, path = url_to_fs(cfg.source, so)
    name = cfg.name or posixpath.basename(path.rstrip("/")).split(".")[0] or "benchmark"
    size = cfg.chunk_size
    if fs.isfile(path) and path.endswith(TABLE_SUFFIXES):
        table = read_table(cfg.source, so)
        base = posixpath.dirname(cfg.source.rstrip("/"))
        roots = allowed_roots(base, cfg.allow_roots)
        columns = set(table.column_names)
        rows = []
        for i, row in enumerate(table.to_pylist()):
            item_id = _as_text(row.get(cfg.id_column)) if cfg.id_column in columns else None
            image = _as_text(row.get(cfg.image_column)) if cfg.image_column and cfg.image_column in columns else None
            uri, error = resolve_input(base, image, roots) if image else (None, "")
            rows.append({"item_id": item_id or f"row-{i:06d}", "image_source": image, "uri": uri,
                         "error": error or None,
                         "fields": {f: _as_text(row.get(f)) for f in _wanted_fields(cfg) if f in columns}})
        _check_unique([r["item_id"] for r in rows], cfg.source)
        chunks = [EvalChunk(f"{c:06d}", "table", s, tuple(rows[s:s + size]), base=base)
                  for c, s in enumerate(range(0, len(rows), size))]
        return EvalCuts("table", name, chunks, [cfg.source])
    if fs.isfile(path) and path.endswith(".tar"):
        prefix = posixpath.basename(path)[:-4]
        return EvalCuts("tars", name, [EvalChunk("000000", "tar", 0, uri=cfg.source, prefix=prefix)], [cfg.source])
    if not fs.isdir(path):
        raise FileNotFoundError(f"evaluation set {cfg.source} does not exist")
    root = cfg.source.rstrip("/")
    tars = [rel for rel, _ in list_folder(root, so) if rel.endswith(".tar")]
    if tars:
        roots = allowed_roots(root, cfg.allow_roots)
        chunks = []
        for i, rel in enumerate(tars):
            uri, error = resolve_input(root, rel, roots)
            chunks.append(EvalChunk(f"{i:06d}", "tar", 0, uri=uri or "", prefix=rel[:-4], base=root, error=error))
        return EvalCuts("tars", name, chunks, [c.uri for c in chunks if c.uri])
    rows = _folder_rows(root, cfg)
    chunks = [EvalChunk(f"{c:06d}", "folder", s, tuple(rows[s:s + size]), base=root)
              for c, s in enumerate(range(0, len(rows), size))]
    return EvalCuts("folder", name, chunks, [])


def _check_unique(ids: list[str], where: str) -> None:
    seen: set[str] = set()
    dup = sorted({i for i in ids if i in seen or seen.add(i)})
    if dup:
        raise ValueError(f"{where}: item ids must be unique; repeated: {', '.join(dup[:5])}"
                         f"{', …' if len(dup) > 5 else ''}")


def _read_sidecar(location: str, roots: list[str], options: dict[str, Any]) -> bytes | None:
    """A sidecar's bytes, or None when it cannot or may not be read (it is then not used)."""
    try:
        return read_input(location, roots, options)
    except OSError:
        return None


def _chunk_items(chunk: EvalChunk, cfg: EvalSetConfig) -> Iterator[tuple[dict[str, Any], bytes | None]]:
    """``(item, image bytes or None)`` in chunk order; read failures become the item's error."""
    so = cfg.storage_options
    wanted = _wanted_fields(cfg)
    if chunk.kind == "tar" and chunk.error:
        yield {"item_id": chunk.prefix, "image_source": chunk.prefix, "error": chunk.error, "fields": {}}, None
        return
    if chunk.kind == "tar":
        base = chunk.prefix or posixpath.basename(chunk.uri)[:-4]
        with fsspec.open(chunk.uri, "rb", **so) as f:
            for sample in iter_tar_samples(f):
                item_id = f"{base}/{sample.key}"
                if sample.error is not None:
                    yield {"item_id": item_id, "image_source": item_id,
                           "error": tar_member_reason(sample.error.reason), "fields": {}}, None
                    continue
                fields: dict[str, Any] = {}
                if "json" in sample.members:
                    fields.update(_json_fields(sample.members["json"], wanted))
                if "txt" in sample.members:
                    fields[CAPTION_FIELD] = sample.members["txt"].decode("utf-8", "replace")
                exts = [e for e in sample.members if "." + e in IMAGE_SUFFIXES]
                data = sample.members[exts[0]] if exts else None
                error = (image_refusal(data) if data is not None else None) if exts else "no_image_member"
                yield {"item_id": item_id, "image_source": f"{chunk.uri}#{sample.key}",
                       "error": error, "fields": fields}, None if error else data
        return
    roots = allowed_roots(chunk.base, cfg.allow_roots)
    for row in chunk.rows:
        item = {k: row[k] for k in ("item_id", "image_source", "error")}
        item["fields"] = dict(row.get("fields") or {})
        if row.get("json") and (raw := _read_sidecar(row["json"], roots, so)) is not None:
            item["fields"].update(_json_fields(raw, wanted))
        if row.get("txt") and (raw := _read_sidecar(row["txt"], roots, so)) is not None:
            item["fields"][CAPTION_FIELD] = raw.decode("utf-8", "replace")
        data = None
        if row.get("uri") and not row.get("error"):
            data, item["error"] = read_image(row["uri"], roots, so, row["image_source"])
        yield item, data


def _json_fields(data: bytes, wanted: list[str]) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return {k: _as_text(v) for k, v in obj.items() if k in wanted} if isinstance(obj, dict) else {}


def chunk_inputs(chunk: EvalChunk, cfg: EvalSetConfig) -> Any:
    """What a chunk's content depends on: its rows and a stamp of every file it reads."""
    so = cfg.storage_options
    if chunk.kind == "tar":
        return [chunk.uri, chunk.prefix, uri_stamp(chunk.uri, so)]
    stamps = []
    for row in chunk.rows:
        files = [row.get(k) for k in ("uri", "txt", "json") if row.get(k) and not row.get("error")]
        stamps.append([f"{f}@{_stamp_or_missing(f, so)}" for f in files])
    return [list(chunk.rows), stamps]


def _stamp_or_missing(uri: str, options: dict[str, Any]) -> str:
    try:
        return uri_stamp(uri, options)
    except (FileNotFoundError, OSError):
        return "missing"


def item_sha256(item_id: str, texts: dict[str, Any], answer: str | None, category: str | None,
                image_sha256: str | None) -> str:
    """One item's content hash: what a later fixture edit or image swap changes."""
    return hashlib.sha256(canonical_json({"id": item_id, "texts": texts, "answer": answer, "category": category,
                                          "image_sha256": image_sha256}).encode()).hexdigest()


def judge_eval_chunk(out: Store, eval_store: Store, chunk: EvalChunk, cfg: EvalSetConfig
                     ) -> tuple[str, str, UnitKey, Marker | None]:
    """Skip or compute one evaluation chunk, and why: what :func:`stage_chunk` does and
    ``corpusforge plan`` predicts, from one function. Stats the chunk's files; reads its two
    markers (items, staging). Returns (action, reason, fingerprint, the items marker)."""
    fields_cfg = {"eval_set": {name: getattr(cfg, name) for name in
                               ("text_fields", "answer_field", "category_field", "id_column", "image_column")}}
    fp = unit_fingerprint("contamination-eval-items", code_version(__name__), fields_cfg, chunk_inputs(chunk, cfg))
    marker = read_marker(out, eval_items_path(chunk.name))
    action, reason = explain(marker, fp)
    if action == SKIPPED and current_marker(eval_store, staging_tar(chunk.name), fp) is None:
        return COMPUTED, "its staging shard is not complete", fp, marker
    return action, reason, fp, marker


def stage_chunk(out: Store, eval_store: Store, chunk: EvalChunk, cfg: EvalSetConfig) -> UnitResult:
    """Read one chunk's items, write their images as a staging shard and their rows as items; the
    items marker's ``info``: items, staged, image errors, the staging marker's digest."""
    action, _, fp, marker = judge_eval_chunk(out, eval_store, chunk, cfg)
    if action == SKIPPED and marker is not None:
        return UnitResult.of(marker, SKIPPED)

    rows, records, samples = [], [], []
    row_no = chunk.first_row
    for item, data in _chunk_items(chunk, cfg):
        key = item_key(item["item_id"])
        sha = hashlib.sha256(data).hexdigest() if data else None
        texts = {f: item["fields"].get(f) for f in cfg.text_fields}
        answer = item["fields"].get(cfg.answer_field) if cfg.answer_field else None
        category = item["fields"].get(cfg.category_field) if cfg.category_field else None
        rows.append({"item_id": item["item_id"], "row": row_no, "key": key,
                     "item_sha256": item_sha256(item["item_id"], texts, answer, category, sha),
                     "image_source": item.get("image_source"), "image_sha256": sha,
                     "image_bytes": len(data) if data else None, "image_error": item.get("error"),
                     "category": category, "answer": answer, "texts": canonical_json(texts)})
        if data:
            ext = sniff_ext(data)
            records.append({"key": key, "part": 0, "row": len(records), "sha256": sha, "ext": ext,
                            "bytes": len(data)})
            samples.append(Sample(key, {ext: data}))
        row_no += 1
    _check_unique([r["item_id"] for r in rows], chunk.uri or chunk.name)
    if len({r["key"] for r in rows}) != len(rows):
        raise ValueError(f"chunk {chunk.name}: two item ids share a staging key")
    with eval_store.atomic_write(staging_tar(chunk.name)) as f:
        result = write_tar(f, samples)
    staged = {staging_tar(chunk.name): result.sha256,
              staging_index(chunk.name): eval_store.write_parquet(staging_index(chunk.name), result.index),
              staging_records(chunk.name): eval_store.write_parquet(
                  staging_records(chunk.name), pa.Table.from_pylist(records, schema=STAGING_RECORDS_SCHEMA))}
    images = fingerprint([(r["key"], r["sha256"], r["ext"]) for r in records])
    staging_marker = finish_unit(eval_store, staging_tar(chunk.name), fp, staged,
                                 {"shard": chunk.name, "count": result.count, "bytes": result.bytes,
                                  "images": images})
    table = pa.Table.from_pylist(rows, schema=EVAL_ITEM_SCHEMA)
    outputs = {eval_items_path(chunk.name): out.write_parquet(eval_items_path(chunk.name), table)}
    info = {"items": len(rows), "staged": len(records),
            "image_errors": sum(1 for r in rows if r["image_error"]), "staging_digest": staging_marker.digest}
    return UnitResult.of(finish_unit(out, eval_items_path(chunk.name), fp, outputs, info), COMPUTED)
