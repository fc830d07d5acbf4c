"""Key ranges (corpusforge/key_ranges.py) and the two steps built on them (issue 31): the
previous-version copy and the diff of two versions. Ranges small enough to split three levels
deep must give every row once, each key in one range, the ranges in key order, and the same
files, byte for byte, as one range holding every row (the whole-corpus query they replace),
on versions with null, repeated, non-ASCII and added keys, captions of both origins, and
source paths inside and outside the source root."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusforge.key_ranges import Table, key_ranges
from corpusforge.layout import MANIFEST_SCHEMA, RESOLVED_SCHEMA, manifest_path
from tasks.ingest.files import resolved_path
from tasks.release.files import RELEASE_ASSIGNMENT_SCHEMA, release_assignment_path
from tasks.report.files import CHANGES_MD, CHANGES_TABLE, PREVIOUS_RECORDS, RECEIPT
from corpusforge.storage import Store
from tasks.report import changes

TINY = dict(rows_per_range=40, fan_out=3)  # 1,500 rows of all tables: three levels of splits
WHOLE = dict(rows_per_range=10**9)  # one range: every row in one query, as before ranges


def _keys(rng: random.Random, n: int) -> list[str | None]:
    pool = [f"k{i:05d}" for i in range(n)] + ["é-accent", "日本", "Z-upper", ""]
    keys: list[str | None] = [rng.choice(pool) for _ in range(n)]
    for i in rng.sample(range(n), n // 20):
        keys[i] = None
    return keys


def test_ranges_give_every_row_once_in_key_order(tmp_path):
    rng = random.Random(1)
    store = Store(str(tmp_path), fsync=False)
    schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
    tables, rows = {}, {}
    for name, files in (("a", 4), ("b", 1)):
        rels, rows[name] = [], []
        for f in range(files):
            keys = _keys(rng, 300)
            table = pa.table({"key": keys, "n": [len(rows[name]) + i for i in range(len(keys))]}, schema=schema)
            rows[name] += table.to_pylist()
            rels.append(f"{name}/{f}.parquet")
            store.write_parquet(rels[-1], table)
        tables[name] = Table(store, rels, schema)

    for nulls_first in (False, True):
        seen: dict[str, list[dict]] = {"a": [], "b": []}
        ranges = []
        for ranged in key_ranges(tables, nulls_first=nulls_first, **TINY):
            keys = {r["key"] for t in ranged.values() for r in t.to_pylist()}
            ranges.append(keys)
            for name, table in ranged.items():
                assert table.schema == schema
                seen[name] += table.to_pylist()
            assert sum(t.num_rows for t in ranged.values()) <= TINY["rows_per_range"] or len(keys) == 1
        for name in rows:  # every row once
            assert sorted(seen[name], key=lambda r: r["n"]) == rows[name]
        nulls = [i for i, keys in enumerate(ranges) if None in keys]
        assert nulls == [0 if nulls_first else len(ranges) - 1] and ranges[nulls[0]] == {None}
        ordered = [sorted(keys) for keys in ranges if None not in keys]
        assert len(ordered) > TINY["fan_out"] ** 2  # split more than two levels deep
        for lower, upper in zip(ordered, ordered[1:]):  # a key in one range, the ranges in key order
            assert lower[-1] < upper[0]


def _version(root: Path, seed: int, source: str) -> Store:
    """A finished version's tables: manifest parts, release assignments, resolved partitions, receipt."""
    rng = random.Random(seed)
    store = Store(str(root), fsync=False)
    plans: list[dict] = []
    for part in range(5):
        keys = _keys(random.Random(part), 120)  # the same keys in both versions
        manifest, resolved = [], []
        for row, key in enumerate(keys):
            status = rng.choice(["kept", "kept", "kept", "filtered", "error"])
            path = rng.choice([f"{source}/{key}.jpg", f"/elsewhere/{key}.jpg", None])
            record = {"key": key, "source_path": path, "part": part, "row": row, "status": status,
                      "reason": "" if status == "kept" else rng.choice(["small", "decode"]),
                      "split": rng.choice(["train", "test"]) if status == "kept" else None,
                      "shard": f"train-{rng.randrange(3):06d}" if status == "kept" else None,
                      "sha256": f"{rng.randrange(4):064x}"}
            if rng.random() < 0.97:  # some records left out: added or removed between versions
                manifest.append(record)
            resolved.append({"key": key, "part": part, "row": row, "caption": rng.choice([None, f"input {row}"])})
            if status == "kept" and key is not None and rng.random() < 0.5:
                plans.append({"key": key, "caption": rng.choice([None, f"model {seed} {key}"])})
        store.write_parquet(manifest_path(part), pa.Table.from_pylist(manifest, schema=MANIFEST_SCHEMA))
        store.write_parquet(resolved_path(part), pa.Table.from_pylist(resolved, schema=RESOLVED_SCHEMA))
    unique = list({p["key"]: p for p in plans}.values())
    for i in range(3):
        store.write_parquet(release_assignment_path(f"train-{i:06d}"),
                            pa.Table.from_pylist(unique[i::3], schema=RELEASE_ASSIGNMENT_SCHEMA))
    store.write_json(RECEIPT, {"source": source})
    return store


def _ranged(monkeypatch, **sizes) -> None:
    monkeypatch.setattr(changes, "key_ranges", functools.partial(key_ranges, **sizes))


@pytest.mark.parametrize("previous_kept", [True, False])
def test_the_copy_and_the_diff_are_the_whole_query_s_bytes(tmp_path, monkeypatch, previous_kept):
    files = {}
    for label, sizes in (("whole", WHOLE), ("tiny", TINY)):
        _ranged(monkeypatch, **sizes)
        old = _version(tmp_path / label / "old", 1, "/data/src")
        new = _version(tmp_path / label / "new", 2, "s3://bucket/src")  # moved: paths relative to each root
        out = Store(str(tmp_path / label / "out"), fsync=False)
        assert changes.keep_previous_version(old)
        summary = changes.diff_versions(old, new, out, previous_kept=previous_kept)
        assert all(summary["records"].values()) and summary["changed_fields"]["caption"]
        files[label] = [Path(old.path(PREVIOUS_RECORDS)).read_bytes(), Path(out.path(CHANGES_TABLE)).read_bytes(),
                        Path(out.path(CHANGES_MD)).read_bytes(), json.dumps(summary, sort_keys=True)]
    assert files["tiny"] == files["whole"]
    records = pq.read_table(tmp_path / "tiny" / "old" / PREVIOUS_RECORDS)
    assert records.num_rows > 500 and records["key"].null_count > 0
    assert pq.ParquetFile(tmp_path / "tiny" / "out" / CHANGES_TABLE).metadata.num_rows == sum(
        json.loads(files["tiny"][3])["records"].values())


def test_the_account_of_one_version_twice_is_the_diffs_without_a_read(tmp_path):
    """A rerun that changed nothing compares two byte-equal receipts: the flow writes the empty
    account itself (no task); it must be what the diff of the version with itself writes."""
    version = _version(tmp_path / "v", 1, "/data/src")
    assert changes.keep_previous_version(version)
    diffed, shortcut = (Store(str(tmp_path / name), fsync=False) for name in ("diffed", "shortcut"))
    summary = changes.diff_versions(version, version, diffed, previous_kept=True)
    assert summary["records"] == {"added": 0, "removed": 0, "changed": 0}
    assert json.dumps(changes.same_version_account(shortcut), sort_keys=True) == json.dumps(summary, sort_keys=True)
    for rel in (CHANGES_TABLE, CHANGES_MD):
        assert Path(shortcut.path(rel)).read_bytes() == Path(diffed.path(rel)).read_bytes()


def test_row_groups_are_the_same_however_the_rows_come(tmp_path):
    """Rows written in batches of any size make the file one contiguous batch makes (a row group
    cut across two ranges' batches included)."""
    rng = random.Random(3)
    n = changes.BATCH_ROWS + 9_000
    columns = {f: [rng.choice(["a", "bb", None]) for _ in range(n)] for f in changes.FIELDS}
    columns["sha256"] = [f"{rng.getrandbits(256):064x}" for _ in range(n)]  # past the dictionary's size
    table = pa.table({"key": [f"k{rng.randrange(10**6):07d}" for _ in range(n)], "source_path": [None] * n,
                      "occurrence": list(range(n)), **columns}, schema=changes.RECORD_SCHEMA)
    store = Store(str(tmp_path), fsync=False)
    with changes._parquet_writer(store, "one.parquet", changes.RECORD_SCHEMA) as rows:
        rows.add(table.to_batches(max_chunksize=changes.BATCH_ROWS))
    cuts = sorted(rng.sample(range(1, n), 40))
    with changes._parquet_writer(store, "cut.parquet", changes.RECORD_SCHEMA) as rows:
        for lo, hi in zip([0, *cuts], [*cuts, n]):
            rows.add(table.slice(lo, hi - lo).to_batches())
    assert (tmp_path / "one.parquet").read_bytes() == (tmp_path / "cut.parquet").read_bytes()
    assert [g.num_rows for g in map(pq.ParquetFile(tmp_path / "cut.parquet").metadata.row_group,
                                    range(2))] == [changes.BATCH_ROWS, 9_000]
