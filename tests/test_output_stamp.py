"""The output list's key (:func:`tasks.report.receipt.output_stamp`, issue 31): a walk one
folder at a time that never lists ``work/``, the published versions or a hidden folder, and
gives the digest the whole-tree walk of commit 33e96ec gave, locally and on real S3."""

from __future__ import annotations

import os

import pytest
import s3fs

from corpusforge.storage import Store
from tasks.report.receipt import output_stamp
from tests.old_code import module_at

OLD_COMMIT = "33e96ec5f1c8bf2bb9226bedb108a4c63050ed52"  # output_stamp with fs.find(detail=True)

# names that sort tricky: '-' and '.' sort before '/', '0' after; a file beside a folder whose
# name it begins; markers in nested folders; files the stamp skips at the top level only
TREE = ["a.b", "a0", "a/b.json", "a/b.c", "a/b/c.parquet", "a/b-c/d", "a-b/x.parquet", "ab/a",
        "_markers/a.json", "_markers/a/b.json", "_markers/a-b/c.json", "_markers/a.b.json",
        "receipt.json", "report.md", "a/receipt.json", "work-x/y", "versionsx", "a/.b.part", ".hidden/x",
        "work/w/0", "work/w/1", "versions/v1/a", "_markers/work/z.json"]
BESIDE = ["a", "a-b", "work"]  # objects named as a folder is, which only an object store holds
UNLISTED = ("work", "versions", ".hidden")  # folders none of whose files the stamp counts


def _old_stamp(store: Store) -> str:
    return module_at(OLD_COMMIT, "tasks/report/receipt.py", "old_receipt").output_stamp(store)


def _write(store: Store, tree: list[str] = TREE) -> None:
    for i, rel in enumerate(tree):
        store.write_bytes(rel, f"{rel}\n".encode() * (i + 1))


def test_local_stamp_is_the_whole_tree_walks_and_skips_the_unlisted_folders(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "out"))
    _write(store)
    os.makedirs(tmp_path / "out" / ".hidden" / "deep")
    old = _old_stamp(store)
    scanned: list[str] = []
    scandir = os.scandir

    def spy(path: str):  # os.walk lists each folder with os.scandir: record which
        scanned.append(os.path.relpath(path, store.root))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", spy)
    assert output_stamp(store) == old
    monkeypatch.undo()
    assert scanned and not [p for p in scanned if p.split(os.sep)[0] in UNLISTED]
    before = output_stamp(store)
    store.write_bytes("a/b/c.parquet", b"longer than before\n" * 9)
    store.write_bytes("work/w/2", b"not listed")
    assert output_stamp(store) == _old_stamp(store) != before


def test_s3_stamp_is_the_find_walks_and_never_lists_the_unlisted_folders(s3, monkeypatch):
    s3fs.S3FileSystem(**s3, skip_instance_cache=True).mkdir("cf-stamp")
    store = Store("s3://cf-stamp/out", storage_options=s3)
    _write(store, TREE + BESIDE)
    for i in range(200):  # the walk must not list them: a find would hold every one
        store.write_bytes(f"work/many/{i:04d}", b"x")
    old = _old_stamp(store)
    listed: list[str] = []
    ls = store.fs.ls

    def spy(path: str, detail: bool = True, **kwargs):
        listed.append(path)
        return ls(path, detail=detail, **kwargs)

    monkeypatch.setattr(store.fs, "ls", spy)
    assert output_stamp(store) == old
    monkeypatch.undo()
    folders = sorted({p.rstrip("/")[len("cf-stamp/out"):].lstrip("/") for p in listed})
    assert folders == ["", "_markers", "_markers/a", "_markers/a-b", "_markers/work", "a", "a-b", "a/b", "a/b-c",
                       "ab", "work-x"]
    before = output_stamp(store)
    store.write_bytes("_markers/a/b.json", b"rewritten")  # same size, a new ETag
    assert output_stamp(store) == _old_stamp(store) != before
