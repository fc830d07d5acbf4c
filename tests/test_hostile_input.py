"""Fault and hostile-input matrix (issue 14), input side: hostile metadata paths, links and
special files in a source folder, truncated tars at every cut point, and a fuzz test over
the row parser, the path resolver and the tar reader. Everything is caused for real (a FIFO,
a symlink, an HTTP server that counts requests, a cut file) and runs in-process on tiny data.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import tarfile
import threading
import zipfile
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.ingest.files import ingest_path
from corpusforge.storage import Store
from corpusforge.tarshard import Sample, is_safe_key, iter_tar_samples, write_tar
from tasks.ingest.partition import ingest_partition
from tasks.ingest.sources import SourceConfig, normalise_table, cut_partitions
from tasks.shared.inputs import locate
from tasks.shared.validate import ValidationConfig
from tests.loopback import serving
from tests.test_ingest import jpeg

FUZZ = settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ingest_records(src: str, out: Path, cfg: SourceConfig | None = None) -> list[dict]:
    """Plan and ingest every partition in-process, with a watchdog: a blocking read fails the test."""
    store = Store(str(out))
    cfg = cfg or SourceConfig(partition_size=50)
    result: list[dict] = []

    def run() -> None:
        _, parts = cut_partitions(src, store, cfg)
        for p in parts:
            ingest_partition(store, p, cfg, ValidationConfig(min_side=1), n_buckets=2)
            result.extend(store.read_parquet(ingest_path(p.index)).to_pylist())

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "ingest blocked (a FIFO or device was opened?)"
    return result


class CountingHandler(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):  # noqa: N802
        CountingHandler.requests.append(self.path)
        body = jpeg(300, 300, 9)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_secret():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CountingHandler)
    CountingHandler.requests = []
    with serving(server):
        yield f"127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder beside the source with a valid image that must never be read."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.jpg").write_bytes(jpeg(320, 320, 7))
    with zipfile.ZipFile(folder / "secret.zip", "w") as z:
        z.writestr("secret.jpg", (folder / "secret.jpg").read_bytes())
    return folder


@pytest.mark.scenario(8)
def test_hostile_metadata_paths_are_refused_before_any_byte_is_read(tmp_path, outside, http_secret):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.jpg").write_bytes(jpeg(300, 300, 1))
    os.symlink(outside / "secret.jpg", src / "link_out.jpg")
    os.symlink("/dev/zero", src / "zero.jpg")
    os.mkfifo(src / "fifo.jpg")
    secret = outside / "secret.jpg"
    with fsspec.open("memory://secret.jpg", "wb") as f:
        f.write(secret.read_bytes())
    hostile = [
        f"local://{secret}", f"local:{secret}", f"simplecache::file://{secret}", f"file://{secret}",
        f"file:{secret}", str(secret), "../outside/secret.jpg", "sub/../../outside/secret.jpg",
        f"http://{http_secret}/secret.jpg", f"https://{http_secret}/secret.jpg", "memory://secret.jpg",
        f"zip://secret.jpg::file://{outside / 'secret.zip'}", f"blockcache::local://{secret}",
        "s3://bucket/secret.jpg", "gs://bucket/secret.jpg", "/etc/hosts", "/proc/self/environ", "/dev/zero",
        "link_out.jpg", "zero.jpg", "fifo.jpg", f"{src}/../outside/secret.jpg", "a\nb.jpg", "a\\b.jpg", "",
    ]
    rows = [{"key": "good", "path": "good.jpg"}] + [{"key": f"h{i}", "path": p} for i, p in enumerate(hostile)]
    (src / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    got = ingest_records(str(src), tmp_path / "out")

    assert len(got) == len(rows)  # every input row is accounted for, in input order
    assert [r["key"] for r in got] == [r["key"] for r in rows]
    assert (got[0]["status"], got[0]["reason"]) == ("kept", "")
    for row, record in zip(rows[1:], got[1:], strict=True):
        assert record["status"] == "error", row
        assert record["reason"].startswith("unsafe_path: "), (row, record["reason"])
        assert len(record["reason"].split(": ", 2)[-1]) > 5  # says why
        assert record["sha256"] is None
    assert CountingHandler.requests == []  # nothing fetched from the network
    secret_sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    assert secret_sha not in {r["sha256"] for r in got}
    reasons = {r["key"]: r["reason"] for r in got}
    assert "outside the source" in reasons[f"h{hostile.index('link_out.jpg')}"]
    assert "not a regular file" in reasons[f"h{hostile.index('fifo.jpg')}"]
    assert "chained URL" in reasons[f"h{hostile.index(f'simplecache::file://{secret}')}"]


@pytest.mark.scenario(8)
def test_allow_roots_opens_a_root_and_nothing_else(tmp_path, outside):
    src = tmp_path / "src"
    src.mkdir()
    (outside / "elsewhere").mkdir()
    (outside / "elsewhere" / "x.jpg").write_bytes(jpeg(300, 300, 3))
    rows = [{"key": "a", "path": str(outside / "elsewhere" / "x.jpg")},
            {"key": "b", "path": str(outside / "secret.jpg")},
            {"key": "c", "path": f"{outside}/elsewhere/../secret.jpg"}]
    (src / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SourceConfig(allow_roots=[str(outside / "elsewhere")])
    got = {r["key"]: r for r in ingest_records(str(src), tmp_path / "out", cfg)}
    assert got["a"]["status"] == "kept"
    assert got["b"]["reason"].startswith("unsafe_path") and got["c"]["reason"].startswith("unsafe_path")


@pytest.mark.parametrize("base,path,ok", [
    ("s3://bkt/src", "s3://other/k.jpg", True),      # a source on S3 may name S3 objects
    ("s3://bkt/src", "img/k.jpg", True),
    ("s3://bkt/src", "http://127.0.0.1/k.jpg", False),
    ("s3://bkt/src", "/etc/hosts", False),
    ("s3://bkt/src", "s3://bkt/src/../../x", False),
    ("/data/src", "s3://bkt/k.jpg", False),           # a local source may not, unless allow-listed
])
@pytest.mark.scenario(8)
def test_default_roots_follow_the_source_protocol(base, path, ok):
    assert (locate(base, path)[0] is not None) == ok


@pytest.mark.scenario(8)
def test_links_and_special_files_in_a_source_folder_become_error_records(tmp_path, outside):
    src = tmp_path / "imgs"
    (src / "sub").mkdir(parents=True)
    (src / "a.jpg").write_bytes(jpeg(300, 300, 1))
    (src / "sub" / "b.jpg").write_bytes(jpeg(300, 300, 2))
    os.symlink(src / "a.jpg", src / "inner_link.jpg")           # inside: allowed, read through
    os.symlink(outside / "secret.jpg", src / "out_link.jpg")    # outside: error
    os.symlink(outside, src / "out_dir")                         # a folder link: not walked, one error
    os.symlink("/dev/zero", src / "dev.jpg")
    os.mkfifo(src / "pipe.jpg")
    os.mkfifo(src / "a.txt")                                     # a FIFO sidecar is never read as a caption
    os.symlink(outside / "secret.jpg", src / "sub" / "b.json")  # nor is a linked one

    got = {r["source_path"].rsplit("/imgs/", 1)[-1]: r for r in ingest_records(str(src), tmp_path / "out")}

    assert set(got) == {"a.jpg", "a.txt", "sub/b.jpg", "sub/b.json", "inner_link.jpg", "out_link.jpg",
                        "out_dir", "dev.jpg", "pipe.jpg"}
    assert {k for k, r in got.items() if r["status"] == "kept"} == {"a.jpg", "sub/b.jpg", "inner_link.jpg"}
    assert got["a.jpg"]["caption"] is None
    for name in ("out_link.jpg", "out_dir"):
        assert "outside the source" in got[name]["reason"], got[name]
    for name in ("dev.jpg", "pipe.jpg", "a.txt"):
        assert got[name]["status"] == "error" and got[name]["reason"], got[name]
    assert "not a regular file" in got["pipe.jpg"]["reason"]


# ---- truncated tars --------------------------------------------------------------------------

def _samples(sizes: list[list[int]]) -> list[Sample]:
    exts = ["jpg", "txt", "json"]
    return [Sample(f"s{i}", {exts[j]: bytes([i + j + 1]) * n for j, n in enumerate(member_sizes)})
            for i, member_sizes in enumerate(sizes)]


@pytest.mark.scenario(4)
@settings(max_examples=400, deadline=None)
@given(sizes=st.lists(st.lists(st.integers(0, 1300), min_size=1, max_size=3), min_size=1, max_size=4),
       data=st.data())
def test_truncated_tar_keeps_the_prefix_and_reports_the_cut(sizes, data):
    samples = _samples(sizes)
    buf = io.BytesIO()
    written = write_tar(buf, samples)
    whole = buf.getvalue()
    index = written.index.to_pylist()
    ends = {}  # sample key -> end of its last member's data; starts: first header position
    starts = {}
    for m in index:
        ends[m["key"]] = m["offset"] + m["size"]
        starts.setdefault(m["key"], m["offset"] - 512)
    members_end = -(-max(ends.values()) // 512) * 512
    cut = data.draw(st.integers(0, len(whole)), label="cut")
    got = list(iter_tar_samples(io.BytesIO(whole[:cut])))

    if cut >= members_end + 512:  # the end-of-archive block is whole: nothing is missing
        assert [(s.key, s.members, s.error) for s in got] == [(s.key, s.members, None) for s in samples]
        return
    *kept, last = got
    assert last.error is not None and "truncated" in last.error.reason
    assert f"after {len(kept)} complete samples" in last.error.reason
    assert [(s.key, s.members) for s in kept] == [(s.key, s.members) for s in samples[:len(kept)]]
    assert all(s.error is None for s in kept)
    # every sample followed by a complete header of the next one is kept; none that was cut is
    finished = sum(1 for s in samples[1:] if starts[s.key] + 512 <= cut)
    assert finished <= len(kept) <= sum(1 for s in samples if ends[s.key] <= cut)


@pytest.mark.scenario(4)
@pytest.mark.parametrize("where", ["mid_header", "mid_member", "between_members", "between_samples"])
def test_truncated_tar_at_ingest_keeps_records_before_the_cut(tmp_path, where):
    images = [jpeg(300, 300, i) for i in range(3)]
    buf = io.BytesIO()
    written = write_tar(buf, [Sample(f"k{i}", {"jpg": im, "txt": f"caption {i}".encode()})
                              for i, im in enumerate(images)])
    index = written.index.to_pylist()
    k1_txt = next(m for m in index if (m["key"], m["ext"]) == ("k1", "txt"))
    k2_jpg = next(m for m in index if (m["key"], m["ext"]) == ("k2", "jpg"))
    cut = {"mid_header": k2_jpg["offset"] - 300, "mid_member": k2_jpg["offset"] + 100,
           "between_members": k1_txt["offset"] - 512, "between_samples": k2_jpg["offset"] - 512}[where]
    src = tmp_path / "tars"
    src.mkdir()
    (src / "000.tar").write_bytes(buf.getvalue()[:cut])
    got = ingest_records(str(src), tmp_path / "out")
    kept = [r["key"] for r in got if r["status"] == "kept"]
    errors = [r for r in got if r["status"] == "error"]
    # the sample in progress when the stream ends may miss members: it is the error, not kept
    assert kept == (["k0", "k1"] if where == "mid_member" else ["k0"])
    assert len(errors) == 1 and errors[0]["reason"].startswith("read_error: corrupt or truncated tar after ")
    assert f"after {len(kept)} complete samples" in errors[0]["reason"]


# ---- fuzz: row parser, path resolver, tar reader -----------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))


@pytest.mark.scenario('fuzz')
@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.dictionaries(st.sampled_from(["key", "caption", "license", "extra", "q", "x y"]),
                                     scalars, max_size=5), min_size=1, max_size=4),
       paths=st.lists(st.text(max_size=10), min_size=4, max_size=4))
def test_fuzz_metadata_row_parser(rows, paths):
    rows = [{**r, "path": paths[i]} for i, r in enumerate(rows)]
    table = pa.Table.from_pylist([{k: None if v is None else str(v) for k, v in r.items()} for r in rows])
    out = normalise_table(table, {}).to_pylist()
    assert len(out) == len(rows)
    for record in out:
        assert all(v is None or isinstance(v, str) for v in record.values())
        if record["extra"] is not None:
            assert isinstance(json.loads(record["extra"]), dict)


path_parts = st.sampled_from(["a", "b.jpg", "..", ".", "", "/", "//", "::", "://", "file:", "local:", "s3:",
                              "http:", "memory:", "zip:", "simplecache::", "~", "\\", "\x00", "\n", "%2e%2e", "é"])


@pytest.mark.scenario('fuzz')
@FUZZ
@given(path=st.one_of(st.text(max_size=40), st.lists(path_parts, max_size=8).map("".join)),
       remote=st.booleans())
def test_fuzz_path_resolver(path, remote):
    base = "s3://bkt/src" if remote else "/data/src"
    location, why = locate(base, path)
    if location is None:
        assert why
        return
    assert "::" not in location and not any(ord(c) < 0x20 for c in location)
    if remote:
        assert location.startswith("s3://") and ".." not in location.split("/")
    else:
        assert location.startswith("/data/src/") and os.path.normpath(location) == location


def _tar_bytes() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in [("a.jpg", b"x" * 600), ("a.txt", b"cap"), ("../b.jpg", b"y"), ("c.json", b"{}")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("d.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    return buf.getvalue()


TAR = _tar_bytes()


@pytest.mark.scenario('fuzz')
@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, len(TAR) - 1), st.integers(0, 255)), max_size=6),
       cut=st.integers(0, len(TAR)))
def test_fuzz_tar_reader(edits, cut):
    data = bytearray(TAR)
    for position, value in edits:
        data[position] = value
    got = list(iter_tar_samples(io.BytesIO(bytes(data[:cut]))))  # never raises, never hangs
    for sample in got:
        if sample.error is None:
            assert is_safe_key(sample.key.rsplit("/", 1)[-1]) or sample.key.rsplit("/", 1)[-1]
            assert ".." not in sample.key.split("/") and not sample.key.startswith("/")
    assert sum(s.error is not None and "truncated" in s.error.reason for s in got) <= 1


# ---- malformed sidecars -------------------------------------------------------------------------

@pytest.mark.scenario(13)
def test_malformed_json_sidecar_is_a_warning_with_a_reason(tmp_path):
    tars, folder = tmp_path / "tars", tmp_path / "imgs"
    tars.mkdir()
    folder.mkdir()
    sidecars = {"good": b'{"license": "cc-by"}', "broken": b'{"license": "cc-by"', "list": b"[1, 2]",
                "binary": b"\xff\xfe"}
    buf = io.BytesIO()
    write_tar(buf, [Sample(k, {"jpg": jpeg(300, 300, i), "json": j}) for i, (k, j) in enumerate(sidecars.items())])
    (tars / "000.tar").write_bytes(buf.getvalue())
    for i, (k, j) in enumerate(sidecars.items()):
        (folder / f"{k}.jpg").write_bytes(jpeg(300, 300, i))
        (folder / f"{k}.json").write_bytes(j)
    for src in (tars, folder):
        got = {r["key"].removeprefix("k") if src == tars else r["source_path"].rsplit("/", 1)[-1][:-4]: r
               for r in ingest_records(str(src), tmp_path / f"out-{src.name}")}
        assert {k: r["status"] for k, r in got.items()} == dict.fromkeys(sidecars, "kept")  # the image is fine
        assert got["good"]["warning"] is None and got["good"]["license"] == "cc-by"
        for k in ("broken", "list", "binary"):
            assert got[k]["warning"].startswith("bad_sidecar: "), (src.name, k, got[k]["warning"])
            assert got[k]["license"] is None


# ---- error-rate guard -----------------------------------------------------------------------------

@pytest.mark.scenario(13)
def test_feature_shard_past_the_error_rate_guard_fails_and_is_not_marked_done(tmp_path):
    from corpusforge.layout import feature_vectors
    from tasks.shared.features.config import FeaturesConfig, ModelSpec, RuntimeConfig
    from tasks.shared.features.extract import extract_shard
    from tests.test_extract import _write_staging

    store = Store(str(tmp_path / "corpus"))
    _write_staging(store, "000000", list(range(4)), corrupt={0, 1, 2})
    cfg = FeaturesConfig(models=[ModelSpec(name="wfd")], runtime=RuntimeConfig(batch_size=4))
    with pytest.raises(RuntimeError, match=r"3 of 4 images failed .*max_error_share=0.5.*not marked done"):
        extract_shard(store, "000000", cfg)
    assert not store.exists(feature_vectors("wfd", "000000"))
    assert not any(str(p).endswith(".json") for p in (tmp_path / "corpus").rglob("_markers/features/**/*"))
    with pytest.raises(RuntimeError):  # a rerun is not skipped: it fails again
        extract_shard(store, "000000", cfg)
    done = extract_shard(store, "000000", cfg.model_copy(update={"max_error_share": 0.75}))
    assert done.info["models"]["wfd"]["errors"] == 3


@pytest.mark.scenario(8)
def test_parallel_folder_listing_equals_a_sequential_walk(tmp_path, outside):
    """Top-level sub-folders are listed in parallel into spill parts; the result is
    os.walk's, links not followed, a link or special file never taken for a regular file."""
    from fsspec.implementations.local import LocalFileSystem

    from tasks.ingest.files import LISTING_SPILL_DIR
    from tasks.ingest.sources import _spill_table
    from tasks.shared.inputs import walk_local
    from tasks.shared.listing import spill_listing

    src = tmp_path / "imgs"
    for folder in ("", "a", "a/b", "c", "c/d/e", "f"):
        (src / folder).mkdir(parents=True, exist_ok=True)
        (src / folder / "x.jpg").write_bytes(b"x")
        (src / folder / "x.txt").write_bytes(b"t")
    os.symlink(outside, src / "a" / "dir_link")
    os.symlink(src / "c" / "x.jpg", src / "link.jpg")
    os.mkfifo(src / "c" / "d" / "pipe.txt")
    want = []
    for folder, dirs, files in os.walk(src, followlinks=False):
        want += [os.path.join(folder, n) for n in dirs if os.path.islink(os.path.join(folder, n))]
        want += [os.path.join(folder, n) for n in files]
    walked = sorted(walk_local(str(src)))
    assert [p for p, _ in walked] == sorted(want) and len(want) == 15
    assert {os.path.relpath(p, src) for p, regular in walked if not regular} == {"a/dir_link", "link.jpg",
                                                                                 "c/d/pipe.txt"}
    store = Store(str(tmp_path / "out"))
    parts = spill_listing(store, LISTING_SPILL_DIR, LocalFileSystem(), str(src), False,
                          lambda e: _spill_table(e, str(src)))
    spilled = [r for part in parts for r in store.read_parquet(part).to_pylist()]
    assert sorted(r["path"] for r in spilled) == sorted(want)
    assert {os.path.relpath(r["path"], src) for r in spilled if r["sidecar_ext"] is None and
            r["path"].endswith(".txt")} == {"c/d/pipe.txt"}
