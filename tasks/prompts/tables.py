"""Reading what the evaluation team brings: the prompt table, the score table, the taxonomy.

Files are read once, whole, and hashed as read (their SHA-256 goes into the receipt);
nothing here ever opens them for writing. A bad row is that row's error with a reason,
never a crash or a silent skip; a file that cannot be read at all is a ``ValueError``
naming it (the CLI's preflight turns that into one line and exit code 2).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
import yaml

from corpusforge.storage import open_uri

SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


@dataclass(frozen=True)
class InputFile:
    uri: str
    sha256: str
    data: bytes


def read_input(uri: str, options: dict[str, Any]) -> InputFile:
    with open_uri(uri, options) as f:
        data = f.read()
    return InputFile(uri, hashlib.sha256(data).hexdigest(), data)


def parse_table(file: InputFile) -> pa.Table:
    """A .parquet, .jsonl or .csv file's rows."""
    uri = file.uri.lower()
    try:
        if uri.endswith(".parquet"):
            return pq.read_table(io.BytesIO(file.data))
        if uri.endswith(".csv"):
            return pacsv.read_csv(io.BytesIO(file.data))
        if uri.endswith((".jsonl", ".json")):
            return pajson.read_json(io.BytesIO(file.data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{file.uri}: not a readable table ({exc})") from None
    raise ValueError(f"{file.uri}: tables are .parquet, .jsonl or .csv")


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "y")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return bool(value)


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def prompt_rows(file: InputFile, cfg: Any, extra_anchors: set[str] | frozenset[str] = frozenset()
                ) -> list[dict[str, Any]]:
    """One dict per table row: prompt_id, text, cohort, category, difficulty, anchor, row,
    status (valid | error) and reason. ``cfg`` is a :class:`~tasks.prompts.config.PromptSetConfig`."""
    table = parse_table(file)
    if cfg.id_column not in table.column_names or cfg.text_column not in table.column_names:
        raise ValueError(f"{file.uri}: needs columns {cfg.id_column!r} and {cfg.text_column!r} "
                         f"(has {table.column_names})")

    def column(name: str | None) -> list[Any]:
        return table[name].to_pylist() if name and name in table.column_names else [None] * table.num_rows

    ids, texts = column(cfg.id_column), column(cfg.text_column)
    cohorts, categories = column(cfg.cohort_column), column(cfg.category_column)
    difficulties, anchors = column(cfg.difficulty_column), column(cfg.anchor_column)
    rows, seen = [], set()
    for i in range(table.num_rows):
        pid, text = _text(ids[i]), _text(texts[i])
        reason = ""
        if not pid:
            reason = "missing_id"
        elif not SAFE_ID.fullmatch(pid):
            reason = "unsafe_id"
        elif pid in seen:
            reason = "duplicate_id"
        elif not text or not text.strip():
            reason = "empty_text"
        elif difficulties[i] is not None and _number(difficulties[i]) is None and not isinstance(difficulties[i], str):
            reason = "bad_difficulty"
        if pid and not reason:
            seen.add(pid)
        difficulty = difficulties[i]
        rows.append({"row": i, "prompt_id": pid or f"row-{i:06d}", "text": text or "",
                     "cohort": _text(cohorts[i]), "category": _text(categories[i]),
                     "difficulty": None if difficulty is None else str(difficulty),
                     "anchor": _flag(anchors[i]) or (pid in extra_anchors),
                     "status": "error" if reason else "valid", "reason": reason})
    return rows


def score_rows(file: InputFile, cfg: Any) -> tuple[list[tuple[str, str, float]], dict[str, int]]:
    """``(prompt_id, model, score)`` of every usable row and the count of unusable rows per reason.
    ``cfg`` is a :class:`~tasks.prompts.config.CohortConfig`."""
    table = parse_table(file)
    needed = [cfg.prompt_column, cfg.model_column, cfg.score_column]
    if missing := [c for c in needed if c not in table.column_names]:
        raise ValueError(f"{file.uri}: missing columns {missing} (has {table.column_names})")
    rows, rejected = [], {}
    seen = set()
    for pid, model, score in zip(*(table[c].to_pylist() for c in needed), strict=True):
        value, pid, model = _number(score), _text(pid), _text(model)
        reason = ("missing_id" if not pid or not model else "bad_score" if value is None
                  else "duplicate_score" if (pid, model) in seen else "")
        if reason:
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        seen.add((pid, model))
        rows.append((pid, model, value))
    return rows, dict(sorted(rejected.items()))


def taxonomy_categories(file: InputFile) -> list[dict[str, str]]:
    """``[{name, description}, …]`` from a YAML/JSON taxonomy file (``categories:`` or a bare list)."""
    try:
        data = yaml.safe_load(file.data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"taxonomy {file.uri}: not YAML/JSON ({exc})") from None
    items = data.get("categories") if isinstance(data, dict) else data
    if not isinstance(items, list) or len(items) < 2:
        raise ValueError(f"taxonomy {file.uri}: expected `categories:` with at least two {{name, description}}")
    out, names = [], set()
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            raise ValueError(f"taxonomy {file.uri}: category {n} has no name")
        name = item["name"].strip()
        if name in names:
            raise ValueError(f"taxonomy {file.uri}: category {name!r} appears twice")
        names.add(name)
        out.append({"name": name, "description": str(item.get("description") or "")})
    return out


def category_text(category: dict[str, str]) -> str:
    """What a category's embedding is made of: its name and description."""
    return f"{category['name']}: {category['description']}" if category["description"] else category["name"]


def manifest_of(rows: list[dict[str, Any]]) -> str:
    """SHA-256 of the prompt set as read (ids, texts and every column used), in table order."""
    keep = ("prompt_id", "text", "cohort", "category", "difficulty", "anchor", "status", "reason")
    return hashlib.sha256(json.dumps([[r[k] for k in keep] for r in rows], ensure_ascii=False).encode()).hexdigest()
