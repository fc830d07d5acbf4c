"""Evaluate generated images against reference statistics (GPIC §3, App. B).

Generated images (folders of image files or WebDataset tars, local or any fsspec URI) are
listed in a fixed order and cut into chunks (a slice of files, or one tar); each image is decoded
at full resolution (no JPEG draft: the protocol resizes from the original pixels), preprocessed by
the model and embedded. An image that cannot be decoded is counted with its reason and left out;
it never stops the run.

The listing (:func:`write_generated_listing`) and the metrics (:func:`evaluate_unit`) are tasks, so
the flow process holds O(chunks) whatever the number of images. Each chunk is a unit of the stage
contract (:func:`embed_chunk_unit`) whose features are kept in the feature stage's layout, so
evaluating the same images again neither embeds nor loads the model. The reference is one written
by :mod:`tasks.stats.reference` or a gpic-eval ``test_stats.npz`` (:mod:`tasks.stats.gpic_stats`);
the configured model is checked against the reference's before anything is embedded, the loaded
model's full fingerprint after; a mismatch stops the evaluation unless ``allow_mismatch`` is set, and
is then written as a deviation. Fingerprints, reruns, metrics: docs/statistics.md ("Evaluating generated images").
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import posixpath
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpusforge.contract import (COMPUTED, SKIPPED, Marker, Unit, UnitResult, explain, finish_unit, read_marker,
                                  unit_fingerprint)
from corpusforge.feature_files import read_shard_errors, read_shard_features, write_shard_features
from corpusforge.hashing import fingerprint
from corpusforge.layout import feature_vectors
from corpusforge.storage import Store, file_stamp, is_remote, open_uri, url_to_fs
from corpusforge.tarshard import iter_tar_samples
from corpusforge.version import code_version
from tasks.shared.features.config import ModelSpec, RuntimeConfig
from tasks.shared.features.decode import decode_rgb
from tasks.shared.features.extract import prefetched
from tasks.shared.inputs import InputRefused, image_refusal, open_input, read_image, resolve_input, tar_member_reason
from tasks.shared.listing import Listed, sorted_ranges, spill_listing
from tasks.stats.compare import compare
from tasks.stats.config import PROTOCOL_MODES, MetricsConfig, protocol_model
from tasks.stats.files import EVALUATION_METRICS, EVALUATION_REPORT, GENERATED_LISTING
from tasks.stats.gpic_stats import provenance_of, reference_checks, small_reference_warning, validate_arrays
from tasks.stats.moments import Moments
from tasks.shared.provenance import identity_mismatches, model_deviations

if TYPE_CHECKING:  # torch comes with the model, not with the flows that plan an evaluation
    from tasks.shared.features.base import FeatureModel

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
FORMAT = "corpusforge-evaluation/1"


class ProtocolMismatch(ValueError):
    """The generated images would be embedded differently from the reference."""


# ---- the reference --------------------------------------------------------------

@dataclass
class Reference:
    path: str
    mu: np.ndarray
    sigma: np.ndarray
    n: int
    features: np.ndarray | None
    provenance: dict[str, Any] | None  # None for a GPIC release file
    checks: dict[str, list[str]] | None = None  # a gpic-eval file: what could and could not be checked


def _read(uri: str, storage_options: dict[str, Any]) -> bytes:
    with open_uri(uri, storage_options) as f:
        return f.read()


def _exists(uri: str, storage_options: dict[str, Any]) -> bool:
    fs, path = url_to_fs(uri, storage_options)
    return fs.exists(path)


def load_reference(npz_uri: str, storage_options: dict[str, Any] | None = None) -> Reference:
    """Load reference statistics, their feature subsample and provenance."""
    so = dict(storage_options or {})
    data = _read(npz_uri, so)
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    if "dino_mu" in arrays:  # gpic-eval's format
        validate_arrays(arrays, npz_uri)
        feats = arrays.get("dino_embeddings")
        provenance = provenance_of(npz_uri, data, so)
        n = int(provenance["n"]) if provenance else int(feats.shape[0]) if feats is not None else 0
        return Reference(npz_uri, arrays["dino_mu"].astype(np.float64), arrays["dino_sigma"].astype(np.float64),
                         n, None if feats is None else feats.astype(np.float32), provenance,
                         reference_checks(arrays, provenance))
    stem = npz_uri.removesuffix(".npz")
    if not _exists(f"{stem}.json", so):
        raise FileNotFoundError(f"{stem}.json: reference statistics without their provenance sidecar")
    provenance = json.loads(_read(f"{stem}.json", so))
    feats = None
    if _exists(f"{stem}.features.npy", so):
        feats = np.load(io.BytesIO(_read(f"{stem}.features.npy", so)), allow_pickle=False)
    return Reference(npz_uri, arrays["mu"], arrays["sigma"], int(arrays["n"]), feats, provenance)


def expected_identity(spec: ModelSpec) -> dict[str, Any]:
    """The identity fields a spec fixes before its model is loaded."""
    return {"model_id": spec.model_id, "arch": spec.resolved_arch, "preprocessing": spec.resolved_preprocessing,
            "weights": spec.weights.sha256 if spec.weights else "random-init"}


def check_model(reference: Reference, identity: dict[str, Any], allow_mismatch: bool,
                mode: str = "paper") -> list[str]:
    """Mismatches between the reference's model and ``identity`` (every field ``identity`` has).

    Raises :class:`ProtocolMismatch` when there are any and ``allow_mismatch`` is False.
    A GPIC release file is assumed to use the protocol model of ``mode`` (on GPIC's own
    256x256 images both modes give the same input).
    """
    if reference.provenance is not None:
        ref = reference.provenance["model"]
    else:  # the release does not say which weights file
        ref = {k: v for k, v in expected_identity(protocol_model(mode)).items() if k != "weights"}
    mismatches = identity_mismatches({k: ref.get(k) for k in identity if k in ref},
                                     {k: identity[k] for k in identity if k in ref})
    if mismatches and not allow_mismatch:
        raise ProtocolMismatch("generated images would be embedded differently from the reference "
                               f"{reference.path}: " + "; ".join(mismatches)
                               + " (set allow_mismatch to evaluate anyway, recorded as a deviation)")
    return mismatches


# ---- the generated images --------------------------------------------------------

@dataclass(frozen=True)
class GeneratedChunk:
    """A unit of embedding work: a slice of image files, or one tar; ``stamps``: each
    file's size and modification time (or ETag) from the listing, what its content is
    identified by (as the evaluation sets of :mod:`tasks.contamination.eval_set` are);
    ``roots``: the folders its files were listed in, the only places they may be read
    from (:mod:`tasks.shared.inputs`)."""

    kind: Literal["files", "tar"]
    uris: tuple[str, ...]
    stamps: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The unit's file name: fixed by its files, whatever else the listing holds."""
        return "g" + fingerprint(self.kind, list(self.uris))[:20]


def _ext(path: str) -> str:
    base = posixpath.basename(path)
    return base.rsplit(".", 1)[-1].lower() if "." in base else ""


def _named(uri: str, roots: Sequence[str]) -> tuple[str, str]:
    """(the root a listed file lies in, its path below it): how its errors name it, as the
    build names a source file by its path in the source."""
    for root in roots:
        if uri.startswith(root + "/"):
            return root, uri[len(root) + 1:]
    return uri, posixpath.basename(uri)


def _stamp(uri: str, info: dict[str, Any] | None, roots: Sequence[str], storage_options: dict[str, Any]) -> str:
    """A listed file's stamp, or why it may not be read (it is then that image's error)."""
    location, refusal = resolve_input(*_named(uri, roots), roots)
    if location is None:
        return refusal
    fs, path = url_to_fs(uri, storage_options)
    return file_stamp(fs, path, info)


def _roots(sources: Sequence[str]) -> tuple[str, ...]:
    return tuple(s.rstrip("/") for s in sources)


SPILL_SCHEMA = pa.schema([("uri", pa.string()), ("tar", pa.bool_()), ("stamp", pa.string())])
SPILL_FOLDER = "listing"


def _spilled(entries: list[Listed], source: str, root: str, remote: bool, roots: Sequence[str],
             storage_options: dict[str, Any]) -> pa.Table:
    """A spill part of a folder's listing: its image files and tars, each with its stamp or
    the reason it may not be read."""
    uris, tars, stamps = [], [], []
    for path, _, info in entries:
        uri = posixpath.join(source, path[len(root) + 1:] if remote else posixpath.relpath(path, root))
        ext = _ext(uri)
        if ext in IMAGE_EXTS or ext == "tar":
            uris.append(uri)
            tars.append(ext == "tar")
            stamps.append(_stamp(uri, info, roots, storage_options))
    return pa.table({"uri": uris, "tar": tars, "stamp": stamps}, schema=SPILL_SCHEMA)


def _listed(source: str, spill: Store, roots: Sequence[str], storage_options: dict[str, Any]
            ) -> Iterator[pa.Table]:
    """A source's image files and tars (:data:`SPILL_SCHEMA`) sorted by URI, a key range at a
    time: a folder spilled to ``spill`` as it is listed (links listed, never followed, as the
    build lists a source: :mod:`tasks.shared.listing`), or the file itself."""
    fs, root = url_to_fs(source, storage_options)
    if not fs.isdir(root):
        ext = _ext(source)
        if ext in IMAGE_EXTS or ext == "tar":
            yield pa.table({"uri": [source], "tar": [ext == "tar"], "stamp": [_stamp(source, None, roots,
                                                                                    storage_options)]},
                           schema=SPILL_SCHEMA)
        return
    remote = is_remote(source)
    root = root.rstrip("/") if remote else root.rstrip("/") or "/"
    parts = spill_listing(spill, SPILL_FOLDER, fs, root, remote,
                          lambda e: _spilled(e, source, root, remote, roots, storage_options))
    if parts:
        yield from sorted_ranges(spill, parts, SPILL_SCHEMA, "uri", remote)
    spill.remove(SPILL_FOLDER)


def cut_generated(sources: Sequence[str], storage_options: dict[str, Any] | None = None,
                  chunk_size: int = 1000) -> Iterator[GeneratedChunk]:
    """Chunks over every image file and tar under ``sources`` (folders or files), in order:
    the image files sorted, source by source, ``chunk_size`` to a chunk, then each tar.
    Out of core: a folder's listing is spilled to a local temporary folder and read back
    sorted a key range at a time; a chunk is held until it is handed on, the tars wait in a
    local file. Each file is resolved and stamped as it is listed."""
    so = dict(storage_options or {})
    roots = _roots(sources)
    with tempfile.TemporaryDirectory(prefix="corpusforge-generated-") as tmp:
        spill = Store(tmp, fsync=False)
        tars = os.path.join(tmp, "tars.arrow")
        uris: list[str] = []
        stamps: list[str] = []
        with pa.OSFile(tars, "wb") as sink, pa.ipc.new_stream(sink, SPILL_SCHEMA) as later:
            for source in roots:
                for listed in _listed(source, spill, roots, so):
                    later.write_table(listed.filter(listed["tar"]))
                    files = listed.filter(pc.invert(listed["tar"]))
                    for uri, stamp in zip(files["uri"].to_pylist(), files["stamp"].to_pylist(), strict=True):
                        uris.append(uri)
                        stamps.append(stamp)
                        if len(uris) == chunk_size:
                            yield GeneratedChunk("files", tuple(uris), tuple(stamps), roots)
                            uris, stamps = [], []
        if uris:
            yield GeneratedChunk("files", tuple(uris), tuple(stamps), roots)
        with pa.OSFile(tars, "rb") as source, pa.ipc.open_stream(source) as reader:
            for batch in reader:
                for uri, stamp in zip(batch["uri"].to_pylist(), batch["stamp"].to_pylist(), strict=True):
                    yield GeneratedChunk("tar", (uri,), (stamp,), roots)


LISTING_SCHEMA = pa.schema([("chunk", pa.int32()), ("name", pa.string()), ("kind", pa.string()),
                            ("uri", pa.string()), ("stamp", pa.string())])


@dataclass(frozen=True)
class ListedChunk:
    """A chunk as the flow holds it: its unit's name, its label in the listing file
    (``GENERATED_LISTING``) and how many files it has; the files themselves stay in that file."""

    name: str
    index: int
    files: int


def write_generated_listing(out: Store, sources: Sequence[str], storage_options: dict[str, Any] | None = None,
                            chunk_size: int = 1000) -> list[ListedChunk]:
    """:func:`cut_generated` as a task: the listing goes to ``out``'s listing file, one row
    group a chunk as it is cut, so each embedding task reads its own files and the flow
    holds their names; no chunk but the one being written is held."""
    listed: list[ListedChunk] = []
    with out.write_row_groups(GENERATED_LISTING, LISTING_SCHEMA) as write:
        for index, chunk in enumerate(cut_generated(sources, storage_options, chunk_size)):
            n = len(chunk.uris)
            write(pa.table({"chunk": pa.array([index] * n, pa.int32()), "name": [chunk.name] * n,
                            "kind": [chunk.kind] * n, "uri": list(chunk.uris), "stamp": list(chunk.stamps)},
                           schema=LISTING_SCHEMA))
            listed.append(ListedChunk(chunk.name, index, n))
    return listed


def read_listed_chunk(out: Store, index: int, sources: Sequence[str]) -> GeneratedChunk:
    """Chunk ``index`` of the listing file (its row group alone), as :func:`cut_generated` cut it."""
    with out.open(GENERATED_LISTING) as f:
        table = pq.read_table(f, columns=["kind", "uri", "stamp"], filters=[("chunk", "=", index)])
    if not table.num_rows:
        raise FileNotFoundError(f"{out.path(GENERATED_LISTING)} has no chunk {index}")
    return GeneratedChunk(table["kind"][0].as_py(), tuple(table["uri"].to_pylist()),
                          tuple(table["stamp"].to_pylist()), _roots(sources))


def listed_chunk_names(out: Store) -> list[str]:
    """Every chunk's name in the listing file, in order."""
    with out.open(GENERATED_LISTING) as f:
        return pc.unique(pq.read_table(f, columns=["name"])["name"]).to_pylist()


def iter_chunk_images(chunk: GeneratedChunk, storage_options: dict[str, Any] | None = None
                      ) -> Iterator[tuple[str, bytes | None, str | None]]:
    """``(name, image bytes, error)`` for every image of a chunk, in order."""
    so = dict(storage_options or {})
    if chunk.kind == "files":
        for uri in chunk.uris:
            yield uri, *read_image(uri, chunk.roots, so, _named(uri, chunk.roots)[1])
        return
    (uri,) = chunk.uris
    try:
        f = open_input(uri, chunk.roots, so, path=_named(uri, chunk.roots)[1])
    except InputRefused as exc:
        yield uri, None, exc.reason
        return
    with f:
        for sample in iter_tar_samples(f):
            name = f"{uri}#{sample.key}"
            if sample.error is not None:
                yield name, None, tar_member_reason(sample.error.reason)
                continue
            exts = [e for e in sample.members if e in IMAGE_EXTS]
            if exts:
                data = sample.members[exts[0]]
                refusal = image_refusal(data)
                yield f"{name}.{exts[0]}", None if refusal else data, refusal


@dataclass
class ChunkFeatures:
    names: list[str]
    features: np.ndarray  # float32 [len(names), dim]
    errors: dict[str, str] = field(default_factory=dict)  # name -> reason
    identity: dict[str, Any] = field(default_factory=dict)
    # every image in order: (name, SHA-256 of its bytes or None, error or None), what the unit stores
    items: list[tuple[str, str | None, str | None]] = field(default_factory=list)


def _prepare(item: tuple[str, bytes | None, str | None], model: FeatureModel
             ) -> tuple[str, str | None, np.ndarray | None, str | None]:
    """``(name, SHA-256, model input, error)`` of one image: full-resolution decode (the
    protocol resizes from the original pixels), then the model's preprocessing."""
    name, data, error = item
    sha = None if data is None else hashlib.sha256(data).hexdigest()
    if error is not None:
        return name, sha, None, error
    try:
        return name, sha, np.asarray(model.preprocess(decode_rgb(data)), dtype=np.float32), None
    except Exception as exc:  # noqa: BLE001 - one bad image must not stop the evaluation
        return name, sha, None, f"decode: {type(exc).__name__}: {exc}"


def embed_images(items: Iterator[tuple[str, bytes | None, str | None]], model: FeatureModel,
                 batch_size: int = 32, prefetch_threads: int = 0) -> ChunkFeatures:
    """Decode, preprocess and embed; per-image failures become errors, not exceptions.
    With ``prefetch_threads``, images are decoded on that many threads ahead of the batch
    being embedded, as in the feature stage (same order, same values)."""
    names: list[str] = []
    errors: dict[str, str] = {}
    pending: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    seen: list[tuple[str, str | None, str | None]] = []

    def flush() -> None:
        if pending:
            rows.append(np.asarray(model.embed(np.stack(pending)), dtype=np.float32))
            pending.clear()

    window = max(2 * batch_size, 4 * max(prefetch_threads, 1))
    work = functools.partial(_prepare, model=model)
    for name, sha, array, error in prefetched(items, work, prefetch_threads, window):
        if error is None:
            pending.append(array)
            names.append(name)
        else:
            errors[name] = error
        seen.append((name, sha, error))
        if len(pending) >= batch_size:
            flush()
    flush()
    feats = np.concatenate(rows) if rows else np.zeros((0, model.dim), np.float32)
    return ChunkFeatures(names, feats, errors, model.fingerprint(), seen)


def embed_chunk(chunk: GeneratedChunk, spec: ModelSpec, runtime: RuntimeConfig,
                torchscript_allowlist: Sequence[str] = (), storage_options: dict[str, Any] | None = None
                ) -> ChunkFeatures:
    """Embed one chunk with the (per-process cached) model of ``spec``."""
    from tasks.shared.features.registry import load_model

    model = load_model(spec, runtime, list(torchscript_allowlist))
    return embed_images(iter_chunk_images(chunk, storage_options), model, runtime.batch_size,
                        runtime.prefetch_threads)


def _settings(spec: ModelSpec, precision: str) -> list[Any]:
    """What a chunk's features depend on besides its files, known without loading the model:
    this module's and the model family's code, the spec's identity (weights by SHA-256, or
    random init from the registry's fixed seed) and the precision."""
    from tasks.shared.features.registry import family_module

    code = code_version(__name__, family_module(spec), exclude=("tasks.shared.features.registry",))
    return [code, expected_identity(spec), precision]


def content_digests(chunk: GeneratedChunk, storage_options: dict[str, Any] | None = None) -> list[str | None]:
    """SHA-256 of each file of a chunk (None for one that cannot or may not be read), streamed."""
    out: list[str | None] = []
    for uri in chunk.uris:
        try:
            with open_input(uri, chunk.roots, dict(storage_options or {}), path=uri) as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError:
            digest = None
        out.append(digest)
    return out


def chunk_fingerprint(spec: ModelSpec, precision: str, chunk: GeneratedChunk,
                      digests: Sequence[str | None]) -> str:
    """The unit's fingerprint: the settings and the chunk's files by URI and content."""
    code, *config = _settings(spec, precision)
    return unit_fingerprint("evaluate-features", code, config, [chunk.kind, list(chunk.uris), list(digests)])


def listing_fingerprint(spec: ModelSpec, precision: str, chunk: GeneratedChunk) -> str:
    """The same settings and files by URI, size and modification time (or ETag) from the
    listing: the fast path that reads no image byte when nothing was even touched."""
    return fingerprint("evaluate-listing", _settings(spec, precision), chunk.kind, list(chunk.uris),
                       list(chunk.stamps))


@dataclass(frozen=True)
class ChunkVerdict:
    """What :func:`embed_chunk_unit` does with one chunk, and why. ``fingerprint``: the
    unit's, from the files' bytes; None when the listing matched the marker's (nothing read)."""

    action: str
    reason: str
    marker: Marker | None
    listing: str
    fingerprint: str | None


def judge_generated_chunk(features: Store, chunk: GeneratedChunk, spec: ModelSpec, precision: str,
                          storage_options: dict[str, Any] | None = None, hash_new: bool = True) -> ChunkVerdict:
    """Read back or embed one chunk: what :func:`embed_chunk_unit` does and ``corpusforge plan``
    predicts, from one function. Hashes the chunk's files only when its listing changed (and,
    with ``hash_new`` False, not for a chunk never embedded: it is embedded whatever they hold)."""
    listing = listing_fingerprint(spec, precision, chunk)
    marker = read_marker(features, feature_vectors(spec.model_id, chunk.name))
    if marker is not None and marker.info.get("listing") == listing:
        return ChunkVerdict(SKIPPED, "unchanged", marker, listing, None)
    if marker is None and not hash_new:
        return ChunkVerdict(COMPUTED, "no completed output", None, listing, None)
    fp = chunk_fingerprint(spec, precision, chunk, content_digests(chunk, storage_options))
    if marker is not None and marker.fingerprint == fp:
        return ChunkVerdict(SKIPPED, "unchanged (same bytes, new file stamps: only its marker is rewritten)",
                            marker, listing, fp)
    action, reason = explain(marker, fp)
    return ChunkVerdict(action, reason, marker, listing, fp)


class GeneratedInfo(TypedDict, total=False):
    """A chunk's feature marker: the loaded model's identity, the chunk, the listing it was
    embedded from; the feature files' count, dim and dtype."""

    model: dict[str, Any]
    chunk: dict[str, Any]  # kind, files
    listing: str
    count: int
    dim: int
    dtype: str


def embed_chunk_unit(out: Store, features: Store, chunk: int, sources: Sequence[str], spec: ModelSpec,
                     runtime: RuntimeConfig, torchscript_allowlist: Sequence[str] = (),
                     storage_options: dict[str, Any] | None = None) -> UnitResult[GeneratedInfo]:
    """:func:`embed_chunk` of chunk ``chunk`` of ``out``'s listing file as a unit of the stage
    contract in the ``features`` store: read back when its files are unchanged, else embedded
    and stored (float32, so what the metrics read is exactly what a fresh run computed). Files are
    identified by content (:func:`judge_generated_chunk`): equal contents with new stamps (a ``touch``, a
    copy) only update the marker's listing. Neither path loads the model: its fingerprint comes from the spec."""
    listed = read_listed_chunk(out, chunk, sources)
    judged = judge_generated_chunk(features, listed, spec, runtime.precision, storage_options)
    if judged.fingerprint is None:  # the listing is the one embedded: nothing read
        return UnitResult.of(judged.marker, SKIPPED)
    if judged.action == SKIPPED:  # same bytes, new stamps
        marker = finish_unit(features, feature_vectors(spec.model_id, listed.name), judged.fingerprint,
                             judged.marker.outputs, {**judged.marker.info, "listing": judged.listing})
        return UnitResult.of(marker, SKIPPED)
    result = embed_chunk(listed, spec, runtime, torchscript_allowlist, storage_options)
    names, shas, errors = zip(*result.items, strict=True) if result.items else ((), (), ())
    marker = write_shard_features(features, spec.model_id, listed.name, names, shas, [e is None for e in errors],
                                  list(errors), result.features.astype(np.float32), judged.fingerprint,
                                  {"model": result.identity, "chunk": {"kind": listed.kind, "files": len(listed.uris)},
                                   "listing": judged.listing})
    return UnitResult.of(marker, COMPUTED)


def stored_chunk_features(features: Store, model_id: str, chunk: str) -> ChunkFeatures:
    """A chunk's features, errors and model identity as its unit stored them."""
    keys, feats = read_shard_features(features, model_id, chunk)
    marker = read_marker(features, feature_vectors(model_id, chunk))
    return ChunkFeatures(keys, feats.astype(np.float32), read_shard_errors(features, model_id, chunk),
                         marker.info["model"])


# ---- metrics -----------------------------------------------------------------------

def evaluate_features(chunks: Sequence[ChunkFeatures], reference: Reference, cfg: MetricsConfig,
                      allow_mismatch: bool = False, mode: str = "paper") -> dict[str, Any]:
    """The ``metrics.json`` content for embedded generated images against ``reference``;
    ``mode`` (paper or gpic_eval_port) is named in it."""
    identities = {repr(sorted(c.identity.items())): c.identity for c in chunks if c.identity}
    if len(identities) > 1:
        raise ProtocolMismatch(f"generated chunks were embedded by different models: {list(identities.values())}")
    identity = next(iter(identities.values()), {})
    mismatches = check_model(reference, identity, allow_mismatch, mode)
    feats = np.concatenate([c.features for c in chunks]) if chunks else np.zeros((0, reference.mu.size), np.float32)
    if feats.shape[1] != reference.mu.size:
        raise ProtocolMismatch(f"generated features have {feats.shape[1]} dimensions, reference {reference.mu.size}")
    if feats.shape[0] < 2:
        raise ValueError(f"{feats.shape[0]} generated images embedded: need at least 2")
    errors = {k: v for c in chunks for k, v in c.errors.items()}
    moments = Moments.of(feats)
    metrics = compare(moments.mean, moments.covariance(), feats, reference.mu, reference.sigma,
                      reference.features, cfg)

    deviations = [f"MODEL MISMATCH with the reference, evaluated anyway: {m}" for m in mismatches]
    deviations += model_deviations(identity)
    if reference.provenance is None:
        deviations.append("reference file has no provenance (GPIC release format): its model is assumed to be "
                          f"DINOv2 ViT-L/14 with {PROTOCOL_MODES[mode]} preprocessing")
    else:
        deviations += [f"reference: {d}" for d in reference.provenance.get("protocol_deviations", [])]
    if (small := small_reference_warning(reference.n)) is not None:
        deviations.append(small)
    if feats.shape[0] < cfg.min_generated:
        deviations.append(f"only {feats.shape[0]} generated images (the protocol uses {cfg.min_generated}); "
                          "FD is biased upwards for small sets")
    if errors:
        deviations.append(f"{len(errors)} generated images could not be embedded and are excluded")
    deviations += cfg.deviations()
    return {
        "format": FORMAT,
        "metrics": metrics,
        "generated": {"embedded": int(feats.shape[0]), "errors": len(errors),
                      "errors_by_reason": dict(sorted(Counter(v.split(":", 1)[0] for v in errors.values()).items())),
                      "error_examples": dict(sorted(errors.items())[:20])},
        "reference": {"path": reference.path, "n": reference.n,
                      "feature_rows": 0 if reference.features is None else int(reference.features.shape[0]),
                      "provenance": reference.provenance, "checks": reference.checks},
        "model": identity,
        "settings": cfg.model_dump(mode="json"),
        "protocol": {"mode": mode, "preprocessing": PROTOCOL_MODES[mode], "default": not deviations,
                     "deviations": deviations, "seeds": {"prdc_subsample": cfg.seed, "mmd_subsets": cfg.seed}},
    }


def evaluate_unit(out: Store, features: Store, model_id: str, reference: str, reference_options: dict[str, Any],
                  cfg: MetricsConfig, allow_mismatch: bool, mode: str, claims: dict[str, Any]) -> dict[str, Any]:
    """The metrics as a task: every listed chunk's features read back from ``features`` (the
    flow process holds none of them), compared with ``reference``; ``claims`` (the run's
    sources, model spec, code version and caption set) added; ``metrics.json`` and
    ``report.md`` written to ``out``. Returns what metrics.json holds."""
    chunks = [stored_chunk_features(features, model_id, name) for name in listed_chunk_names(out)]
    result = evaluate_features(chunks, load_reference(reference, reference_options), cfg, allow_mismatch, mode)
    result["generated"]["sources"] = claims["sources"]
    result.update({k: v for k, v in claims.items() if k != "sources"})
    if (claims.get("caption_set") or {}).get("deviation"):
        result["protocol"]["deviations"].append(claims["caption_set"]["deviation"])
    out.write_json(EVALUATION_METRICS, result)
    out.write_bytes(EVALUATION_REPORT, render_report(result).encode())
    return result


def render_report(result: dict[str, Any]) -> str:
    """A short human-readable ``report.md``."""
    m = result["metrics"]
    protocol = result["protocol"]
    lines = ["# Evaluation", "", f"Mode **{protocol.get('mode', 'paper')}** (preprocessing "
             f"`{protocol.get('preprocessing', 'gpic_eval')}`; seeds {protocol.get('seeds')}).", "",
             f"{result['generated']['embedded']} generated images against `{result['reference']['path']}` "
             f"({result['reference']['n']} reference images), model `{result['model'].get('model_id')}`.", "",
             "| metric | value |", "|---|---|"]
    for name in ("fd", "fd_mu", "fd_sigma", "precision", "recall", "density", "coverage", "mmd2"):
        if name in m:
            lines.append(f"| {name} | {m[name]:.6g} |")
    lines += ["", "FD uses un-normalised features; FDµ + FDΣ = FD. Density can exceed 1.", ""]
    devs = result["protocol"]["deviations"]
    lines += ["## Protocol", "", "GPIC's default protocol." if not devs else "Deviations from GPIC's protocol:"]
    lines += [f"- {d}" for d in devs]
    lines += [f"- note: {n}" for n in m.get("notes", [])]
    if checks := result["reference"].get("checks"):
        lines += ["", "## Reference file", ""] + [f"- checked: {c}" for c in checks["checked"]]
        lines += [f"- {c}" for c in checks["cannot_check"]]
    return "\n".join(lines) + "\n"


# In a flow its task asks for the model workers' resources (corpusforge.cluster.MODEL_TASKS).
EMBED_CHUNK = Unit(embed_chunk_unit, "embed-generated-chunk")
LIST_GENERATED = Unit(write_generated_listing, "evaluate-list-generated")
EVALUATE_METRICS = Unit(evaluate_unit, "evaluate-metrics")
