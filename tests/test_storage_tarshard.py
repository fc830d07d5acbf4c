"""Ground floor: atomic writes, completion markers (the stage contract), deterministic tars and safe tar reading."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

from corpusforge.contract import COMPUTED, SKIPPED, current_marker, read_marker, run_unit
from corpusforge.storage import Store
from corpusforge.tarshard import Sample, iter_tar_samples, split_member_name, write_tar


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    store = Store(str(tmp_path))
    with pytest.raises(RuntimeError):
        with store.atomic_write("a/b.bin") as f:
            f.write(b"partial")
            raise RuntimeError("killed mid-write")
    assert not store.exists("a/b.bin")
    assert list((tmp_path / "a").iterdir()) == []  # no temp file left behind either


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o027])
def test_written_files_are_readable_whatever_the_umask(tmp_path, umask):
    """A written file is 0644 (as mkstemp's were made readable): created so when the process's
    umask allows it (no chmod), chmodded when it does not. A fresh process: the umask is read once."""
    code = ("import os, sys; os.umask(int(sys.argv[2], 8)); from corpusforge.storage import Store; "
            "s = Store(sys.argv[1]); s.write_bytes('a/b.bin', b'x'); s.write_linked(['c/d', 'e/f'], b'y'); "
            "print(*(oct(os.stat(os.path.join(sys.argv[1], p)).st_mode & 0o777) for p in ('a/b.bin', 'c/d', 'e/f')))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), oct(umask)], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.split() == ["0o644"] * 3


def test_markers_and_fingerprints(tmp_path):
    store = Store(str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return {"x.tar": store.write_bytes("x.tar", b"data")}, {"n": len(calls)}

    assert read_marker(store, "x.tar") is None and current_marker(store, "x.tar", "fp1") is None
    first = run_unit(store, "x.tar", "fp1", compute)
    assert first.action == COMPUTED and calls == [1]
    marker = read_marker(store, "x.tar")
    assert store.exists("_markers/x.tar.json") and store.listdir("") == ["_markers", "x.tar"]
    assert set(marker.to_json()) == {"fingerprint", "outputs", "digest", "info"}  # plain str key: no key parts
    assert marker.fingerprint == "fp1" and marker.outputs == {"x.tar": store.sha256("x.tar")}
    assert marker.info == {"n": 1}
    assert current_marker(store, "x.tar", "fp1") is not None and current_marker(store, "x.tar", "fp2") is None
    assert run_unit(store, "x.tar", "fp1", compute).action == SKIPPED and calls == [1]
    assert run_unit(store, "x.tar", "fp2", compute).action == COMPUTED and calls == [1, 1]
    assert read_marker(store, "x.tar").fingerprint == "fp2"


def _samples():
    return [Sample("a", {"jpg": b"\xff\xd8" + b"x" * 1000, "txt": b"cap a", "json": b"{}"}),
            Sample("b", {"png": b"\x89PNG" + b"y" * 10, "txt": b"cap b", "json": b"{}"})]


def test_tar_is_deterministic_and_index_points_at_member_data():
    one, two = io.BytesIO(), io.BytesIO()
    r1, r2 = write_tar(one, _samples()), write_tar(two, _samples())
    assert one.getvalue() == two.getvalue() and r1.sha256 == r2.sha256
    data = one.getvalue()
    for row in r1.index.to_pylist():
        member = next(s for s in _samples() if s.key == row["key"]).members[row["ext"]]
        assert data[row["offset"]:row["offset"] + row["size"]] == member
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar.getmembers():
            assert (info.mtime, info.uid, info.gid, info.uname, info.gname) == (0, 0, 0, "", "")


def _tarfile_bytes(samples) -> bytes:
    """The same samples through Python's tarfile in stream mode: the writer's reference."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for sample in samples:
            for ext, data in sample.members.items():
                info = tarfile.TarInfo(f"{sample.key}.{ext}")
                info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = \
                    len(data), 0, 0o444, 0, 0, "", ""
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("n", [0, 1, 7, 40])
def test_tar_bytes_equal_what_tarfile_writes(n):
    rng = random.Random(n)
    samples = [Sample(("k" * 90 + str(i))[-rng.randint(2, 96):], {
        "jpg": rng.randbytes(rng.randint(0, 3000)), "txt": b"c" * rng.randint(0, 700), "json": b"{}"})
        for i in range(n)]
    out = io.BytesIO()
    write_tar(out, samples)
    assert out.getvalue() == _tarfile_bytes(samples)


def test_tar_written_through_a_file_descriptor_in_batches_equals_tarfile_and_its_digest(tmp_path, monkeypatch):
    """Members big and many enough to span several writev batches (and short writes the
    writer must resume); the tar's digest comes from the helper thread."""
    import hashlib
    import os

    from corpusforge import tarshard

    real_writev, calls = os.writev, []

    def short_writev(fd, pieces):  # take at most 700 kB per call, as a regular file may
        calls.append(len(pieces))
        taken, budget = [], 700_000
        for p in pieces:
            if budget <= 0:
                break
            taken.append(memoryview(p)[:budget])
            budget -= len(taken[-1])
        return real_writev(fd, taken)

    monkeypatch.setattr(tarshard.os, "writev", short_writev)
    rng = random.Random(7)
    samples = [Sample(f"k{i}", {"jpg": rng.randbytes(rng.choice([0, 1, 511, 512, 513, 300_000])),
                                "txt": b"c" * rng.randint(0, 700), "json": b"{}"}) for i in range(600)]
    path = tmp_path / "s.tar"
    with open(path, "wb") as f:
        result = write_tar(f, samples)
    data = path.read_bytes()
    assert data == _tarfile_bytes(samples) and len(calls) > 2
    assert result.sha256 == hashlib.sha256(data).hexdigest() and result.bytes == len(data)
    shas = {(r["key"], r["ext"]): r["sha256"] for r in result.index.to_pylist()}
    assert shas[("k3", "jpg")] == hashlib.sha256(samples[3].members["jpg"]).hexdigest()


def test_many_tiny_members_stay_within_writevs_buffer_limit(tmp_path):
    """A batch of tiny members passes the writer's piece limit by a member's pieces; one
    writev call may take only IOV_MAX buffers (more is EINVAL). Found by the graph tests'
    2,000-member shards of empty images."""
    samples = [Sample(f"k{i}", {"jpg": b"", "txt": b"c", "json": b"{}"}) for i in range(2000)]
    path = tmp_path / "tiny.tar"
    with open(path, "wb") as f:
        write_tar(f, samples)
    assert path.read_bytes() == _tarfile_bytes(samples)


def test_a_shard_of_small_members_is_written_as_it_goes_not_held_whole(tmp_path):
    """Members under SMALL_MEMBER are joined with their headers; a long run of them (a
    shard of thumbnails) is written in runs of SMALL_RUN bytes, not kept to the end."""
    from corpusforge.tarshard import SMALL_RUN, ShardSink

    path = tmp_path / "small.tar"
    written_before_last: list[int] = []

    def samples():
        for i in range(5000):  # ~2.5 KB of tar each: 12 MB, three times the sink's batch
            if i == 4999:
                written_before_last.append(path.stat().st_size)
            yield Sample(f"k{i}", {"jpg": b"\xff" * 100, "txt": b"c" * 50, "json": b"{}"})

    with open(path, "wb") as f:
        write_tar(f, samples())
    assert written_before_last[0] >= path.stat().st_size - SMALL_RUN - ShardSink.BATCH_BYTES
    assert path.read_bytes() == _tarfile_bytes(list(samples()))


def test_known_member_digests_go_to_the_index_unhashed():
    """A digest the caller vouches for (staging: ingest's SHA-256) is what the index lists."""
    out = io.BytesIO()
    result = write_tar(out, [Sample("a", {"jpg": b"x" * 10, "txt": b"t"}, digests={"jpg": "f" * 64})])
    rows = {r["ext"]: r["sha256"] for r in result.index.to_pylist()}
    assert rows["jpg"] == "f" * 64 and rows["txt"] == __import__("hashlib").sha256(b"t").hexdigest()


def test_atomic_writes_publish_all_files_or_none(tmp_path):
    store = Store(str(tmp_path))
    with store.atomic_writes("a/x.bin", "b/y.bin", "z.bin") as (x, y, z):
        x.write(b"x" * 100_000)
        y.write(b"y")
        z.write(b"")
    assert [store.read_bytes(p) for p in ("a/x.bin", "b/y.bin", "z.bin")] == [b"x" * 100_000, b"y", b""]
    with pytest.raises(RuntimeError):
        with store.atomic_writes("a/x.bin", "c/new.bin") as (x, new):
            x.write(b"changed")
            new.write(b"new")
            raise RuntimeError("killed mid-write")
    assert store.read_bytes("a/x.bin") == b"x" * 100_000 and not store.exists("c/new.bin")
    assert not [p for p in tmp_path.rglob("*.part")]


def _one_write_under_many_names(store: Store) -> None:
    store.write_bytes("u/b.json", b"old\n")
    store.write_linked(["u/a.json", "u/b.json", "v/c.json"], b"batch\n")
    assert [store.read_bytes(f"{p}.json") for p in ("u/a", "u/b", "v/c")] == [b"batch\n"] * 3


def test_one_write_under_many_names(tmp_path):
    """``write_linked``: every name holds the bytes, one file hard-linked, an existing name
    replaced, no temporary file left."""
    _one_write_under_many_names(Store(str(tmp_path)))
    assert len({(tmp_path / f"{p}.json").stat().st_ino for p in ("u/a", "u/b", "v/c")}) == 1
    assert not [p for p in tmp_path.rglob("*.part")]


def test_one_write_under_many_names_on_s3(s3):
    """``write_linked`` on an object store: one upload, copied server-side to the other names."""
    store = Store("s3://linked/corpus", s3)
    store.fs.mkdir("linked")
    _one_write_under_many_names(store)


def test_webdataset_reads_our_tars(tmp_path):
    path = tmp_path / "s.tar"
    with open(path, "wb") as f:
        write_tar(f, _samples())
    got = list(wds.WebDataset(str(path), shardshuffle=False))
    assert [s["__key__"] for s in got] == ["a", "b"] and got[1]["txt"] == b"cap b"


def test_unsafe_keys_are_refused_on_write():
    with pytest.raises(ValueError):
        write_tar(io.BytesIO(), [Sample("../evil", {"jpg": b"x"})])
    with pytest.raises(ValueError):
        write_tar(io.BytesIO(), [Sample("a.b", {"jpg": b"x"})])


@pytest.mark.parametrize("name", ["/etc/passwd.jpg", "../up.jpg", "a/../../b.jpg", "noext", "a\\b.jpg", ".hidden"])
def test_unsafe_member_names(name):
    assert split_member_name(name) is None


def test_hostile_and_truncated_tars_become_errors():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ["ok.jpg", "../escape.jpg"]:
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        link = tarfile.TarInfo("link.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    got = list(iter_tar_samples(io.BytesIO(buf.getvalue())))
    assert [(s.key, s.error is None) for s in got] == [("ok", True), ("../escape.jpg", False), ("link", False)]
    assert got[2].error.name == "link.jpg" and got[2].members == {}  # the sample of the link, no member kept
    truncated = list(iter_tar_samples(io.BytesIO(buf.getvalue()[:700])))
    assert truncated[-1].error is not None and "truncated" in truncated[-1].error.reason


def _shard_samples(n: int = 200) -> list[Sample]:
    rng = random.Random(3)
    return [Sample(f"k{i}", {"jpg": rng.randbytes(rng.randint(0, 40_000)), "txt": b"c" * rng.randint(0, 300),
                             "json": b"{}"}) for i in range(n)]


def test_syncing_ahead_while_writing_changes_no_byte(tmp_path, monkeypatch):
    """Sync-ahead (fdatasync of the written part every few MB, from a helper thread) is
    only about when bytes reach the disk: the tar, its digest and index are those of a
    plain write. A tiny interval makes it sync several times during this small tar."""
    from corpusforge import tarshard
    from corpusforge.writeback import SyncAhead

    syncs = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real_fdatasync(fd))[1])
    monkeypatch.setattr(SyncAhead, "EVERY", 64 << 10)
    monkeypatch.setattr(tarshard.ShardSink, "BATCH_BYTES", 64 << 10)
    written = SyncAhead.written

    def settled(self, size):  # each due sync runs: on a loaded machine one still running covered the next
        if self.running is not None:
            self.running.result()
        written(self, size)

    monkeypatch.setattr(SyncAhead, "written", settled)
    samples = _shard_samples()
    with open(tmp_path / "synced.tar", "wb") as f:
        synced = write_tar(f, samples, sync_ahead=True)
    plain = write_tar(io.BytesIO(), samples)
    data = (tmp_path / "synced.tar").read_bytes()
    assert len(syncs) >= 2
    assert data == _tarfile_bytes(samples) and synced.sha256 == plain.sha256 == hashlib.sha256(data).hexdigest()
    assert synced.index.equals(plain.index)


def test_a_failed_sync_ahead_fails_the_write(tmp_path, monkeypatch):
    """An I/O error reported to a background sync is the write's error: Linux reports a
    write-back error to one fsync only, so the caller's final fsync might succeed after it.
    (Mocked: a disk error cannot be caused here.)"""
    from corpusforge import tarshard
    from corpusforge.writeback import SyncAhead

    def failing_fdatasync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    monkeypatch.setattr(SyncAhead, "EVERY", 64 << 10)
    monkeypatch.setattr(tarshard.ShardSink, "BATCH_BYTES", 64 << 10)
    store = Store(str(tmp_path))
    with pytest.raises(OSError, match="Input/output error"), store.atomic_write("s.tar") as f:
        write_tar(f, _shard_samples(), sync_ahead=True)
    assert list(tmp_path.iterdir()) == []  # neither the tar nor its temp file


def test_sync_ahead_only_for_a_regular_file_the_store_fsyncs(tmp_path):
    """A pipe cannot be synced; a store that does not fsync (remote: a temp file that is
    uploaded; ``fsync=False``: throwaway data) gets no syncs ahead either."""
    from corpusforge.tarshard import ShardSink

    read_end, write_end = os.pipe()
    try:
        with open(write_end, "wb", closefd=False) as pipe:
            sink = ShardSink(pipe, sync_ahead=True)
            assert sink.sync_ahead is None
            sink.abort()
    finally:
        os.close(read_end)
        os.close(write_end)
    with open(tmp_path / "f", "wb") as f:
        sink = ShardSink(f, sync_ahead=True)
        assert sink.sync_ahead is not None
        sink.close()
    assert Store(str(tmp_path)).durable and not Store(str(tmp_path), fsync=False).durable
    assert not Store("s3://bucket/corpus").durable
