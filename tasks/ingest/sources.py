"""Input discovery: turn any accepted source into numbered ingest partitions.

The source kinds (a metadata table or URL list, WebDataset tars or a GPIC release, a bare folder
of images; local or any fsspec URI) and how each is detected: docs/ingest.md. Tables and folders
are streamed once into ``work/input/{part}.parquet`` chunks of a fixed number of rows in input
order, with columns normalised to :data:`INPUT_COLUMNS`; tars are one partition each. Partitions
are the unit of parallel ingest, and their order is the corpus's input order. A folder's listing
is spilled to the output's work area as it comes (``work/.listing/``) and sorted, its sidecars
matched to their images, one range of keys at a time (:mod:`corpusforge.key_ranges`): no process
holds the corpus's paths.

Each partition carries a content digest for the stage contract: the SHA-256 of its chunk file
(rows and their metadata), or for a tar its stamp (:func:`corpusforge.storage.file_stamp`), which
notices a changed file without reading it again, as make and rsync do, even when its mtime was
set back (docs/ingest.md, source stamps).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import posixpath
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pydantic import Field

from corpusforge.config import StrictModel
from corpusforge.contract import Unit, current_marker, finish_unit, must_compute, prune, read_pinned, unit_fingerprint
from corpusforge.key_ranges import Table, key_ranges
from corpusforge.layout import TABLE_SUFFIXES, part_name
from tasks.ingest.files import INPUT_DIR, INPUT_SCHEMA, LISTING_SPILL_DIR, input_path, listing_spill_path
from corpusforge.storage import Store, file_stamp, is_remote, url_to_fs
from corpusforge.version import code_version
from tasks.shared.inputs import local_file_refusal, read_local, walk_local
from tasks.shared import listing
from tasks.shared.listing import Listed, sorted_ranges, spill_listing

METADATA_COLUMNS = ["key", "caption", "caption_type", "source", "license", "license_url",
                    "attribution", "retrieved_at"]
INPUT_COLUMNS = INPUT_SCHEMA.names
IMAGE_EXTS = {"jpg", "jpeg", "png", "webp"}
SIDECAR_ORDER = ("txt", "json")  # a caption from .txt comes first and wins over the JSON's
GPIC_SPLITS = ("train", "val", "test")


class SourceConfig(StrictModel):
    """How to read the input corpus."""

    kind: Literal["auto", "table", "tars", "folder"] = Field(
        "auto", description="Input kind; 'auto' detects a metadata table, tars or a bare image folder.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Map corpusforge column names (key, path, caption, …) to the table's own column names.")
    partition_size: int = Field(500, ge=1, description="Records per ingest partition (table and folder inputs).")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options for the source.")
    allow_roots: list[str] = Field(
        default_factory=list,
        description="Further folders or URI prefixes (e.g. 's3://bucket/images/') that metadata paths may "
                    "point into. By default only the source's own folder (and, for a source on an object "
                    "store, that store's protocol) is readable.")
    verify: Literal["stamp", "content"] = Field(
        "stamp",
        description="How a rerun notices a changed input file: 'stamp' (size, mtime, ctime and inode locally, "
                    "the ETag on object stores) or 'content' (also re-hash every image and tar on every run, "
                    "for the paranoid: the whole source is read again).")


@dataclass(frozen=True)
class Partition:
    """One unit of ingest work. ``uri`` is a tar (kind 'tar') or the normalised input chunk (kind
    'rows', or 'urls' for a URL list's, whose images the fetch unit fetched)."""

    index: int
    kind: Literal["rows", "tar", "urls"]
    uri: str
    base: str    # folder that relative paths in the chunk are resolved against
    digest: str  # SHA-256 of the chunk file, or the tar's stamp

    @property
    def name(self) -> str:
        return f"{self.index:06d}"


def _full(fs: fsspec.AbstractFileSystem, path: str, like: str) -> str:
    """A path returned by ``fs`` turned back into a URI of the same kind as ``like``."""
    return fs.unstrip_protocol(path) if is_remote(like) else path


def detect_kind(src: str, options: dict[str, Any]) -> tuple[str, str]:
    """(kind, resolved uri): the table file for 'table', else ``src`` itself."""
    fs, path = url_to_fs(src, options)
    if fs.isfile(path):
        if path.endswith(TABLE_SUFFIXES):
            return "table", src
        if path.endswith(".tar"):
            return "tars", src
        raise ValueError(f"{src}: not a metadata table (.parquet/.jsonl/.csv) or a .tar")
    if not fs.isdir(path):
        raise FileNotFoundError(f"source {src} does not exist")
    for suffix in TABLE_SUFFIXES:
        candidate = posixpath.join(path, f"metadata{suffix}")
        if fs.isfile(candidate):
            return "table", _full(fs, candidate, src)
    if tar_entries(fs, path):
        return "tars", src
    return "folder", src


def _glob(fs: fsspec.AbstractFileSystem, pattern: str) -> list[tuple[str, dict[str, Any]]]:
    """Matches of ``pattern``, sorted, each with its listing entry (one listing per folder:
    no request per file for its stamp)."""
    return sorted(fs.glob(pattern, detail=True).items())


def tar_entries(fs: fsspec.AbstractFileSystem, path: str) -> list[tuple[str, dict[str, Any] | None]]:
    """A tar source's tars, each with its listing entry (None for a single file): the file itself,
    the folder's ``*.tar``, or a GPIC release root's (``train/``, ``val/``, ``test/`` folders of
    ``gpic_{split}_NNNNN.tar``), split by split in GPIC's order, shards in index order."""
    if fs.isfile(path):
        return [(path, None)]
    gpic = [e for split in GPIC_SPLITS for e in _glob(fs, posixpath.join(path, split, "*.tar"))]
    return [*_glob(fs, posixpath.join(path, "*.tar")), *gpic]


def source_split_of(tar_uri: str) -> str | None:
    """train/val/test when a source tar lies in a GPIC release root's split folder."""
    parts = tar_uri.rstrip("/").split("/")
    return parts[-2] if len(parts) >= 2 and parts[-2] in GPIC_SPLITS else None


def _table_batches(uri: str, options: dict[str, Any], chunk: int) -> Iterator[pa.Table]:
    """Stream a metadata table in chunks without reading it whole; an unreadable table is
    one error naming the file."""
    try:
        with fsspec.open(uri, "rb", **options) as f:
            if uri.endswith(".parquet"):  # decoded in this thread: the pool's threads each kept a row group's worth
                for batch in pq.ParquetFile(f).iter_batches(batch_size=chunk, use_threads=False):
                    yield pa.Table.from_batches([batch])
            elif uri.endswith(".csv"):
                convert = pacsv.ConvertOptions(strings_can_be_null=False, column_types=None)
                reader = pacsv.open_csv(f, read_options=pacsv.ReadOptions(block_size=1 << 22),
                                        convert_options=convert)
                for batch in reader:
                    yield pa.Table.from_batches([batch])
            else:  # JSONL, line by line so memory stays bounded
                rows: list[dict[str, Any]] = []
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{uri}:{lineno}: invalid JSON ({exc})") from exc
                    if len(rows) == chunk:
                        yield pa.Table.from_pylist(rows)
                        rows = []
                if rows:
                    yield pa.Table.from_pylist(rows)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"{uri}: not a readable table ({exc})") from exc


def _as_text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):  # NaN
        return None
    return value if isinstance(value, str) else str(value)


_EXTRA_JSON = json.JSONEncoder(sort_keys=True, default=str).encode


def normalise_table(table: pa.Table, mapping: dict[str, str], urls: bool = False) -> pa.Table:
    """``table``'s rows with corpusforge column names (:data:`INPUT_SCHEMA`), column by
    column: string columns pass through as Arrow arrays, others become text value by value;
    unmapped columns go to ``extra`` as one JSON object per row (so does a ``url`` column,
    unless the table is a URL list). A later column mapped onto the same name wins."""
    reverse = {theirs: ours for ours, theirs in mapping.items()}
    internal = ("extra", "warning", "sidecars") if urls else ("extra", "warning", "sidecars", "url")
    n = table.num_rows
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    extra: dict[str, list[Any]] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        ours = reverse.get(name, name)
        if ours in INPUT_COLUMNS and ours not in internal:
            columns[ours] = (column.cast(pa.string()) if pa.types.is_string(column.type)
                             or pa.types.is_large_string(column.type)
                             else pa.array([_as_text(v) for v in column.to_pylist()], pa.string()))
        else:
            extra[name] = column.to_pylist()
    if extra:
        names = list(extra)
        columns["extra"] = pa.array([_EXTRA_JSON(dict(zip(names, values, strict=True)))
                                     for values in zip(*extra.values(), strict=True)], pa.string())
    return pa.table([columns.get(c, pa.nulls(n, pa.string())) for c in INPUT_COLUMNS], schema=INPUT_SCHEMA)


def _write_tables(store: Store, tables: Iterator[pa.Table], size: int, base: str,
                  kind: Literal["rows", "urls"] = "rows") -> list[Partition]:
    """Normalised tables cut into chunk files of ``size`` rows, in order: at most one chunk
    and one table held. A chunk's bytes depend on its rows only, not on how they were read."""
    parts: list[Partition] = []
    pending: list[pa.Table] = []
    held = 0

    def flush(chunk: pa.Table) -> None:
        index = len(parts)
        rel = input_path(index)
        parts.append(Partition(index, kind, store.path(rel), base, store.write_parquet(rel, chunk.combine_chunks())))

    for table in tables:
        pending.append(table)
        held += table.num_rows
        while held >= size:
            whole = pa.concat_tables(pending)
            flush(whole.slice(0, size))
            pending, held = [whole.slice(size)], held - size
    if held:
        flush(pa.concat_tables(pending))
    return parts


def is_url_list(uri: str, cfg: SourceConfig) -> bool:
    """A table whose rows carry a ``url`` column and no ``path`` column is a URL list (its first
    rows decide; paths are never taken as URLs: :func:`locate` refuses http(s) in a path)."""
    first = next(_table_batches(uri, cfg.storage_options, 1), None)
    names = first.column_names if first is not None else []
    return cfg.columns.get("path", "path") not in names and cfg.columns.get("url", "url") in names


def _table_rows(uri: str, cfg: SourceConfig, urls: bool = False) -> Iterator[pa.Table]:
    for ours in ("path", "url"):
        if ours not in cfg.columns and ours in cfg.columns.values():
            raise ValueError(f"column mapping maps another name onto '{ours}'")
    required = cfg.columns.get("url" if urls else "path", "url" if urls else "path")
    for table in _table_batches(uri, cfg.storage_options, cfg.partition_size):
        if required not in table.column_names:
            what = "a URL list's required column" if urls else "the only required column, or 'url' for a URL list"
            raise ValueError(f"{uri}: no '{required}' column ({what})")
        yield normalise_table(table, cfg.columns, urls)


def parse_sidecar(data: bytes) -> tuple[dict[str, Any], str | None]:
    """A JSON metadata sidecar as a dict, and a warning when it could not be used: malformed
    JSON or not an object is never silently taken as ``{}``."""
    try:
        loaded = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return {}, f"bad_sidecar: invalid JSON ({exc}); its metadata (licence, attribution…) was not used"
    if not isinstance(loaded, dict):
        return {}, f"bad_sidecar: JSON {type(loaded).__name__}, not an object; its metadata was not used"
    return loaded, None


SPILL_SCHEMA = pa.schema([
    ("path", pa.string()),
    ("key", pa.string()),               # an image's or sidecar's stem (the path less its extension), else the path
    ("image", pa.bool_()),
    ("readable_sidecar", pa.bool_()),   # named like a sidecar (any case) and a regular file inside the folder
    ("sidecar_ext", pa.string()),       # 'txt' or 'json' when it is also named as an image's sidecar is
])


def _spill_table(entries: list[Listed], root: str) -> pa.Table:
    """A spill part: each entry with what matching sidecars to images needs. A sidecar is
    readable when it is a regular file, or (the rare link or special file named like one)
    when :func:`local_file_refusal` lets it be read."""
    columns: dict[str, list[Any]] = {name: [] for name in SPILL_SCHEMA.names}
    for path, regular, _ in entries:
        stem, _, ext = path.rpartition(".")
        image, sidecar = ext.lower() in IMAGE_EXTS, ext.lower() in SIDECAR_ORDER
        readable = sidecar and (regular or local_file_refusal(path, [root]) is None)
        columns["path"].append(path)
        columns["key"].append(stem if image or sidecar else path)
        columns["image"].append(image)
        columns["readable_sidecar"].append(readable)
        columns["sidecar_ext"].append(ext if readable and ext in SIDECAR_ORDER else None)
    return pa.table(columns, schema=SPILL_SCHEMA)


KEPT_SCHEMA = pa.schema([("key", pa.string()), ("sidecars", pa.string())])  # key: the path


def _kept(entries: pa.Table) -> pa.Table:
    """The rows a range of the listing's entries keeps (by :data:`SPILL_SCHEMA`'s key, so an
    image and its sidecars lie in one range): every entry but the sidecars matched to an image,
    an image with the sidecars named exactly {stem}.txt / {stem}.json. A stem is matched when
    it has an image and a readable sidecar-named entry (any case)."""
    stems = entries.select(["key", "image", "readable_sidecar"])
    for e in SIDECAR_ORDER:
        stems = stems.append_column(e, pc.equal(entries["sidecar_ext"], e))
    stems = stems.group_by("key", use_threads=False).aggregate(
        [(c, "any") for c in ("image", "readable_sidecar", *SIDECAR_ORDER)])
    matched = stems.filter(pc.and_(stems["image_any"], stems["readable_sidecar_any"]))
    matched = matched.select(["key", "txt_any", "json_any"]).append_column(
        "matched", pa.array([True] * matched.num_rows, pa.bool_()))
    joined = entries.join(matched, "key", join_type="left outer", use_threads=False)
    hit = pc.is_valid(joined["matched"])
    has = {e: pc.fill_null(pc.and_(pc.and_(joined["image"], hit), joined[f"{e}_any"]), False) for e in SIDECAR_ORDER}
    sidecars = pc.case_when(pc.make_struct(pc.and_(has["txt"], has["json"]), has["txt"], has["json"]),
                            "txt,json", "txt", "json")
    keep = pc.invert(pc.and_(joined["readable_sidecar"], hit))
    return pa.table({"key": joined["path"], "sidecars": sidecars}, schema=KEPT_SCHEMA).filter(keep)


def _sorted_kept(store: Store, parts: list[str], remote: bool) -> Iterator[pa.Table]:
    """The listing's kept rows (:data:`KEPT_SCHEMA`) in the spill ``parts``, in ranges sorted by path.

    Two passes of key ranges: sidecars are matched to images by ranges of stems (:func:`_kept`,
    one spill part per range), then the kept rows sorted by ranges of paths. One pass cannot do
    both: stems do not sort as their paths do ('a.jq.png' lies between 'a.jpg' and 'a.json')."""
    kept: list[str] = []
    for ranged in key_ranges({"entries": Table(store, parts, SPILL_SCHEMA)}, listing.LISTING_RANGE_ROWS,
                             listing.LISTING_FAN_OUT):
        kept.append(listing_spill_path("kept", len(kept)))
        store.write_parquet(kept[-1], _kept(ranged["entries"]))
    return sorted_ranges(store, kept, KEPT_SCHEMA, "key", remote)


def _folder_tables(src: str, cfg: SourceConfig, store: Store) -> Iterator[pa.Table]:
    """Every file of a bare folder in sorted order, as input rows; an image's caption/metadata
    sidecars are named in its row (``sidecars``) and read at ingest, in parallel over partitions.
    Nothing is skipped silently: links and special files become rows (and error records at
    ingest); a sidecar is attached only when it is a regular file inside the folder. Rows stream
    from the spilled listing (:func:`_sorted_kept`), so memory stays bounded at any size."""
    fs, root = url_to_fs(src, cfg.storage_options)
    remote = is_remote(src)
    if not remote:
        root = root.rstrip("/") or "/"
    store.remove(LISTING_SPILL_DIR)
    try:
        parts = spill_listing(store, LISTING_SPILL_DIR, fs, root, remote, lambda e: _spill_table(e, root))
        if not parts:
            return
        for kept in _sorted_kept(store, parts, remote):
            paths = pa.array([posixpath.relpath(p, root) for p in kept["key"].to_pylist()], pa.string())
            given = {"path": paths, "sidecars": kept["sidecars"]}
            yield pa.table([given.get(c, pa.nulls(len(paths), pa.string())) for c in INPUT_COLUMNS],
                           schema=INPUT_SCHEMA)
    finally:
        store.remove(LISTING_SPILL_DIR)


def why_empty(src: str, cfg: SourceConfig) -> str | None:
    """What makes the source hold no input record (an empty table, a header-only CSV, an
    empty folder), or None when it holds at least one. Reads as little as it can: the
    first rows of a table, the listing up to the first file; writes nothing, so the CLI
    can ask before anything starts. An unreadable table raises ValueError naming it."""
    kind, uri = detect_kind(src, cfg.storage_options) if cfg.kind == "auto" else (cfg.kind, src)
    fs, path = url_to_fs(uri, cfg.storage_options)
    if kind == "table":
        has_rows = any(t.num_rows for t in _table_batches(uri, cfg.storage_options, 1))
        return None if has_rows else f"table {uri} has no rows"
    if kind == "tars":
        return None if tar_entries(fs, path) else f"folder {uri} holds no .tar"
    if fs.isfile(path):
        return None
    for folder, dirs, files in fs.walk(path):
        if files or (not is_remote(uri) and any(os.path.islink(posixpath.join(folder, d)) for d in dirs)):
            return None
    return f"folder {uri} holds no file"


def read_sidecars(location: str, exts: str, options: dict[str, Any]) -> dict[str, Any]:
    """The caption and metadata columns (and ``warning``) from an image's sidecars, as the
    folder listing named them (``exts``: "txt", "json" or "txt,json"); the ``.txt`` caption
    wins over a caption in the JSON. An unreadable sidecar is a warning, never a failure."""
    out: dict[str, Any] = {}
    for path in sidecar_locations(location, exts):
        ext = path.rpartition(".")[2]
        try:
            data = _read_sidecar(path, options)
        except (OSError, ValueError) as exc:
            out["warning"] = f"bad_sidecar: {ext} unreadable ({type(exc).__name__}: {exc}); it was not used"
            continue
        if ext == "txt":
            out["caption"] = data.decode("utf-8", "replace").strip()
        else:
            meta, warning = parse_sidecar(data)
            out["warning"] = out.get("warning") or warning
            for name in METADATA_COLUMNS:
                if name in meta and out.get(name) is None:
                    out[name] = _as_text(meta[name])
    return out


def _read_sidecar(location: str, options: dict[str, Any]) -> bytes:
    """A sidecar's bytes; a local one opened without blocking and refused unless it is still
    a regular file (the listing saw one, but the folder may have changed since)."""
    if is_remote(location):
        fs, path = url_to_fs(location, options)
        return fs.cat_file(path)
    return read_local(os.path.realpath(location), sys.maxsize)


def sidecar_locations(location: str, exts: str) -> list[str]:
    """Where an image's sidecars lie, in the order they are read."""
    stem = location.rpartition(".")[0]
    return [f"{stem}.{ext}" for ext in exts.split(",")]


def cut_partitions(src: str, store: Store, cfg: SourceConfig) -> tuple[str, list[Partition]]:
    """Detect the source kind and return it with the ingest partitions in input order.

    Chunks of an earlier cut beyond this cut's last partition are removed."""
    kind, uri = detect_kind(src, cfg.storage_options) if cfg.kind == "auto" else (cfg.kind, src)
    if kind == "tars":
        fs, path = url_to_fs(uri, cfg.storage_options)
        content = cfg.verify == "content"
        parts = [Partition(i, "tar", _full(fs, t, uri), "", file_stamp(fs, t, info, content=content))
                 for i, (t, info) in enumerate(tar_entries(fs, path))]
    elif kind == "table":
        kind, parts = _cut_table(store, uri, cfg)
    else:
        parts = _cut_folder(store, uri, cfg)
    if not parts:
        raise ValueError(f"source {src}: no input records (empty {kind}); nothing to build")
    kept = {TABLE_CUTS_STEM} if kind in ("table", "urls") or (kind == "folder" and not is_remote(uri)) else set()
    prune(store, INPUT_DIR, {part_name(p.index) for p in parts if p.kind != "tar"} | kept)
    return kind, parts


TABLE_CUTS_STEM = "_partitions"
TABLE_CUTS = f"{INPUT_DIR}/{TABLE_CUTS_STEM}.parquet"  # a table's chunks: index and SHA-256, in order
TABLE_CUTS_SCHEMA = pa.schema([("index", pa.int64()), ("digest", pa.string())])


def _cut_table(store: Store, uri: str, cfg: SourceConfig) -> tuple[str, list[Partition]]:
    """A metadata table's chunks, written once per content of the table: a unit keyed by
    the table's stamp (its content hash too with ``verify: content``), the column mapping
    and the partition size. A rerun on an unchanged table reads back the chunk list
    (:data:`TABLE_CUTS`) instead of reading and rewriting every row (minutes at 10⁸),
    unless a chunk file is missing."""
    fs, path = url_to_fs(uri, cfg.storage_options)
    base = _full(fs, posixpath.dirname(path), uri)
    fp = unit_fingerprint("plan-table", code_version(__name__), [cfg.columns, cfg.partition_size],
                          [uri, file_stamp(fs, path, content=cfg.verify == "content")])
    if (current := _read_cuts(store, fp, base)) is not None:
        return current
    must_compute()  # the table is read: a task on the cluster (current cuts are read back when probed)
    urls = is_url_list(uri, cfg)
    kind = "urls" if urls else "table"
    parts = _write_tables(store, _table_rows(uri, cfg, urls), cfg.partition_size, base, "urls" if urls else "rows")
    _write_cuts(store, fp, kind, parts)
    return kind, parts


def _cut_folder(store: Store, uri: str, cfg: SourceConfig) -> list[Partition]:
    """A bare folder's chunks. A local folder's are written once per listing: a unit keyed by
    :func:`folder_stamp` (all the listing reads of the folder) and the partition size, so a
    rerun on an unchanged folder walks its directory entries in this process and reads back the
    chunk list (no task run, no cluster); a changed one is listed by a task. A remote prefix
    is listed by a task on every run (walking it here would be a serial round trip a page)."""
    base = uri.rstrip("/")
    fp = None if is_remote(uri) else unit_fingerprint(  # the stamp taken before the listing: a change meanwhile lists again
        "plan-folder", code_version(__name__), [cfg.partition_size],
        [base, folder_stamp(url_to_fs(uri, cfg.storage_options)[1].rstrip("/") or "/")])
    if fp is not None and (current := _read_cuts(store, fp, base)) is not None:
        return current[1]
    must_compute()  # the folder is listed: a task on the cluster
    with contextlib.closing(_folder_tables(uri, cfg, store)) as tables:
        parts = _write_tables(store, tables, cfg.partition_size, base)
    if fp is not None:
        _write_cuts(store, fp, "folder", parts)
    return parts


def folder_stamp(root: str) -> str:
    """What a local folder's listing depends on, as one digest: every entry's path, whether it
    is a regular file, and for a sidecar-named link or special file whether it may be read
    (:func:`_spill_table`). From the directory entries only (no stat of a regular file, no file
    read); entries hashed one by one and summed, so the walk's order does not matter and no
    path is held."""
    total, count = 0, 0
    for path, regular in walk_local(root):
        readable = not regular and path.rpartition(".")[2].lower() in SIDECAR_ORDER \
            and local_file_refusal(path, [root]) is None
        line = f"{posixpath.relpath(path, root)}\0{regular:d}{readable:d}".encode("utf-8", "surrogateescape")
        total += int.from_bytes(hashlib.sha256(line).digest(), "big")
        count += 1
    return f"{count}:{total % (1 << 256):064x}"


def _read_cuts(store: Store, fp: str, base: str) -> tuple[str, list[Partition]] | None:
    """The source kind and partitions of a current cut (its marker has ``fp`` and every chunk
    file is there), else None."""
    marker = current_marker(store, TABLE_CUTS, fp)
    if marker is None:
        return None
    listed = pq.read_table(io.BytesIO(read_pinned(store, TABLE_CUTS, marker.outputs[TABLE_CUTS], "input planning")))
    present = set(store.listdir(INPUT_DIR))
    if not all(f"{part_name(i)}.parquet" in present for i in listed["index"].to_pylist()):
        return None
    kind = marker.info["kind"]
    return kind, [Partition(i, "urls" if kind == "urls" else "rows", store.path(input_path(i)), base, d)
                  for i, d in zip(listed["index"].to_pylist(), listed["digest"].to_pylist(), strict=True)]


def _write_cuts(store: Store, fp: str, kind: str, parts: list[Partition]) -> None:
    """Mark a cut done: its chunks' indexes and digests in :data:`TABLE_CUTS` (none: the caller
    refuses the empty source before any output exists)."""
    if parts:
        listed = pa.table({"index": [p.index for p in parts], "digest": [p.digest for p in parts]},
                          schema=TABLE_CUTS_SCHEMA)
        finish_unit(store, TABLE_CUTS, fp, {TABLE_CUTS: store.write_parquet(TABLE_CUTS, listed)},
                    {"kind": kind, "partitions": len(parts)})


# probed: a table's and a local folder's current cuts are read back, and a folder of tars listed,
# by the flow (no task run); a changed table or folder, and a remote folder, by a task
CUT_INPUTS = Unit(cut_partitions, "plan-inputs", probe=True)
