"""What a run would do with each unit, and why: the types every stage's ``plan_units`` returns.

A stage plans its units with the functions its units decide with (their keys and
:func:`corpusforge.contract.explain`), so plan and run cannot disagree; the flows only put the
stages' plans in order, judge what they judge as a whole against their receipts, and render.
Nothing here writes: a plan reads markers, listings and file times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, Marker, completed_units, explain, read_marker
from corpusforge.layout import MARKERS, staging_tar
from corpusforge.storage import Store

DELETE = "delete"
ACTIONS = {SKIPPED: "skip", COMPUTED: "recompute", MAYBE: "recompute if upstream output changes", DELETE: "delete"}
WHOLE = "(whole stage)"  # the one unit of a stage judged as a whole
EVERY_RUN = "recomputed on every run from the units' outputs (no model)"


@dataclass
class UnitPlan:
    """What the run will do with one unit, and why."""

    unit: str
    action: str
    reason: str


@dataclass
class StagePlan:
    """One stage's units. ``open``: the set of units is itself known only after upstream runs
    (units may be added), so only its recomputes are certain. ``names``: the stage's names for
    the positions of its key's config (:func:`corpusforge.contract.explain` names positions,
    ``[0]``), put into every reason; each stage keeps its own. ``outputs``: what the next
    stage's plan reads of each unit known before the run (its digest or marker), by unit.
    ``facts``: what the stage states about the run's work (a fetch: the URLs and hosts it asks)."""

    stage: str
    units: list[UnitPlan] = field(default_factory=list)
    open: bool = False
    names: dict[str, str] = field(default_factory=dict, repr=False)
    outputs: dict[str, Any] = field(default_factory=dict, repr=False)
    facts: dict[str, Any] = field(default_factory=dict, repr=False)

    def add(self, unit: str, action: str, reason: str) -> None:
        for part, name in self.names.items():
            reason = reason.replace(part, name)
        self.units.append(UnitPlan(unit, action, reason))

    def counts(self) -> dict[str, int]:
        return {ACTIONS[a]: sum(u.action == a for u in self.units) for a in ACTIONS}

    def changes(self) -> bool:
        """True when the run may change anything of this stage (a unit not skipped, or units added)."""
        return self.open or any(u.action != SKIPPED for u in self.units)


def changes(stages: Iterable[StagePlan]) -> bool:
    """True when any of ``stages`` may change what a later stage reads."""
    return any(s.changes() for s in stages)


def judge_unit(stage: StagePlan, store: Store, rel: str, unit: str, key_of: Callable[..., str], *args: Any,
               full: bool = False) -> Marker | str | None:
    """Judge a unit whose key ``key_of(*args)`` takes upstream digests (None: not known before
    the run; only its code and config are then compared). Returns what downstream reads: the
    unit's digest, or its marker with ``full``; None when it is recomputed."""
    known = all(_known(a) for a in args)
    marker = read_marker(store, rel)
    action, reason = explain(marker, key_of(*(a if _known(a) else _placeholder(a) for a in args)), inputs_known=known)
    stage.add(unit, action, reason)
    if action != SKIPPED or marker is None:
        return None
    return marker if full else marker.digest


def _known(value: Any) -> bool:
    if isinstance(value, list):
        return all(v is not None for v in value)
    return value is not None


def _placeholder(value: Any) -> Any:
    """Stands for unknown digests when only the code and config parts of a key are compared."""
    return [v if isinstance(v, str) else "?" for v in value] if isinstance(value, list) else "?"


def deletions(stage: StagePlan, store: Store, folder: str, suffix: str, keep: Iterable[str],
              reason: str = "no longer in the plan", prefix: str = "") -> None:
    """Completed units of ``folder`` the run's pruning removes (not in ``keep``)."""
    kept = set(keep)
    for name in completed_units(store, folder, suffix):
        if name not in kept:
            stage.add(prefix + name, DELETE, reason)


def unknown_units(stage: StagePlan, store: Store, folder: str, suffix: str) -> None:
    """A stage whose units are planned from upstream output that will be recomputed."""
    stage.open = True
    for name in completed_units(store, folder, suffix):
        stage.add(name, MAYBE, "planned from upstream output that is recomputed first")


def switched_off(stage: StagePlan, store: Store, folders: Iterable[str], reason: str) -> StagePlan:
    """Every unit with a marker under ``folders`` is deleted (the stage is switched off)."""
    for folder in folders:
        for rel in marker_files(store, folder):
            stage.add(rel, DELETE, reason)
    return stage


def marker_files(store: Store, folder: str) -> list[str]:
    """Relative output paths of every unit with a marker under ``folder`` (recursively)."""
    base = store.path(f"{MARKERS}/{folder}")
    fs = store.fs
    root = fs._strip_protocol(base)
    if not fs.exists(root):
        return []
    return sorted(f"{folder}/{p[len(root) + 1:-len('.json')]}" for p in fs.find(root) if p.endswith(".json"))


def mtime(store: Store, rel: str) -> float | None:
    """The modification time of ``rel`` in seconds, or None when it does not exist."""
    path = store.fs._strip_protocol(store.path(rel))
    if not store.fs.exists(path):
        return None
    info = store.fs.info(path)
    value = info.get("mtime") or info.get("LastModified") or info.get("created")
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def newest_marker(store: Store, rels: Iterable[str]) -> float:
    """The time the last of the units ``rels`` completed (0 when none did)."""
    return max((mtime(store, f"{MARKERS}/{rel}.json") or 0.0 for rel in rels), default=0.0)


def changed_fields(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted names of the config fields that differ between two config dumps."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [f for k in sorted(set(old) | set(new))
                for f in changed_fields(old.get(k), new.get(k), f"{path}.{k}" if path else k)]
    return [] if old == new else [path]


def names(units: list[str]) -> str:
    """The first few unit names, for a reason."""
    return ", ".join(units[:5]) + (", …" if len(units) > 5 else "")


def unfinished(store: Store, folders: Iterable[str], written_last: str) -> bool:
    """True when a unit under ``folders`` completed after ``written_last``, the file its run
    writes last (or that file is missing): the last run did not complete."""
    last = mtime(store, written_last)
    return last is None or newest_marker(store, (rel for f in folders for rel in marker_files(store, f))) > last


def staged_size(store: Store, shards: Iterable[str]) -> dict[str, int]:
    """Images and bytes of ``shards``' staging tars under ``store``, from their markers (a
    unit to recompute reads all of them at most): the size of the work when no time was recorded."""
    infos = [m.info for shard in shards if (m := read_marker(store, staging_tar(shard))) is not None]
    return {"images": sum(int(i.get("count", 0)) for i in infos), "bytes": sum(int(i.get("bytes", 0)) for i in infos)}
