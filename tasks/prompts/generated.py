"""The generated images' listing for signal 2, out of core: one task lists the
``{model}/{prompt_id}/{image}`` tree and cuts it into the variance units, so neither the flow
nor a unit's parameters hold a file of it. Listed as the build lists a source
(:mod:`tasks.shared.listing`: links listed, never followed), each image resolved and stamped as
it is listed (a file that may not be read gets its ``unsafe_path`` reason as its stamp).
"""

from __future__ import annotations

import posixpath
import tempfile
from dataclasses import dataclass, field
from typing import Any, TypedDict

import fsspec
import pyarrow as pa
import pyarrow.compute as pc

from corpusforge.key_ranges import Table, key_ranges
from corpusforge.storage import Store, file_stamp, is_remote, url_to_fs
from tasks.prompts.files import (GENERATED_LISTING_SCHEMA, PROMPT_ORDER_SCHEMA, PROMPTS_LISTING, PROMPTS_ORDER,
                                 generated_listing_path)
from tasks.prompts.tables import SAFE_ID
from tasks.shared import listing
from tasks.shared.inputs import resolve_input
from tasks.shared.listing import Listed, sorted_ranges, spill_listing

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp")
UNUSABLE_SHOWN = 100  # unusable files named in the summary
SPILL_SCHEMA = pa.schema([("prompt_id", pa.string()), ("model", pa.string()), ("name", pa.string()),
                          ("stamp", pa.string())])
# key: model, the prompt's place in the set and the file name, joined by NUL (below every
# character a safe id or a listed name holds), so the keys sort as (model, place, name) do
PLACED_SCHEMA = pa.schema([("key", pa.string()), ("model", pa.string()), ("prompt_id", pa.string()),
                           ("name", pa.string()), ("stamp", pa.string())])
PLACE_DIGITS = 12


class GeneratedListing(TypedDict):
    """What the flow gets of the listing: O(models), plus the folders and files no unit reads."""

    models: list[str]  # every model with a {model}/{prompt_id}/{image} file, sorted
    units: dict[str, int]  # model -> its variance units (those of a valid prompt with images)
    unknown_prompt_folders: list[str]  # {model}/{prompt_id} of a prompt not in the valid set, sorted
    unusable: list[str]  # the first UNUSABLE_SHOWN files not {model}/{prompt_id}/{image} with safe names
    unusable_count: int


@dataclass
class _Seen:
    """What the listing keeps besides the images, bounded by the models and the files shown."""

    models: set[str] = field(default_factory=set)
    unusable: list[str] = field(default_factory=list)
    unusable_count: int = 0

    def unusable_file(self, rel: str) -> None:
        self.unusable_count += 1
        self.unusable.append(rel)
        if len(self.unusable) > 2 * UNUSABLE_SHOWN:
            self.unusable = sorted(self.unusable)[:UNUSABLE_SHOWN]


def write_prompt_order(out: Store, prompts: list[dict[str, Any]]) -> None:
    """The valid prompts' ids in the prompt set's order: what the listing cuts units by."""
    ids = [p["prompt_id"] for p in prompts if p["status"] == "valid"]
    out.write_parquet(PROMPTS_ORDER, pa.table({"prompt_id": ids, "place": pa.array(range(len(ids)), pa.int64())},
                                              schema=PROMPT_ORDER_SCHEMA))


def _spilled(entries: list[Listed], root: str, uri: str, remote: bool, fs: fsspec.AbstractFileSystem,
             seen: _Seen) -> pa.Table:
    """A spill part: the usable images among ``entries``, each resolved and stamped."""
    columns: dict[str, list[str]] = {name: [] for name in SPILL_SCHEMA.names}
    for path, _, info in entries:
        rel = path[len(root) + 1:] if remote else posixpath.relpath(path, root)
        parts = rel.split("/")
        if (len(parts) != 3 or not rel.lower().endswith(IMAGE_EXTS)
                or not (SAFE_ID.fullmatch(parts[0]) and SAFE_ID.fullmatch(parts[1]))):
            seen.unusable_file(rel)
            continue
        model, prompt, name = parts
        seen.models.add(model)
        location, refusal = resolve_input(uri, rel, [uri])
        columns["prompt_id"].append(prompt)
        columns["model"].append(model)
        columns["name"].append(name)
        columns["stamp"].append(file_stamp(fs, fsspec.core.strip_protocol(location), info) if location else refusal)
    return pa.table(columns, schema=SPILL_SCHEMA)


def _placed(spill: Store, parts: list[str], order: Table, unknown: set[str]) -> list[str]:
    """The images joined to their prompt's place in the set, one range of prompt ids at a time,
    in spill parts keyed by (model, place, name); the folders of prompts not in the set are
    added to ``unknown``."""
    placed: list[str] = []
    for ranged in key_ranges({"images": Table(spill, parts, SPILL_SCHEMA), "order": order},
                             listing.LISTING_RANGE_ROWS, listing.LISTING_FAN_OUT, key="prompt_id"):
        joined = ranged["images"].join(ranged["order"], "prompt_id", join_type="left outer", use_threads=False)
        known = pc.is_valid(joined["place"])
        stray = joined.filter(pc.invert(known))
        unknown.update(f"{m}/{p}" for m, p in zip(stray["model"].to_pylist(), stray["prompt_id"].to_pylist(),
                                                  strict=True))
        joined = joined.filter(known)
        place = pc.utf8_lpad(pc.cast(joined["place"], pa.string()), PLACE_DIGITS, "0")
        key = pc.binary_join_element_wise(joined["model"], place, joined["name"], "\x00")
        placed.append(listing.spill_path("placed", len(placed)))
        spill.write_parquet(placed[-1], pa.table([key, *(joined[c] for c in PLACED_SCHEMA.names[1:])],
                                                 schema=PLACED_SCHEMA))
    return placed


def chunk_name(unit: int) -> str:
    """A model's variance unit's name: its output's and its listing file's."""
    return f"{unit:06d}"


def list_generated(out: Store, generated: str, options: dict[str, Any], prompts_per_unit: int) -> GeneratedListing:
    """One listing of ``generated`` into ``out``'s :data:`PROMPTS_LISTING`, cut into units of
    ``prompts_per_unit`` valid prompts (in :data:`PROMPTS_ORDER`'s order) with images per model,
    a file a unit (a row group of one file made each unit read every unit's footer, O(units²)).
    Run as a task, so files are resolved and stamped there, not in the flow process; nothing but
    a unit's rows and a range of the listing is held."""
    fs, root = url_to_fs(generated, options)
    uri = generated.rstrip("/")
    remote = is_remote(generated)
    root = root.rstrip("/") if remote else root.rstrip("/") or "/"
    seen, unknown = _Seen(), set()
    units: dict[str, int] = {}
    out.remove(PROMPTS_LISTING)
    with tempfile.TemporaryDirectory(prefix="corpusforge-generated-") as tmp:
        spill = Store(tmp, fsync=False)
        parts = spill_listing(spill, "listing", fs, root, remote, lambda e: _spilled(e, root, uri, remote, fs, seen))
        placed = _placed(spill, parts, Table(out, [PROMPTS_ORDER], PROMPT_ORDER_SCHEMA), unknown) if parts else []
        unit: dict[str, list[str]] = {name: [] for name in GENERATED_LISTING_SCHEMA.names}

        def flush() -> None:
            if unit["name"]:
                out.write_parquet(generated_listing_path(model, chunk_name(units[model] - 1)),
                                  pa.table(unit, schema=GENERATED_LISTING_SCHEMA))
                for held in unit.values():
                    held.clear()

        model, prompt, prompts = None, None, 0
        for rows in (sorted_ranges(spill, placed, PLACED_SCHEMA, "key", remote) if placed else ()):
            for m, p, name, stamp in zip(*(rows[c].to_pylist() for c in ("model", "prompt_id", "name", "stamp")),
                                         strict=True):
                if m != model:
                    flush()
                    model, prompt, prompts = m, None, 0
                if p != prompt:
                    prompt, prompts = p, prompts + 1
                    if (prompts - 1) % prompts_per_unit == 0:  # a unit's first prompt
                        flush()
                        units[m] = units.get(m, 0) + 1
                for column, value in zip(unit.values(), (p, name, stamp), strict=True):
                    column.append(value)
        flush()
    return {"models": sorted(seen.models), "units": units, "unknown_prompt_folders": sorted(unknown),
            "unusable": sorted(seen.unusable)[:UNUSABLE_SHOWN], "unusable_count": seen.unusable_count}


def unit_prompts(out: Store, model: str, unit: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """Unit ``unit`` of ``model`` in the listing: its prompts in the set's order, each with its
    image files (name, stamp) in name order."""
    rows = out.read_parquet(generated_listing_path(model, chunk_name(unit)))
    prompts: list[tuple[str, list[tuple[str, str]]]] = []
    for p, name, stamp in zip(*(rows[c].to_pylist() for c in ("prompt_id", "name", "stamp")), strict=True):
        if not prompts or prompts[-1][0] != p:
            prompts.append((p, []))
        prompts[-1][1].append((name, stamp))
    return prompts
