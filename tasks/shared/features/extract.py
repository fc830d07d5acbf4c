"""The feature stage: every requested model's features for one staging shard.

:func:`extract_shard` streams a staging shard's tar once, decodes each image once (shrunk during
JPEG decoding to what the largest model needs), preprocesses on prefetch threads ahead of the
batch being embedded and writes per model::

    features/{model_id}/vectors/{shard}.npy    [n_ok, dim] in cfg.dtype (float16 by default), shard order
    features/{model_id}/keys/{shard}.parquet   key, sha256, ok, error for every image, shard order
    (marker last; see corpusforge/feature_files.py)

A (model, shard) unit's fingerprint hashes the model's own fingerprint (id, architecture, weights
SHA-256 or "random-init", preprocessing, dim), the stored dtype, the decode size, the compute
precision, this module's and the model's module's code versions and the staging shard's *images*
digest (keys, image SHA-256s, order), not its captions: a caption edit recomputes no feature.
The decode size is the largest model input times :data:`DRAFT_MARGIN` over *all* configured
models, so adding a model with a larger input also recomputes the others: their pixels differ.

Checking that fingerprint needs the loaded model; the flow's probe must not load one. So
each marker also keeps ``info.spec`` (:func:`spec_key`): the same facts as configured rather
than as loaded (every model's spec, whose weights are named by their pinned SHA-256, the
dtype, precision and decode setting, this code and its libraries' versions) and the images
digest. A unit whose ``info.spec`` matches is current without loading anything, and the
flow probes it (:data:`EXTRACT_SHARD`); any other goes to a worker, which loads the model
and judges by the fingerprint, and when that still matches, only brings ``info.spec`` up to
date (the marker a fresh build writes), so the next rerun probes it again.

An image that cannot be decoded (or preprocessed) is an error row (ok=False with the reason);
the shard still completes.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import importlib.metadata
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np
from PIL import Image
from corpusforge.contract import (COMPUTED, SKIPPED, FanOut, Marker, Outcome, Unit, UnitResult, current_marker,
                                  explain, finish_unit, in_process, joint_result, must_compute, read_marker,
                                  require_marker, unit_fingerprint)
from corpusforge.faults import fault_point
from corpusforge.feature_files import write_shard_features
from corpusforge.hashing import fingerprint
from corpusforge.layout import feature_keys, feature_vectors, staging_index, staging_records, staging_tar
from corpusforge.storage import Store
from corpusforge.tarshard import iter_tar_samples
from corpusforge.version import code_version
from tasks.shared.features.config import STATISTICS_PREPROCESSING, FeaturesConfig, ModelSpec
from tasks.shared.features.content import content_rule, model_input, picture_content
from tasks.shared.features.decode import decode_rgb

if TYPE_CHECKING:  # torch comes with the models (load_models), not with the flow that imports this stage
    from tasks.shared.features.base import FeatureModel

# Decode at least this many times the model input: the final resize then still
# downsamples, which keeps features within float16 noise of a full-size decode.
DRAFT_MARGIN = 2
# A selection of at least this share of a shard's bytes is read in one sequential pass
# (cheaper than that many ranged requests); smaller ones by ranged reads of their members.
SEQUENTIAL_SHARE = 0.5
RANGED_BATCH = 64  # ranged reads in flight per batch: bounds memory to ~64 images
REUSED = "features of every image are current (reused)"  # a selection's unit that reads those instead


def shard_images(store: Store, shard: str) -> list[tuple[str, str, str]]:
    """``(key, ext, sha256)`` of the shard's images, in shard order, from its records file."""
    t = store.read_parquet(staging_records(shard), columns=["key", "ext", "sha256"])
    return list(zip(t["key"].to_pylist(), t["ext"].to_pylist(), t["sha256"].to_pylist(), strict=True))


@functools.cache
def _input_size(model: FeatureModel) -> int:
    """The model's square input side, read off what its ``preprocess`` returns."""
    probe = model.preprocess(Image.new("RGB", (64, 64), (128, 128, 128)))
    return int(max(probe.shape[-2:]))


def decode_size(models: Sequence[FeatureModel]) -> int | None:
    """The JPEG draft size that serves every model (largest input times the margin), or
    None for a full decode when a model's protocol is defined on full-size pixels."""
    if any(m.preprocessing in STATISTICS_PREPROCESSING for m in models):
        return None
    return max(_input_size(m) for m in models) * DRAFT_MARGIN


def feature_fingerprint(model: FeatureModel, dtype: str, draft: int | None, precision: str, images: str) -> str:
    """Everything the stored values of one model's features of one shard depend on (the
    compute precision changes them; device, batch size and threads only in the last bits)."""
    code = code_version(__name__, type(model).__module__, exclude=("tasks.shared.features.registry",))
    parts: list[Any] = [model.fingerprint(), dtype, draft, precision]
    rule = content_rule(model)
    if rule is not None:  # the picture without its frame (tasks/shared/features/content.py)
        parts.append({"content": rule})
    return unit_fingerprint("features", code, parts, images)


# Libraries whose version can change what a loaded model computes (its dim, preprocessing).
MODEL_LIBRARIES = ("torch", "torchvision", "timm", "open_clip_torch", "onnxruntime", "pillow", "numpy")


@functools.cache
def _library_versions() -> tuple[str, ...]:
    """The installed versions of :data:`MODEL_LIBRARIES` (read once per process)."""
    versions = []
    for name in MODEL_LIBRARIES:
        try:
            versions.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} absent")
    return tuple(versions)


def spec_key(cfg: FeaturesConfig, spec: ModelSpec, draft: int | None | Literal["auto"], images: str) -> str:
    """What a (model, shard) unit's features depend on, as configured: read off the config,
    never the loaded model (weights by their pinned SHA-256), so a probe checks it for free.
    ``draft`` "auto" depends on every configured model's input size, hence on every spec."""
    from tasks.shared.features.registry import family_module

    specs = cfg.models if draft == "auto" else [spec]
    families = sorted({family_module(m) for m in specs})
    code = code_version(__name__, "tasks.shared.features.base", *families, exclude=("tasks.shared.features.registry",))
    return fingerprint(["features-spec", [code, *_library_versions()], spec.model_dump(mode="json"),
                        [m.model_dump(mode="json") for m in specs], draft, cfg.dtype, cfg.runtime.precision, images])


class ModelFeatures(Outcome):
    """One model's part of a shard's result (``action``: what was done with that model's unit)."""

    ok: int
    errors: int
    random_init: bool
    dim: int
    fingerprint: dict[str, Any]  # the model's identity (its marker's ``info.model``)
    subset: str | None  # the selection's subset folder, None for features of every image


class ShardFeatures(TypedDict):
    """A shard's feature unit's ``info``: its images and each model's part."""

    shard: str
    images: int
    models: dict[str, ModelFeatures]


class _ShardParts:
    """Each model's part of a shard's result, with its unit's marker (the result holds their files)."""

    def __init__(self, shard: str, images: int) -> None:
        self.info = ShardFeatures(shard=shard, images=images, models={})
        self.markers: list[Marker[Any]] = []

    def add(self, model_id: str, action: Literal["computed", "skipped"], marker: Marker[Any],
            subset: str | None = None, ok: int | None = None) -> None:
        """The model's part, from its unit's marker (the model's facts are there)."""
        count = int(marker.info["count"]) if ok is None else ok
        self.info["models"][model_id] = ModelFeatures(
            action=action, ok=count, errors=self.info["images"] - count, random_init=bool(marker.info["random_init"]),
            dim=int(marker.info["model"]["dim"]), fingerprint=marker.info["model"], subset=subset)
        self.markers.append(marker)

    def result(self) -> UnitResult[ShardFeatures]:
        """Computed when any model's unit was."""
        action = COMPUTED if any(m["action"] == COMPUTED for m in self.info["models"].values()) else SKIPPED
        return joint_result(fingerprint([m.fingerprint for m in self.markers]), self.markers, self.info, action)


def current_by_spec(store: Store, shard: str, cfg: FeaturesConfig, draft: int | None | Literal["auto"],
                    selection: Selection | None = None) -> UnitResult[ShardFeatures] | None:
    """The result of :func:`extract_shard` when every model's unit of ``shard`` is current by
    its ``info.spec``, read from markers (and, with a selection, the shard's records file and
    the selection's keys: small tables); None when any may not be. With a selection, features
    of every image that are current are used instead, as :func:`judge_shard` does."""
    staged = require_marker(store, staging_tar(shard), "staging shard").info
    chosen, chosen_print = (None, None) if selection is None else _selected(store, shard, selection)
    images = staged["count"] if chosen is None else len(chosen)
    parts = _ShardParts(shard, images)
    for spec in cfg.models:
        full = read_marker(store, feature_vectors(spec.model_id, shard))
        if full is not None and full.info.get("spec") == spec_key(cfg, spec, draft, staged["images"]):
            ok = None if chosen is None else _ok_among(store, spec.model_id, shard, {k for k, _, _ in chosen})
            parts.add(spec.model_id, SKIPPED, full, None, ok)
            continue
        if chosen is None:
            return None
        part = read_marker(store, feature_vectors(spec.model_id, shard, selection.name))
        if part is None or part.info.get("spec") != spec_key(cfg, spec, draft, chosen_print):
            return None
        parts.add(spec.model_id, SKIPPED, part, selection.name)
    return parts.result()


def load_models(cfg: FeaturesConfig) -> list[FeatureModel]:
    """The configured models, loaded once per process by the registry's cache."""
    from tasks.shared.features.registry import load_model

    return [load_model(spec, cfg.runtime, cfg.torchscript_allowlist) for spec in cfg.models]


@dataclass
class _ModelRun:
    """Per-model accumulation for one shard: ok flags, errors, embedded rows."""
    model: FeatureModel
    ok: list[bool] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    pending: list[np.ndarray] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)

    def add(self, array: np.ndarray | None, error: str | None, batch_size: int) -> None:
        self.ok.append(error is None)
        self.errors.append(error)
        if error is None:
            self.pending.append(array)
            # inputs of varying size (e.g. sscd_short288) cannot be stacked: embed one by one
            if len(self.pending) >= (batch_size if self.model.fixed_input else 1):
                self.flush()

    def flush(self) -> None:
        if self.pending:
            out = self.model.embed(np.stack(self.pending))
            if out.shape != (len(self.pending), self.model.dim):
                raise ValueError(f"{self.model.model_id}: embed returned {out.shape} for "
                                 f"{len(self.pending)} inputs of dim {self.model.dim}")
            self.rows.append(np.asarray(out, dtype=np.float32))
            self.pending = []

    def features(self) -> np.ndarray:
        self.flush()
        if not self.rows:
            return np.zeros((0, self.model.dim), dtype=np.float32)
        return np.concatenate(self.rows)


def _prepare(item: tuple[str, bytes | None, str | None], models: Sequence[FeatureModel],
             draft: int | None) -> tuple[str, list[tuple[np.ndarray | None, str | None]]]:
    """Decode one image once and preprocess it for each model; errors become strings."""
    key, data, error = item
    if error is not None:
        return key, [(None, error)] * len(models)
    try:
        image = decode_rgb(data, draft_size=draft)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this record's error
        return key, [(None, f"decode: {exc}")] * len(models)
    out: list[tuple[np.ndarray | None, str | None]] = []
    content = picture_content(image) if any(content_rule(m) for m in models) else None
    for model in models:
        try:
            out.append((model_input(model, image, content), None))
        except Exception as exc:  # noqa: BLE001 - one bad image must not fail the shard
            out.append((None, f"preprocess: {type(exc).__name__}: {exc}"))
    return key, out


def prefetched(items: Iterable[Any], work: Callable[[Any], Any], threads: int, window: int) -> Iterator[Any]:
    """``map(work, items)`` in order, with up to ``window`` items in flight on ``threads`` threads.

    The consumer embeds a batch while the pool decodes the next ones; the window bounds
    memory to a few batches whatever the shard size.
    """
    if threads <= 0:
        yield from map(work, items)
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode") as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.submit(work, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def stream_shard_images(store: Store, shard: str,
                  expected: list[tuple[str, str]]) -> Iterator[tuple[str, bytes | None, str | None]]:
    """Stream ``(key, image bytes, error)`` in shard order; keys the tar lacks are errors."""
    wanted = dict(expected)
    position = 0
    with store.open(staging_tar(shard)) as f:
        for sample in iter_tar_samples(f):
            if sample.error is not None:
                if sample.error.reason.startswith("corrupt or truncated tar"):
                    break
                continue
            ext = wanted.get(sample.key)
            if ext is None or ext not in sample.members:
                continue
            if position >= len(expected) or expected[position][0] != sample.key:
                raise ValueError(f"{staging_tar(shard)}: member {sample.key!r} out of shard order")
            yield sample.key, sample.members[ext], None
            position += 1
    for key, _ in expected[position:]:
        yield key, None, "missing from staging tar (truncated shard?)"


def _ranged_images(store: Store, shard: str,
                   chosen: list[tuple[str, str, str]]) -> Iterator[tuple[str, bytes | None, str | None]]:
    """``(key, image bytes, error)`` of only the ``chosen`` images, by ranged reads at the
    offsets of the staging index (batched: one request per member, concurrent on object
    stores); a member whose bytes no longer match the records file is that image's error."""
    index = store.read_parquet(staging_index(shard), columns=["key", "ext", "offset", "size"])
    where = {(k, e): (o, n) for k, e, o, n in zip(*(index[c].to_pylist() for c in index.column_names), strict=True)}
    path = store.fs._strip_protocol(store.path(staging_tar(shard)))
    for lo in range(0, len(chosen), RANGED_BATCH):
        batch = chosen[lo:lo + RANGED_BATCH]
        spans = [where.get((key, ext)) for key, ext, _ in batch]
        found = [s for s in spans if s is not None]
        blobs = iter(store.fs.cat_ranges([path] * len(found), [o for o, _ in found], [o + n for o, n in found]))
        for (key, _, sha), span in zip(batch, spans, strict=True):
            if span is None:
                yield key, None, "missing from staging index (truncated shard?)"
                continue
            data = next(blobs)
            if hashlib.sha256(data).hexdigest() != sha:
                yield key, None, "staging member does not match its records file (changed after staging?)"
            else:
                yield key, data, None


@dataclass(frozen=True)
class Selection:
    """The records of a staging shard one consumer needs features of (e.g. the held-out
    splits for reference statistics). ``name`` is the consumer's folder under
    ``features/{model}/subsets/``; subclasses say which keys (picklable, for Dask)."""

    name: str

    def keys(self, store: Store, shard: str) -> set[str]:
        raise NotImplementedError


def _selected(store: Store, shard: str, selection: Selection) -> tuple[list[tuple[str, str, str]], str]:
    """The selection's images of ``shard`` (:func:`shard_images`) and their digest: staging's
    images digest restricted to them, what a selection's units are keyed by."""
    wanted = selection.keys(store, shard)
    chosen = [(k, e, sha) for k, e, sha in shard_images(store, shard) if k in wanted]
    return chosen, fingerprint([(k, sha, e) for k, e, sha in chosen])


@dataclass(frozen=True)
class UnitVerdict:
    """What the contract does with one (model, shard) unit, and why (:func:`corpusforge.contract.explain`).
    ``reused``: with a selection, the model's features of every image are current and are
    used instead (``marker`` is theirs)."""

    action: str
    reason: str
    fingerprint: str
    marker: Marker | None
    reused: bool = False


@dataclass(frozen=True)
class ShardVerdicts:
    """The verdict per model for one staging shard. ``chosen``: the selected images (empty
    without a selection, so that judging reads markers only); ``images``: the digest of the
    images the units embed (staging's ``images``, restricted to ``chosen`` with a selection)."""

    subset: str | None
    chosen: list[tuple[str, str, str]]
    images: str
    models: dict[str, UnitVerdict]


def judge_shard(store: Store, shard: str, cfg: FeaturesConfig, models: Sequence[FeatureModel], draft: int | None,
                selection: Selection | None = None) -> ShardVerdicts:
    """Skip or compute, per model, for the units of ``shard``: what :func:`extract_shard` does
    and ``corpusforge plan`` predicts, from one function. Reads the staging marker and the
    feature markers (and, with a selection, the shard's records file and the selection's keys)."""
    images = require_marker(store, staging_tar(shard), "staging shard").info["images"]
    subset = None if selection is None else selection.name
    chosen, chosen_print = ([], images) if selection is None else _selected(store, shard, selection)
    verdicts = {}
    for model in models:
        fp = feature_fingerprint(model, cfg.dtype, draft, cfg.runtime.precision, chosen_print)
        if subset is not None:  # every image already embedded with the same settings: reuse that
            full_fp = feature_fingerprint(model, cfg.dtype, draft, cfg.runtime.precision, images)
            full = current_marker(store, feature_vectors(model.model_id, shard), full_fp)
            if full is not None:
                verdicts[model.model_id] = UnitVerdict(SKIPPED, REUSED, fp, full, reused=True)
                continue
        marker = read_marker(store, feature_vectors(model.model_id, shard, subset))
        action, reason = explain(marker, fp)
        verdicts[model.model_id] = UnitVerdict(action, reason, fp, marker)
    return ShardVerdicts(subset, chosen, chosen_print, verdicts)


def extract_shard(store: Store, shard: str, cfg: FeaturesConfig, selection: Selection | None = None,
                  draft: int | None | Literal["auto"] = "auto") -> UnitResult[ShardFeatures]:
    """Compute (or skip, when already done) every configured model's features for ``shard``.

    With a ``selection``, only the selected images are embedded, read by ranged reads
    (or by one sequential pass when they are most of the shard), into that selection's
    subset folder; the unit's fingerprint then hashes the selected images (keys, hashes,
    order) instead of the whole shard, so a rerun redoes a shard only when its selection
    changed. Features of every image with the same model fingerprint, when present, are
    used instead (``subset`` None in the summary). ``draft``: the decode size, by default
    :func:`decode_size` of the configured models; a consumer that runs fewer models than
    the features it is compared with (contamination's evaluation set) passes theirs, so
    its pixels, and hence its features, are the same.

    Returns every model's files and each model's part in ``info`` (:class:`ShardFeatures`);
    computed when any model's unit was.
    """
    if (current := current_by_spec(store, shard, cfg, draft, selection)) is not None:
        return current
    must_compute()  # the models are loaded below
    models = load_models(cfg)
    auto, draft = draft, decode_size(models) if draft == "auto" else draft
    judged = judge_shard(store, shard, cfg, models, draft, selection)
    subset = judged.subset
    chosen = judged.chosen if subset is not None else shard_images(store, shard)
    specs = {spec.model_id: spec_key(cfg, spec, auto, judged.images) for spec in cfg.models}
    parts = _ShardParts(shard, len(chosen))
    todo: list[FeatureModel] = []
    for model in models:
        verdict = judged.models[model.model_id]
        if verdict.reused:
            ok = _ok_among(store, model.model_id, shard, {k for k, _, _ in chosen})
            parts.add(model.model_id, SKIPPED, verdict.marker, None, ok)
        elif verdict.action == SKIPPED:
            marker = verdict.marker
            if marker.info.get("spec") != specs[model.model_id]:  # current, and now known so from its spec
                marker = finish_unit(store, feature_vectors(model.model_id, shard, subset), verdict.fingerprint,
                                     marker.outputs, {**marker.info, "spec": specs[model.model_id]})
            parts.add(model.model_id, SKIPPED, marker, subset)
        else:
            todo.append(model)
    if not todo:
        return parts.result()

    fault_point("features.start", shard)  # tests only: off unless CORPUSFORGE_FAULT
    runs = [_ModelRun(m) for m in todo]
    rt = cfg.runtime
    keys: list[str] = []
    work = functools.partial(_prepare, models=todo, draft=draft)
    window = max(2 * rt.batch_size, 4 * max(rt.prefetch_threads, 1))
    if subset is not None and _selected_bytes(store, shard, chosen) < store.size(staging_tar(shard)) * SEQUENTIAL_SHARE:
        source = _ranged_images(store, shard, chosen)
    else:
        source = stream_shard_images(store, shard, [(k, e) for k, e, _ in chosen])
    for key, prepared in prefetched(source, work, rt.prefetch_threads, window):
        keys.append(key)
        for run, (array, error) in zip(runs, prepared, strict=True):
            run.add(array, error, rt.batch_size)

    shas = [sha for _, _, sha in chosen]
    for run in runs:  # error-rate guard: checked before anything of the shard is marked done
        failed = run.ok.count(False)
        if chosen and failed / len(chosen) > cfg.max_error_share:
            first = next(e for e in run.errors if e is not None)
            raise RuntimeError(f"features {run.model.model_id}, shard {shard}: {failed} of {len(chosen)} "
                               f"images failed (more than features.max_error_share={cfg.max_error_share}); "
                               f"first error: {first}; the shard is not marked done")
    for run in runs:
        model = run.model
        feats = run.features().astype(cfg.dtype)
        info = {"model": model.fingerprint(), "dtype": cfg.dtype, "decode_size": draft,
                "random_init": bool(model.random_init), "spec": specs[model.model_id]}
        marker = write_shard_features(store, model.model_id, shard, keys, shas, run.ok, run.errors, feats,
                                      judged.models[model.model_id].fingerprint, info, subset)
        parts.add(model.model_id, COMPUTED, marker, subset)
    fault_point("features.done", shard)
    return parts.result()


def _selected_bytes(store: Store, shard: str, chosen: list[tuple[str, str, str]]) -> int:
    """Image bytes of the chosen records, from the staging records file."""
    t = store.read_parquet(staging_records(shard), columns=["key", "bytes"])
    size = dict(zip(t["key"].to_pylist(), t["bytes"].to_pylist(), strict=True))
    return sum(int(size.get(k) or 0) for k, _, _ in chosen)


def _ok_among(store: Store, model_id: str, shard: str, keys: set[str]) -> int:
    """How many of ``keys`` have a feature row in the model's features of every image."""
    t = store.read_parquet(feature_keys(model_id, shard), columns=["key", "ok"])
    return sum(1 for k, ok in zip(t["key"].to_pylist(), t["ok"].to_pylist(), strict=True) if ok and k in keys)


# One unit per staging shard; in a flow its task asks for ``dask.model_task_resources``
# (e.g. GPU=1), see corpusforge.cluster.MODEL_TASKS. Probed: a current unit is known from
# its markers without loading a model (:func:`current_by_spec`).
EXTRACT_SHARD = Unit(extract_shard, "extract-shard-features", probe=True)


def extract_features(store: Store, shards: list[str], cfg: FeaturesConfig, selection: Selection | None = None,
                     draft: int | None | Literal["auto"] = "auto", *, fan_out: FanOut = in_process
                     ) -> list[UnitResult[ShardFeatures]]:
    """The feature stage: one unit per shard through ``fan_out`` (a flow's Dask cluster);
    with a ``selection``, only its records (see :func:`extract_shard`)."""
    return fan_out(EXTRACT_SHARD, [dict(store=store, shard=s, cfg=cfg, selection=selection, draft=draft)
                                   for s in shards])


def receipt_section(results: Sequence[UnitResult[ShardFeatures]]) -> dict[str, Any]:
    """The receipt's features section: totals per model over shard results, with random-init
    models flagged loudly."""
    per_model: dict[str, dict[str, Any]] = {}
    for result in results:
        for model_id, r in result.info["models"].items():
            t = per_model.setdefault(model_id, {"shards": 0, "computed": 0, "skipped": 0, "ok": 0, "errors": 0,
                                                "random_init": False, "dim": r.get("dim"),
                                                "fingerprint": r.get("fingerprint")})
            t["shards"] += 1
            t[r["action"]] += 1
            t["ok"] += r.get("ok", 0)
            t["errors"] += r.get("errors", 0)
            t["random_init"] = t["random_init"] or bool(r.get("random_init"))
    random_init = sorted(m for m, t in per_model.items() if t["random_init"])
    summary: dict[str, Any] = {"shards": len(results), "images": sum(r.info["images"] for r in results),
                               "models": per_model, "random_init_models": random_init}
    if random_init:
        summary["warning"] = ("RANDOM-INIT FEATURES: " + ", ".join(random_init) + " ran without trained "
                              "weights; their features carry no meaning and must not be used for "
                              "deduplication or reference statistics.")
    return summary
