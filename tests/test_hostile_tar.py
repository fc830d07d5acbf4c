"""Hostile tar members (issue 14, scenario 7), as one tar on disk built through a whole build.

``../x``, absolute paths, ``dir/../..`` escapes, symbolic and hard links, character and
block devices, FIFOs, a NUL and a newline in names, a 300-character name and duplicate
keys (adjacent and far apart) sit between ordinary samples, and one sample holds a
symbolic link beside its image. The build must complete with one manifest row per sample
(a member with an unusable name is a sample of its own), each unsafe member a per-record
error with its reason (a hostile member makes its whole sample the error), each duplicate
flagged (never merged into the first), and nothing written outside the output root (the
whole temporary tree is compared before and after).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from flows.build_corpus import BuildConfig, build
from tests.test_ingest import jpeg

pytestmark = [pytest.mark.scenario(7), pytest.mark.slow, pytest.mark.timeout(300)]


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    return name, data, kind, link


# name (as in the tar) -> expected (status, reason); None: an ordinary member of a sample above
MEMBERS = [
    (member("good1.jpg", jpeg(300, 300, 1)), ("kept", "")),
    (member("good1.txt", b"caption one"), None),
    (member("../x.jpg", jpeg(300, 300, 2)), ("error", "unsafe_name: unsafe member name")),
    (member("/abs/y.jpg", jpeg(300, 300, 3)), ("error", "unsafe_name: unsafe member name")),
    (member("dir/../../z.jpg", jpeg(300, 300, 4)), ("error", "unsafe_name: unsafe member name")),
    (member("sym.jpg", kind=tarfile.SYMTYPE, link="/etc/passwd"),
     ("error", "unsafe_member: not a regular file: symbolic link to '/etc/passwd'")),
    (member("hard.jpg", kind=tarfile.LNKTYPE, link="good1.jpg"),
     ("error", "unsafe_member: not a regular file: hard link to 'good1.jpg'")),
    (member("chr.jpg", kind=tarfile.CHRTYPE), ("error", "unsafe_member: not a regular file: character device")),
    (member("blk.jpg", kind=tarfile.BLKTYPE), ("error", "unsafe_member: not a regular file: block device")),
    (member("fifo.jpg", kind=tarfile.FIFOTYPE), ("error", "unsafe_member: not a regular file: FIFO")),
    (member("nuXl.jpg", jpeg(300, 300, 5)), ("error", "unsafe_name: unsafe member name")),  # NUL patched in
    (member("new\nline.jpg", jpeg(300, 300, 6)), ("error", "unsafe_key: 'new\\nline'")),
    (member("L" * 300 + ".jpg", jpeg(300, 300, 7)), ("error", f"unsafe_key: {'L' * 300!r}")),
    (member("good2.jpg", jpeg(300, 300, 8)), ("kept", "")),
    (member("good2.jpg", jpeg(300, 300, 9)), ("error", "duplicate_key: good2 appeared earlier in the input")),     # adjacent repeat
    (member("good3.jpg", jpeg(300, 300, 10)), ("kept", "")),
    (member("meta.jpg", jpeg(300, 300, 12)), ("error", "unsafe_member: not a regular file: symbolic link to "
                                                       "'/etc/passwd'")),  # one row for the sample
    (member("meta.json", kind=tarfile.SYMTYPE, link="/etc/passwd"), None),  # a hostile member of it
    (member("meta.txt", b"its caption"), None),
    (member("good1.jpg", jpeg(300, 300, 11)), ("error", "duplicate_key: good1 appeared earlier in the input")),    # far repeat
    (member("good1.txt", b"another caption"), None),
]


def hostile_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for (name, data, kind, link), _ in MEMBERS:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            if name == "nuXl.jpg":
                info.pax_headers = {"path": name}  # a PAX record, where a NUL survives the header
            tar.addfile(info, io.BytesIO(data) if data else None)
    raw = buf.getvalue()
    return raw.replace(b"path=nuXl.jpg", b"path=nu\x00l.jpg")


def snapshot(root: Path, skip: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else p.is_dir()
            for p in sorted(root.rglob("*")) if skip not in p.parents and p != skip}


def test_hostile_tar_members_are_per_record_errors_and_nothing_escapes(tmp_path, prefect_server, monkeypatch):
    src = tmp_path / "tars"
    src.mkdir()
    (src / "00000.tar").write_bytes(hostile_tar())
    out = tmp_path / "deep" / "out"
    out.parent.mkdir()
    monkeypatch.chdir(src)  # a relative write would land here
    before = snapshot(tmp_path, out)
    build(BuildConfig.model_validate({
        "source": str(src), "out": str(out), "validation": {"min_side": 1},
        "staging": {"shard_size": 8}, "splits": {"shard_size": 8, "val": 0, "test": 0},
        "near_dedup": None, "features": {"models": []},
        "licenses": None}))  # bare test tars carry no licence (the allow-list: test_licenses.py)
    assert snapshot(tmp_path, out) == before, "something was written outside the output root"
    assert not Path("/abs").exists() and not (tmp_path / "x.jpg").exists()

    rows = ds.dataset(out / "manifest", format="parquet").to_table().sort_by([("part", "ascending"),
                                                                             ("row", "ascending")]).to_pylist()
    expected = [want for _, want in MEMBERS if want is not None]
    assert [(r["status"], r["reason"]) for r in rows] == expected
    assert next(r for r in rows if r["source_path"].endswith("#meta"))["key"] == "meta"  # the sample's own key
    kept = {r["key"]: r for r in rows if r["status"] == "kept"}
    assert sorted(kept) == ["good1", "good2", "good3"]
    # the duplicates were not merged: each kept sample holds its own first bytes and caption
    shards = sorted((out / "shards").rglob("*.tar"))
    released = {}
    for shard in shards:
        with tarfile.open(shard) as tar:
            for info in tar:
                assert info.isreg() and "/" not in info.name and ".." not in info.name
                released[info.name] = tar.extractfile(info).read()
    assert released["good1.jpg"] == jpeg(300, 300, 1) and released["good1.txt"] == b"caption one"
    assert released["good2.jpg"] == jpeg(300, 300, 8)
    assert sorted(n.split(".")[0] for n in released if n.endswith(".jpg")) == ["good1", "good2", "good3"]
