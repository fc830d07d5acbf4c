"""Planning a table source: chunks of ``partition_size`` rows whose bytes depend on the rows
alone, not on how the table's reader batched them; a GPIC root's tars in GPIC order."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from corpusforge.storage import Store
from tasks.ingest.sources import SourceConfig, cut_partitions


def _table(n: int) -> pa.Table:
    return pa.table({"path": [f"img/{i}.jpg" for i in range(n)], "caption": [f"c{i}" if i % 3 else None
                                                                              for i in range(n)],
                     "source": list(range(n)), "note": [{"a": i} for i in range(n)]})


def test_table_chunks_do_not_depend_on_the_readers_batches(tmp_path):
    digests = []
    for name, row_group in (("one", 1234), ("many", 97)):
        src = tmp_path / name
        src.mkdir()
        pq.write_table(_table(1234), src / "metadata.parquet", row_group_size=row_group)
        kind, parts = cut_partitions(str(src), Store(str(tmp_path / f"out-{name}")), SourceConfig())
        assert kind == "table" and [pq.read_metadata(p.uri).num_rows for p in parts] == [500, 500, 234]
        digests.append([p.digest for p in parts])
    assert digests[0] == digests[1]
    rows = pq.read_table(parts[1].uri).to_pylist()
    assert rows[0]["path"] == "img/500.jpg" and rows[0]["caption"] == "c500" and rows[0]["source"] == "500"
    assert json.loads(rows[0]["extra"]) == {"note": {"a": 500}} and rows[1]["caption"] is None
    assert pq.read_table(parts[0].uri)["caption"][0].as_py() is None


def test_a_gpic_root_plans_one_partition_per_tar_split_by_split(tmp_path):
    for split, names in (("test", ["gpic_test_00000.tar"]), ("train", ["gpic_train_00001.tar", "gpic_train_00000.tar"]),
                         ("val", ["gpic_val_00000.tar"])):
        (tmp_path / "gpic" / split).mkdir(parents=True)
        for name in names:
            (tmp_path / "gpic" / split / name).write_bytes(b"x" * len(name))
    kind, parts = cut_partitions(str(tmp_path / "gpic"), Store(str(tmp_path / "out")), SourceConfig())
    assert kind == "tars"
    assert [p.uri.rsplit("/", 2)[-2] + "/" + p.uri.rsplit("/", 1)[-1][5:] for p in parts] == [
        "train/train_00000.tar", "train/train_00001.tar", "val/val_00000.tar", "test/test_00000.tar"]
    assert all(p.digest.startswith(f"{len(p.uri.rsplit('/', 1)[-1])}:") for p in parts)  # size:mtime:ctime:inode


def test_an_unchanged_table_is_not_read_again_and_a_changed_one_is(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(_table(1234), src / "metadata.parquet")
    store = Store(str(tmp_path / "out"))
    _, first = cut_partitions(str(src), store, SourceConfig())
    chunks = {p.uri: (tmp_path / p.uri).stat().st_mtime_ns for p in first}
    _, again = cut_partitions(str(src), store, SourceConfig())
    assert again == first and {p.uri: (tmp_path / p.uri).stat().st_mtime_ns for p in again} == chunks  # not rewritten

    (tmp_path / first[2].uri).unlink()  # a chunk lost: planned again
    _, redone = cut_partitions(str(src), store, SourceConfig())
    assert redone == first and (tmp_path / first[2].uri).exists()

    pq.write_table(_table(600), src / "metadata.parquet")  # the table changed: read again, stale chunks pruned
    _, changed = cut_partitions(str(src), store, SourceConfig())
    assert [pq.read_metadata(p.uri).num_rows for p in changed] == [500, 100]
    assert sorted(n for n in store.listdir("work/input")) == ["000000.parquet", "000001.parquet", "_partitions.parquet"]
