"""The stage contract's parts on their own: markers, skipping, pruning, code versions, cuts."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

import corpusforge.version as version
from corpusforge.chunking import cut_name, cut_survivors
from corpusforge.contract import (COMPUTED, SKIPPED, KeyParts, Marker, UnitResult, completed_units, finish_unit,
                                  marker_path, prune, read_marker, require_marker, run_unit, unit_fingerprint)
from corpusforge.storage import Store


def test_run_unit_skips_only_an_identical_fingerprint(tmp_path):
    store = Store(str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return {"a/x.bin": store.write_bytes("a/x.bin", b"payload")}, {"n": 1}

    first = run_unit(store, "a/x.bin", "fp1", compute)
    again = run_unit(store, "a/x.bin", "fp1", compute)
    other = run_unit(store, "a/x.bin", "fp2", compute)
    assert [first.action, again.action, other.action] == [COMPUTED, SKIPPED, COMPUTED]
    assert len(calls) == 2
    assert first.digest == other.digest  # same bytes, same digest: downstream stays valid
    assert (tmp_path / marker_path("a/x.bin")).exists() and store.listdir("a") == ["x.bin"]
    assert completed_units(store, "a", ".bin") == ["x"]


# The marker files the TypedDict shape wrote (before markers were dataclasses), byte for byte:
# a unit keyed by unit_fingerprint (so with ``key``) and one with a plain fingerprint (without).
KEYED_MARKER = (
    b'{"digest":"db4d9379f7f75955d5261609abf1d7c6ed16260df327e5e448b5b9cf84a8182a",'
    b'"fingerprint":"81c22fc1fc6bab0e6e6d496f9037797d","info":{"count":2,"z":[1,"\xc3\xa9"]},'
    b'"key":{"code":"v1","config":{"mode.b":"1c28f2eb0958","size":"06d033ece664"},'
    b'"inputs":"b6ed1793fd758f239b9e4eaa4b0401b3"},'
    b'"outputs":{"d/a.idx":"de7d1b721a1e0632b7cf04edf5032c8ecffa9f9a08492152b926f1a5a7e765d7",'
    b'"d/x.bin":"239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"}}\n')
PLAIN_MARKER = (
    b'{"digest":"3c6e0f32a2f345cff2a1bef2aff749d99c522eb0bdc08a110b9050cc37ca8977","fingerprint":"plain",'
    b'"info":{},"outputs":{"d/y.bin":"239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5"}}\n')


def test_marker_files_keep_their_bytes(tmp_path):
    """The dataclasses write exactly the bytes the mapping shape wrote, and read them back equal."""
    store = Store(str(tmp_path))
    fp = unit_fingerprint("demo", "v1", {"size": 3, "mode": {"b": True}}, ["d1"])
    sha = store.write_bytes("d/x.bin", b"payload")
    keyed = finish_unit(store, "d/x.bin", fp, {"d/x.bin": sha, "d/a.idx": store.write_bytes("d/a.idx", b"i")},
                        {"count": 2, "z": [1, "é"]})
    plain = finish_unit(store, "d/y.bin", "plain", {"d/y.bin": sha}, {})
    assert (tmp_path / marker_path("d/x.bin")).read_bytes() == KEYED_MARKER
    assert (tmp_path / marker_path("d/y.bin")).read_bytes() == PLAIN_MARKER
    assert keyed.key == KeyParts("v1", {"mode.b": "1c28f2eb0958", "size": "06d033ece664"},
                                 "b6ed1793fd758f239b9e4eaa4b0401b3")
    assert plain.key is None and "key" not in plain.to_json()
    assert list(keyed.to_json()) == ["fingerprint", "outputs", "digest", "info", "key"]
    for marker, rel in ((keyed, "d/x.bin"), (plain, "d/y.bin")):
        assert Marker.from_json(marker.to_json()) == marker
        assert read_marker(store, rel) == marker
        assert store.read_json(marker_path(rel)) == marker.to_json()


def test_a_result_is_its_marker_and_the_action(tmp_path):
    store = Store(str(tmp_path))
    result = run_unit(store, "a/x.bin", "fp", lambda: ({"a/x.bin": store.write_bytes("a/x.bin", b"x")}, {"n": 1}))
    again = run_unit(store, "a/x.bin", "fp", lambda: pytest.fail("a current unit recomputed"))
    assert isinstance(result, UnitResult) and result.action == COMPUTED and again.action == SKIPPED
    assert again == UnitResult.of(read_marker(store, "a/x.bin"), SKIPPED)
    assert "action" not in result.to_json()  # what a run did is never stored


def test_a_unit_that_fails_leaves_no_marker(tmp_path):
    store = Store(str(tmp_path))

    def compute():
        store.write_bytes("a/x.bin", b"half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        run_unit(store, "a/x.bin", "fp", compute)
    assert read_marker(store, "a/x.bin") is None
    with pytest.raises(FileNotFoundError, match="not complete"):
        require_marker(store, "a/x.bin", "test unit")


def test_prune_keeps_exactly_the_plan_with_markers_and_temp_files(tmp_path):
    store = Store(str(tmp_path))
    for name in ("000000", "000001", "000002"):
        run_unit(store, f"d/{name}.parquet", "fp", lambda n=name: ({f"d/{n}.parquet": store.write_bytes(
            f"d/{n}.parquet", n.encode())}, {}))
    (tmp_path / "d" / ".000001.parquet.x.part").write_bytes(b"left by a killed writer")
    removed = prune(store, "d", {"000000", "000001"})
    assert sorted(removed) == [".000001.parquet.x.part", "000002.parquet"]
    assert store.listdir("d") == ["000000.parquet", "000001.parquet"]
    assert completed_units(store, "d", ".parquet") == ["000000", "000001"]


def test_data_folders_hold_only_data(tmp_path):
    """Markers live under _markers/, so dataset readers take a folder as it is."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    store = Store(str(tmp_path))
    for i in range(3):
        run_unit(store, f"edges/{i:06d}.parquet", "fp", lambda i=i: ({f"edges/{i:06d}.parquet": store.write_parquet(
            f"edges/{i:06d}.parquet", pa.table({"x": [i]}))}, {}))
    assert sorted(ds.dataset(tmp_path / "edges").to_table()["x"].to_pylist()) == [0, 1, 2]


def test_code_version_follows_the_import_closure_only(monkeypatch, tmp_path):
    closure = version.module_closure("tasks.release.shards")
    assert "tasks.release.shards" in closure and "corpusforge.storage" in closure
    assert "tasks.ingest.partition" not in closure and not any(m.startswith("sample_corpus") for m in closure)
    before = {m: version.code_version(m) for m in ("tasks.release.shards", "tasks.ingest.partition", "tasks.shared.features.extract")}
    original = version._module_file

    def edited(module):
        path = original(module)
        if module == "tasks.release.shards":
            copy = tmp_path / "release.py"
            copy.write_bytes(path.read_bytes() + b"# only a comment\n")
            return copy
        return path

    monkeypatch.setattr(version, "_module_file", edited)
    version.code_version.cache_clear()
    try:
        after = {m: version.code_version(m) for m in before}
    finally:
        version.code_version.cache_clear()
    assert after["tasks.release.shards"] != before["tasks.release.shards"]
    assert after["tasks.ingest.partition"] == before["tasks.ingest.partition"]
    assert after["tasks.shared.features.extract"] == before["tasks.shared.features.extract"]


def _imports_by_ast(path: Path) -> set[str]:
    """The reference reading of a module's imports: its syntax tree (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    return {n for n in names if version._module_file(n) is not None}


def test_imports_read_from_bytecode_equal_the_syntax_tree_for_every_project_module():
    files = sorted(p for package in version.PROJECT_PACKAGES for p in (version.ROOT / package).rglob("*.py"))
    assert len(files) > 50
    for path in files:
        assert version._imports(path) == _imports_by_ast(path), path


def _cuts(keys: list[str], size: int) -> dict[str, tuple[str, ...]]:
    candidates = [(i, n) for i, k in enumerate(keys) if (n := cut_name(k, size)) is not None]
    return {c.name: tuple(keys[c.start:c.start + c.count]) for c in cut_survivors(len(keys), candidates, size)}


def test_cuts_cover_every_record_once_within_bounds():
    keys = [f"k{i:05d}" for i in range(5000)]
    shards = _cuts(keys, 100)
    flat = [k for members in shards.values() for k in members]
    assert sorted(flat) == keys and len(set(shards)) == len(shards)
    last = max(shards, key=lambda n: keys.index(shards[n][0]))
    sizes = [len(m) for name, m in shards.items() if name != last]
    assert min(sizes) >= 50 and max(sizes) <= 200
    assert 0.7 < len(keys) / len(shards) / 100 < 1.3


@pytest.mark.parametrize("change", ["append", "insert", "delete"])
def test_cuts_move_only_near_a_change(change):
    """The property reruns rely on: a local change leaves every other shard as it was."""
    rng = random.Random(5)
    keys = [f"k{i:05d}" for i in range(5000)]
    if change == "append":
        after = keys + [f"new{i}" for i in range(500)]
    elif change == "insert":
        at = rng.randrange(len(keys))
        after = keys[:at] + ["inserted"] + keys[at:]
    else:
        after = keys[:2500] + keys[2501:]
    before, now = _cuts(keys, 100), _cuts(after, 100)
    changed = {name for name, members in now.items() if before.get(name) != members}
    limit = 11 if change == "append" else 2  # appended: the last shard and at most 500/50 new shards
    assert len(changed) <= limit, (change, len(changed))
    if change == "append":  # only the last shard grows; every other changed name is new
        assert len([name for name in changed if name in before]) <= 1
        assert all(set(before[name]) <= set(now[name]) for name in changed if name in before)
