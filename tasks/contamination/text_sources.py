"""Where canary texts come from, as ``(ids, texts)`` of one unit in its row order: corpus
captions (the ``.txt`` members of a staging shard's selected keys, by ranged reads; doc id =
record key), a text table (.parquet, .jsonl, .csv or .txt, one text a line; copied by one unit
into parts of ``part_size`` texts, keyed by a stamp of the file; doc id = the id column or
``row-NNNNNN``) or the evaluation items (every (item, text field)).
"""

from __future__ import annotations

import json
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from corpusforge.contract import UnitResult, prune, run_unit, unit_fingerprint
from tasks.contamination.files import eval_items_path, text_work_path
from corpusforge.storage import Store, uri_stamp
from corpusforge.version import code_version
from tasks.contamination.config import TextCorpusConfig
from tasks.contamination.selection import read_selection
from tasks.shared.samples import staged_captions

SOURCE = "source"
_SOURCE_SCHEMA = pa.schema([("doc_id", pa.string()), ("text", pa.string())])


def caption_texts(corpus: Store, shard: str, out: Store, selection: str | None) -> tuple[list[str], list[str]]:
    """Captions of one staging shard (selected keys only), in shard order."""
    return staged_captions(corpus, shard, read_selection(out, selection, shard) if selection else None)


def _read_table(cfg: TextCorpusConfig) -> tuple[list[str | None], list[str]]:
    uri, so = cfg.path, cfg.storage_options
    with fsspec.open(uri, "rb", **so) as f:
        if uri.endswith(".txt"):
            texts = f.read().decode("utf-8").splitlines()
            return [None] * len(texts), texts
        if uri.endswith(".parquet"):
            table = pq.read_table(f)
        elif uri.endswith(".csv"):
            table = pacsv.read_csv(f)
        elif uri.endswith(".jsonl"):
            table = pajson.read_json(f)
        else:
            raise ValueError(f"{uri}: text tables are .parquet, .jsonl, .csv or .txt")
    if cfg.text_column not in table.column_names:
        raise ValueError(f"{uri} has no column {cfg.text_column!r} (columns: {table.column_names})")
    texts = ["" if t is None else str(t) for t in table[cfg.text_column].to_pylist()]
    ids = ([None if i is None else str(i) for i in table[cfg.id_column].to_pylist()]
           if cfg.id_column else [None] * len(texts))
    return ids, texts


def cut_table_parts(out: Store, cfg: TextCorpusConfig) -> UnitResult:
    """Copy a text table into parts of ``part_size`` texts (skipped while its stamp is unchanged)."""
    fp = unit_fingerprint("contamination-text-source", code_version(__name__),
                          [cfg.text_column, cfg.id_column, cfg.part_size], [cfg.path, uri_stamp(cfg.path,
                                                                                             cfg.storage_options)])
    rel = text_work_path(SOURCE, "_plan").replace(".parquet", ".json")

    def compute() -> tuple[dict[str, str], dict[str, Any]]:
        ids, texts = _read_table(cfg)
        parts, outputs = [], {}
        for n, lo in enumerate(range(0, len(texts), cfg.part_size)):
            name = f"{n:06d}"
            chunk_ids = [i if i is not None else f"row-{lo + j:06d}" for j, i in enumerate(ids[lo:lo + cfg.part_size])]
            table = pa.table({"doc_id": chunk_ids, "text": texts[lo:lo + cfg.part_size]}, schema=_SOURCE_SCHEMA)
            outputs[text_work_path(SOURCE, name)] = out.write_parquet(text_work_path(SOURCE, name), table)
            parts.append(name)
        prune(out, f"{text_work_path(SOURCE, 'x').rsplit('/', 1)[0]}", set(parts) | {"_plan"})
        outputs[rel] = out.write_json(rel, {"parts": parts, "texts": len(texts)})
        return outputs, {"parts": parts, "texts": len(texts)}

    return run_unit(out, rel, fp, compute)


def table_texts(out: Store, part: str) -> tuple[list[str], list[str]]:
    t = out.read_parquet(text_work_path(SOURCE, part))
    return t["doc_id"].to_pylist(), t["text"].to_pylist()


def item_texts(out: Store, chunk: str, fields: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``(item ids, fields, texts)`` of one evaluation chunk: one entry per (item, field)."""
    t = out.read_parquet(eval_items_path(chunk), columns=["item_id", "texts"])
    ids, names, texts = [], [], []
    for item_id, blob in zip(t["item_id"].to_pylist(), t["texts"].to_pylist(), strict=True):
        values = json.loads(blob or "{}")
        for name in fields:
            ids.append(item_id)
            names.append(name)
            texts.append(values.get(name) or "")
    return ids, names, texts
