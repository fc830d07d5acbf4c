"""The stage contract every unit of work follows (a partition, a bucket, a shard, a merge).

Fingerprint (code version, config fields read, content digests of the inputs read), skip on an
identical fingerprint, compute, write atomically, mark: :func:`run_unit` is the whole protocol in one
call; every stage uses it. The rules, probing, one-off global steps (``work/steps/``) and pruning are
described in docs/contract.md and docs/scaling.md.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, Self, TypedDict, TypeVar

from corpusforge.hashing import canonical_json, fingerprint, sha256_bytes
from corpusforge.layout import MARKERS
from corpusforge.storage import Store
from corpusforge.version import code_version

@dataclass(frozen=True)
class KeyParts:
    """What a fingerprint hashed, kept so ``plan`` can name what changed (:func:`explain`)."""

    code: str
    config: dict[str, str]  # config field path -> short hash of its value
    inputs: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeyParts:
        return cls(data["code"], data["config"], data["inputs"])

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "config": self.config, "inputs": self.inputs}


# The facts a stage's units report (a marker's ``info``): a TypedDict declared beside the stage,
# so it is a plain dict at run time (the marker's JSON as written, small and picklable) and a
# typed one to its readers.
InfoT = TypeVar("InfoT")


@dataclass(frozen=True)
class Marker(Generic[InfoT]):
    """``_markers/{output}.json``, a unit's completion record: :meth:`to_json` is exactly the
    mapping on disk (hashed as written); ``info`` holds its stage's TypedDict of facts."""

    fingerprint: str
    outputs: dict[str, str]  # path -> SHA-256
    digest: str
    info: InfoT
    key: KeyParts | None = None  # kept when the fingerprint was a :class:`UnitKey`

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Marker[Any]:
        key = data.get("key")
        return cls(data["fingerprint"], data["outputs"], data["digest"], data["info"],
                   None if key is None else KeyParts.from_json(key))

    def to_json(self) -> dict[str, Any]:
        """The marker file's mapping: ``key`` only when the fingerprint kept its parts."""
        data: dict[str, Any] = {"fingerprint": self.fingerprint, "outputs": self.outputs, "digest": self.digest,
                                "info": self.info}
        if self.key is not None:
            data["key"] = self.key.to_json()
        return data


Action = Literal["computed", "skipped"]


@dataclass(frozen=True)
class UnitResult(Marker[InfoT]):
    """What every unit returns: its marker and what this run did with it (``action``, not stored)."""

    action: Action = field(kw_only=True)

    @classmethod
    def of(cls, marker: Marker[InfoT], action: Literal["computed", "skipped"], **extra: Any) -> Self:
        """``marker`` as the result of a run that took ``action`` (``extra``: a subclass's fields)."""
        return cls(marker.fingerprint, marker.outputs, marker.digest, marker.info, marker.key, action=action, **extra)


COMPUTED = "computed"
SKIPPED = "skipped"
MAYBE = "maybe"  # a plan's verdict: recomputed if an upstream unit's new output differs


@dataclass(frozen=True)
class Unit:
    """A kind of unit of work, declared by its stage: the plain function that does one unit and
    the name its runs carry (task name, progress, worker resources). ``probe``: the flow may run
    the unit's check itself first; only for units whose check reads nothing but markers and small
    tables. Only transient errors are retried (``corpusforge.cluster``)."""

    fn: Callable[..., Any]
    name: str
    probe: bool = False


# Where a fan-out hands each unit's result as it finishes (:meth:`FanOut.stream`): the index
# of its call and the result (a ledger, :class:`corpusforge.ledger.Ledger`, or a small tally).
Sink = Callable[[int, Any], None]


class FanOut(Protocol):
    """How a stage runs its units. Stages never import the orchestrator: a flow passes
    ``corpusforge.cluster.fan_out`` (Prefect task runs on the flow's Dask cluster); tests and
    notebooks get :data:`in_process`. Results always come in the order of ``calls``."""

    def __call__(self, unit: Unit, calls: list[dict[str, Any]]) -> list[Any]:
        """``[unit.fn(**c) for c in calls]``, run as the orchestrator sees fit."""

    def stream(self, unit: Unit, calls: list[dict[str, Any]], sink: Sink) -> None:
        """Each result handed to ``sink(i, result)`` as unit ``i`` finishes (any order), kept nowhere
        else: the flow process must not hold every partition's or shard's result at once."""

    def each(self, units: list[tuple[Unit, dict[str, Any]]]) -> list[Any]:
        """One call each of several kinds of unit, side by side."""

    def reduce(self, unit: Unit, merge: Unit, calls: list[dict[str, Any]]) -> Any:
        """The results of ``unit`` over ``calls`` merged pairwise by ``merge`` in the fixed
        tree of :func:`tree_reduce` (the same bits on any number of workers)."""


class InProcess:
    """Every unit here, one after the other, in order."""

    def __call__(self, unit: Unit, calls: list[dict[str, Any]]) -> list[Any]:
        return [unit.fn(**c) for c in calls]

    def stream(self, unit: Unit, calls: list[dict[str, Any]], sink: Sink) -> None:
        for i, kwargs in enumerate(calls):
            sink(i, unit.fn(**kwargs))

    def each(self, units: list[tuple[Unit, dict[str, Any]]]) -> list[Any]:
        return [u.fn(**kwargs) for u, kwargs in units]

    def reduce(self, unit: Unit, merge: Unit, calls: list[dict[str, Any]]) -> Any:
        return tree_reduce([unit.fn(**c) for c in calls], merge.fn)


in_process = InProcess()


def tree_reduce(items: list[Any], merge: Callable[[Any, Any], Any]) -> Any:
    """Merge ``items`` pairwise, level by level, in a fixed tree; return the root. The list
    is emptied as it is consumed, so merged items can be released."""
    if not items:
        raise ValueError("nothing to merge")
    level = items
    while len(level) > 1:
        nxt = [merge(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
        level.clear()
        level = nxt
    return level.pop()


def marker_path(rel: str) -> str:
    return f"{MARKERS}/{rel}.json"


def read_marker(store: Store, rel: str) -> Marker | None:
    """The marker of the unit whose main output is ``rel``, or None if it never completed."""
    path = marker_path(rel)
    return Marker.from_json(store.read_json(path)) if store.exists(path) else None


def require_marker(store: Store, rel: str, what: str) -> Marker:
    """The marker of ``rel``; a clear error when the unit is missing (never read as empty)."""
    marker = read_marker(store, rel)
    if marker is None:
        raise FileNotFoundError(f"{store.path(rel)} is not complete ({what}); run the stage that writes it")
    return marker


# Markers read side by side (:func:`require_markers`): on an object store each read is a
# round trip of tens of ms, so the O(P + S) markers a flow reads must never wait for each
# other; a window bounds how many are in flight, and held, at once.
MARKER_THREADS = 16
MARKER_WINDOW = 1024


def side_by_side(fn: Callable[[Any], Any], items: Iterable[Any], threads: int, window: int) -> Iterator[Any]:
    """``fn`` of each of ``items``, in order, on ``threads`` threads, ``window`` items held at a time
    (round trips overlap; what is held stays one window's whatever the count)."""
    pending = iter(items)
    with ThreadPoolExecutor(threads) as pool:
        while batch := list(itertools.islice(pending, window)):
            yield from pool.map(fn, batch)


def require_markers(store: Store, rels: Iterable[str], what: str) -> Iterator[Marker]:
    """:func:`require_marker` of each of ``rels``, in order, read side by side; one read each (a
    missing marker is the read's FileNotFoundError, not an ``exists`` round trip first)."""
    def read(rel: str) -> tuple[str, Marker | None]:
        try:
            return rel, Marker.from_json(store.read_json(marker_path(rel)))
        except FileNotFoundError:
            return rel, None

    for rel, marker in side_by_side(read, rels, MARKER_THREADS, MARKER_WINDOW):
        if marker is None:
            raise FileNotFoundError(f"{store.path(rel)} is not complete ({what}); run the stage that writes it")
        yield marker


def read_pinned(store: Store, rel: str, sha256: str, what: str) -> bytes:
    """The bytes of ``rel``, refused unless their SHA-256 is ``sha256``: a task handed a
    shared table by digest never works from a table another run rewrote since."""
    data = store.read_bytes(rel)
    if sha256_bytes(data) != sha256:
        raise ValueError(f"{store.path(rel)} changed while {what} ran (expected SHA-256 {sha256[:12]}…): "
                         "another build writes to the same output")
    return data


def digest_of(outputs: dict[str, str]) -> str:
    """One digest for a unit's output files (path → SHA-256)."""
    return sha256_bytes(canonical_json(sorted(outputs.items())).encode())


class WouldCompute(Exception):
    """Raised where a probed unit would start its work (:func:`probe`)."""


_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("corpusforge_probing", default=False)


def must_compute() -> None:
    """Mark where a unit starts its work: raises :class:`WouldCompute` while it is probed.
    :func:`run_unit` calls it; a unit that checks its own markers calls it after the check."""
    if _PROBING.get():
        raise WouldCompute()


def probe(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """``(True, result)`` when the unit ``fn(**kwargs)`` is current (it returns without
    work), else ``(False, None)``: it would compute, or it failed — its task run then does
    the work or reports the error, with its retries."""
    token = _PROBING.set(True)
    try:
        return True, fn(**kwargs)
    except Exception:  # WouldCompute, or an error its task run will raise again
        return False, None
    finally:
        _PROBING.reset(token)


def run_unit(store: Store, rel: str, fp: str, compute: Callable[[], tuple[dict[str, str], InfoT]]
             ) -> UnitResult[InfoT]:
    """Skip ``rel`` when its marker has fingerprint ``fp``; else run ``compute`` and mark it done.

    ``compute`` writes the unit's files and returns ``(outputs, info)``: the SHA-256 of each
    file it wrote (what ``Store.write_*`` return) and facts to keep in the marker."""
    if (marker := current_marker(store, rel, fp)) is not None:
        return UnitResult.of(marker, SKIPPED)
    must_compute()
    outputs, info = compute()
    return UnitResult.of(finish_unit(store, rel, fp, outputs, info), COMPUTED)


def joint_result(fp: str, markers: Iterable[Marker[Any]], info: InfoT, action: Action) -> UnitResult[InfoT]:
    """The result of a unit that marks several outputs done, one marker each (a merge group's
    edge files, a shard's features of each model): their files together under ``fp``."""
    outputs = {path: sha for m in markers for path, sha in m.outputs.items()}
    return UnitResult(str(fp), dict(sorted(outputs.items())), digest_of(outputs), info, action=action)


def current_marker(store: Store, rel: str, fp: str) -> Marker | None:
    """The marker of ``rel`` if it was completed with fingerprint ``fp``, else None."""
    marker = read_marker(store, rel)
    return marker if marker is not None and marker.fingerprint == fp else None


def finish_unit(store: Store, rel: str, fp: str, outputs: dict[str, str], info: InfoT) -> Marker[InfoT]:
    """Write the marker of a unit whose files are all written (for units that share work,
    like one decode feeding several models; others use :func:`run_unit`)."""
    marker = Marker(str(fp), dict(sorted(outputs.items())), digest_of(outputs), info,
                    fp.parts if isinstance(fp, UnitKey) else None)
    store.write_json(marker_path(rel), marker.to_json())
    return marker


class UnitKey(str):
    """A unit's fingerprint that also carries its parts (``parts``: code version, a hash per
    config field, the inputs' hash), which :func:`finish_unit` keeps in the marker."""

    parts: KeyParts


def unit_fingerprint(stage: str, code: str, config: Any, inputs: Any) -> UnitKey:
    """The fingerprint of one unit: stage, code version, config it reads, input digests."""
    key = UnitKey(fingerprint(stage, code, config, inputs))
    key.parts = KeyParts(code, config_hashes(config), fingerprint(inputs))
    return key


def config_hashes(config: Any, path: str = "") -> dict[str, str]:
    """A short hash per leaf of a config (``path`` → hash), so a changed field can be named
    without keeping its value (a config may hold endpoints or names users keep private)."""
    if isinstance(config, dict) and config:
        parts = [(f"{path}.{name}" if path else str(name), config[name]) for name in sorted(config)]
    elif isinstance(config, list | tuple) and config and path == "":
        parts = [(f"[{i}]", item) for i, item in enumerate(config)]
    else:
        return {path or "config": fingerprint(config)[:12]}
    return {field: h for part, value in parts for field, h in config_hashes(value, part).items()}


def explain(marker: Marker | None, key: str, inputs_known: bool = True) -> tuple[str, str]:
    """(action, reason) for a unit with fingerprint ``key`` and its current ``marker``, naming what
    changed when the marker kept its key's parts.

    ``inputs_known=False``: ``key`` was computed with stand-ins for inputs that upstream
    units write during the run; then only a changed code version or config is certain,
    and otherwise the verdict is :data:`MAYBE`."""
    if marker is None:
        return COMPUTED, "no completed output"
    if inputs_known and marker.fingerprint == key:
        return SKIPPED, "unchanged"
    old, new = marker.key, getattr(key, "parts", None)
    if old is None or new is None:
        if inputs_known:
            return COMPUTED, "fingerprint changed (the marker predates recorded key parts)"
        return MAYBE, "an input is recomputed first"
    reasons = []
    if old.code != new.code:
        reasons.append(f"code version {old.code} → {new.code}")
    fields = sorted(f for f in set(old.config) | set(new.config) if old.config.get(f) != new.config.get(f))
    if fields:
        reasons.append("config " + ", ".join(fields))
    if not inputs_known:
        return (COMPUTED, "; ".join(reasons)) if reasons else (MAYBE, "an input is recomputed first")
    if old.inputs != new.inputs:
        reasons.append("input digest changed")
    return COMPUTED, "; ".join(reasons) or "fingerprint changed"


STEPS_DIR = "work/steps"  # markers of the one-off global steps (:func:`run_step`)


def step_path(name: str) -> str:
    """Where the marker of the global step ``name`` is (under ``work/``: a step that runs
    only on a rebuild, like the account of changes, leaves the output tree a fresh build's)."""
    return f"{STEPS_DIR}/{name}.json"


def run_step(store: Store, name: str, key: str, fn: Callable[..., InfoT], kwargs: dict[str, Any],
             outputs: tuple[str, ...] = ()) -> UnitResult[InfoT]:
    """The one-off global step ``fn(**kwargs)`` as a unit keyed by ``key`` (:func:`step_call`): the
    result its marker recorded (as ``info``), or run and recorded (:func:`record_step`). ``outputs``:
    the few files it writes, which must all be there for it to count as done (a report someone
    removed is written again)."""
    if (done := step_result(store, name, key, outputs)) is not None:
        return done
    must_compute()
    return record_step(store, name, key, fn(**kwargs))


def step_result(store: Store, name: str, key: str, outputs: tuple[str, ...] = ()) -> UnitResult[Any] | None:
    """The result of the global step ``name`` (skipped) when its marker holds ``key`` and
    ``outputs`` are all there, else None (a step whose work is several fan-outs, which the
    flow drives itself, checks this first)."""
    try:
        marker = Marker.from_json(store.read_json(step_path(name)))
    except FileNotFoundError:
        return None
    if marker.fingerprint != key or not all(store.exists(rel) for rel in outputs):
        return None
    return UnitResult(marker.fingerprint, marker.outputs, marker.digest, marker.info["result"], action=SKIPPED)


def record_step(store: Store, name: str, key: str, result: InfoT) -> UnitResult[InfoT]:
    """Record the result of the global step ``name`` under ``key``; return it as a later run reads
    it back (JSON), so a rerun and a fresh build see the same."""
    result = json.loads(canonical_json(result))
    marker = Marker(key, {}, digest_of({}), {"result": result})
    store.write_json(step_path(name), marker.to_json())
    return UnitResult(marker.fingerprint, marker.outputs, marker.digest, result, action=COMPUTED)


def keyed(unit: Unit) -> Unit:
    """``unit`` run through :func:`run_step` (a :func:`step_call`): probed by the flow, so a
    current step makes no task run."""
    return Unit(run_step, unit.name, probe=True)


def step_call(store: Store, unit: Unit, config: Any, inputs: Any, kwargs: dict[str, Any],
              outputs: tuple[str, ...] = ()) -> dict[str, Any]:
    """The call of ``keyed(unit)`` for ``unit.fn(**kwargs)``, keyed by the code version of its module,
    ``config`` (every setting its result depends on) and ``inputs`` (the digests of all it reads)."""
    key = fingerprint(unit.name, code_version(unit.fn.__module__), config, inputs)
    return dict(store=store, name=unit.name, key=key, fn=unit.fn, kwargs=kwargs, outputs=tuple(outputs))


def forget_step(store: Store, name: str) -> None:
    """Remove the marker of a global step switched off (its caller removes its outputs): were
    it switched on again with the same key, it must not be read as done."""
    store.remove(step_path(name))


def prune(store: Store, folder: str, keep: Iterable[str]) -> list[str]:
    """Remove files (and their markers) in ``folder`` whose stem (the name up to the first dot) is
    not in ``keep``, and a killed writer's temporary files (``.name.part``); returns their names."""
    keep = set(keep)
    removed = []
    for name in store.listdir(folder):
        if name.startswith(".") or name.split(".", 1)[0] not in keep:
            store.remove(f"{folder}/{name}")
            store.remove(marker_path(f"{folder}/{name}"))
            removed.append(name)
    for name in store.listdir(f"{MARKERS}/{folder}"):
        if name.endswith(".json") and name.split(".", 1)[0] not in keep:
            store.remove(f"{MARKERS}/{folder}/{name}")
    return removed


SWEEP_NAMED = 5  # removed paths a sweep names back to the flow; it counts the rest


def sweep_temp_files(store: Store) -> dict[str, Any]:
    """Remove every temporary file (``.name.*.part``) a killed writer left under the output.

    Call it when all units of the run have finished, so no writer of this run is alive: a worker
    killed mid-write leaves its temp file behind while the rescheduled unit writes another, and
    pruning would only catch it on the next run. On an object store nothing partial is ever
    listed. Returns how many it removed and the first :data:`SWEEP_NAMED` of their paths (relative,
    sorted), so what goes back to the flow stays small. It walks names only, one folder's at a time;
    probed, a tree with no temporary file makes no task run."""
    removed, named = 0, []
    if not store.remote:
        for folder, _, names in os.walk(store.root):
            for name in names:
                if name.startswith(".") and name.endswith(".part"):
                    must_compute()  # probed (the flow walks): a tree with none makes no task run
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                    named = sorted([*named, os.path.relpath(os.path.join(folder, name), store.root)])[:SWEEP_NAMED]
    return {"removed": removed, "first": named}


SWEEP_TEMP_FILES = Unit(sweep_temp_files, "sweep-temp-files", probe=True)


def remove_tree(store: Store, *folders: str) -> None:
    """Remove whole output folders and their markers (a stage switched off)."""
    for folder in folders:
        store.remove(folder)
        store.remove(f"{MARKERS}/{folder}")


def completed_units(store: Store, folder: str, suffix: str) -> list[str]:
    """Sorted stems of ``{folder}/{stem}{suffix}`` files that have a marker."""
    end = f"{suffix}.json"
    return sorted(n[: -len(end)] for n in store.listdir(f"{MARKERS}/{folder}") if n.endswith(end))


@dataclass(frozen=True)
class StageSummary:
    """What a run did with one stage's units (a stage's surface: run, plan, summarise)."""

    stage: str
    computed: int = 0
    skipped: int = 0

    def counts(self) -> dict[str, int]:
        """The form receipts and run logs keep (their bytes depend on it: the key order too)."""
        return {COMPUTED: self.computed, SKIPPED: self.skipped}


class Outcome(TypedDict):
    """What was done with one output of a unit that writes several (each model's features of a shard)."""

    action: Action


def summarise(stage: str, results: Iterable[UnitResult[Any] | Outcome]) -> StageSummary:
    """The stage's summary over its unit results, or over one output's part of each (an :class:`Outcome`)."""
    counts = {COMPUTED: 0, SKIPPED: 0}
    for r in results:
        counts[r.action if isinstance(r, UnitResult) else r["action"]] += 1
    return StageSummary(stage, counts[COMPUTED], counts[SKIPPED])
