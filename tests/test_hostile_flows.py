"""Every flow refuses what the build refuses (issue 29): the hostile-input matrix run against
every flow that reads a user's files, through the CLI as a subprocess.

One set of hostile inputs — a table whose paths take every refused form, a folder with a
symlink out, a link to a device, a FIFO and a decompression bomb, and a tar with every
refused member kind — is given to ``build``, ``contamination`` (evaluation sets),
``evaluate`` and ``qualify-prompts`` (generated images). The build's own per-record
reasons, read from its manifest, are the reference: every other flow must give each of
those records the same reason, never read the sentinel file outside the source (its bytes
and its SHA-256 appear in no output) and never send a request to the loopback HTTP server
the hostile URLs name. ``extract-features`` and ``near-dedup`` read only a built corpus's
own staging files by their index offsets (no path from data is opened): no case applies.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import posixpath
import subprocess
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from tests.cli_s3 import corpusforge
from tests.loopback import serving
from tests.operate import clean_env
from tests.test_ingest import jpeg

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.scenario(8), pytest.mark.timeout(900)]

THREADS = {"n_workers": 1, "threads_per_worker": 2, "processes": False}  # no worker process to start
DINO = {"name": "dinov2", "arch": "vit_small_patch14_dinov2", "random_init": True, "image_size": 28}
TAR_MEMBERS = ("up", "abs", "sym", "hard", "dev", "fifo")  # keys of the refused tar members


class Counting(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):  # noqa: N802
        Counting.requests.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _png(size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size).save(buf, "PNG")
    return buf.getvalue()


def _member(tar: tarfile.TarFile, name: str, kind: bytes, data: bytes = b"", link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data)
    tar.addfile(info, io.BytesIO(data) if data else None)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Any:
    """The hostile inputs, a sentinel outside them, and a loopback HTTP server counting requests."""
    root = tmp_path_factory.mktemp("hostile")
    outside = root / "outside"
    outside.mkdir()
    secret = outside / "secret.jpg"
    secret.write_bytes(jpeg(320, 320, 777))
    with zipfile.ZipFile(outside / "secret.zip", "w") as z:
        z.write(secret, "secret.jpg")
    bomb = _png((12000, 12000))  # 144M pixels declared: over the validator's 100M, under Pillow's own error
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    Counting.requests = []
    with serving(server):
        host = f"127.0.0.1:{server.server_address[1]}"

        def fill(folder: Path, ext: str) -> None:
            """good images, a symlink out, a link to a device, a FIFO, a bomb, a linked folder."""
            folder.mkdir(parents=True)
            for i in range(2):
                (folder / f"good{i}.{ext}").write_bytes(jpeg(300, 300, i) if ext == "jpg" else _png((300, 300)))
            os.symlink(secret, folder / f"link_out.{ext}")
            os.symlink("/dev/zero", folder / f"zero.{ext}")
            os.mkfifo(folder / f"fifo.{ext}")
            (folder / f"bomb.{ext}").write_bytes(bomb)
            os.symlink(outside, folder / "dir_out")

        table = root / "table"
        fill(table, "jpg")
        paths = {"file_url": f"file://{secret}", "local_url": f"local://{secret}",
                 "simplecache": f"simplecache::file://{secret}", "zip": f"zip://secret.jpg::file://{outside}/secret.zip",
                 "http": f"http://{host}/latest/meta-data/", "https": f"https://{host}/secret.jpg",
                 "dotdot": "../outside/secret.jpg", "absolute": str(secret), "nul": "good0\x00.jpg",
                 "symlink_out": "link_out.jpg", "device": "zero.jpg", "fifo": "fifo.jpg", "bomb": "bomb.jpg",
                 "good": "good0.jpg"}
        rows = [{"key": k, "id": k, "path": p, "license": "CC-BY-4.0"} for k, p in paths.items()]
        (table / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

        folder = root / "folder"
        fill(folder, "jpg")
        generated = root / "generated"
        fill(generated / "m1" / "p1", "png")
        tars = root / "tars"
        tars.mkdir()
        with tarfile.open(tars / "000.tar", "w", format=tarfile.GNU_FORMAT) as tar:
            _member(tar, "good.jpg", tarfile.REGTYPE, jpeg(300, 300, 5))
            _member(tar, "../up.jpg", tarfile.REGTYPE, secret.read_bytes())
            _member(tar, f"{outside}/abs.jpg", tarfile.REGTYPE, secret.read_bytes())
            _member(tar, "sym.jpg", tarfile.SYMTYPE, link=str(secret))
            _member(tar, "hard.jpg", tarfile.LNKTYPE, link=str(secret))
            _member(tar, "dev.jpg", tarfile.CHRTYPE)
            _member(tar, "fifo.jpg", tarfile.FIFOTYPE)
            _member(tar, "bomb.png", tarfile.REGTYPE, bomb)
        yield SimpleNamespace(root=root, secret=secret, table=table, folder=folder, tars=tars, generated=generated,
                              requests=Counting.requests)


def run(command: list[str], config: dict[str, Any], folder: Path, prefect_server: str) -> dict[str, Any]:
    """``corpusforge COMMAND --config c.yaml`` in a subprocess; exit 0 and its JSON result."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{command[0]}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = clean_env(PREFECT_API_URL=prefect_server, OMP_NUM_THREADS="1")
    proc = subprocess.run([corpusforge(), *command, "--config", str(path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]  # hostile records never fail the run
    return json.JSONDecoder().raw_decode(proc.stdout)[0]  # the build prints its timings after


def _tail(name: str) -> str:
    """A record's name in the source: below its folder, or a tar member's key."""
    for mark in ("#", "/folder/", "/table/", "/generated/m1/p1/", "/000/"):
        if mark in name:
            name = name.rsplit(mark, 1)[1]
    return name.rsplit(".", 1)[0] if "#" not in name else name


def manifest_reasons(out: Path, form: str) -> dict[str, tuple[str, str]]:
    """{record: (status, reason)} from a build's manifest, named by key (a table), file stem
    (a folder) or member key (a tar)."""
    rows = [r for p in sorted((out / "manifest").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    named = {}
    for r in rows:
        name = {"table": r["key"], "folder": posixpath.basename(r["source_path"]),
                "tars": r["source_path"].rsplit("#", 1)[-1].rsplit("/", 1)[-1]}[form]
        named[name.rsplit(".", 1)[0] if form != "table" else name] = (r["status"], r["reason"])
    return named


def assert_nothing_outside_read(hostile: Any, out: Path) -> None:
    secret = hostile.secret.read_bytes()
    digest = hashlib.sha256(secret).hexdigest()
    for path in out.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert secret not in data and digest.encode() not in data, path
    assert hostile.requests == []


@pytest.fixture(scope="module")
def built(hostile, prefect_server) -> dict[str, dict[str, tuple[str, str]]]:
    """The build's reasons, the reference: the CLI over the table, the folder and the tars."""
    reasons = {}
    for form in ("table", "folder", "tars"):
        out = hostile.root / f"build-{form}"
        run(["build", "--source", str(getattr(hostile, form)), "--out", str(out)],
            {"licenses": None, "dask": THREADS, "reference_stats": None}, hostile.root / "configs", prefect_server)
        assert_nothing_outside_read(hostile, out)
        reasons[form] = manifest_reasons(out, form)
    return reasons


def test_the_build_refuses_every_hostile_form(built):
    table = dict(built["table"])
    assert table.pop("good") == ("kept", "")
    for key, (status, reason) in table.items():
        expected = "decompression_bomb" if key == "bomb" else "unsafe_path"
        assert (status, reason.split(":")[0]) == ("error", expected), key
    assert "symlink to a location outside the source" in table["symlink_out"][1]
    assert "not a regular file" in table["fifo"][1]
    assert "chained URL" in table["simplecache"][1] and "chained URL" in table["zip"][1]
    folder = built["folder"]
    assert {k for k, (s, _) in folder.items() if s == "kept"} == {"good0", "good1"}
    assert folder["fifo"][1].endswith("not a regular file (folder, FIFO, device or socket)")
    tars = dict(built["tars"])
    assert tars.pop("good") == ("kept", "")
    assert {k: s for k, (s, _) in tars.items()} == dict.fromkeys([*TAR_MEMBERS, "bomb"], "error")


def contamination_reasons(out: Path) -> dict[str, str]:
    rows = [r for p in sorted((out / "eval" / "items").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    return {_tail(r["item_id"]).rsplit("/", 1)[-1]: r["image_error"] or "" for r in rows}


@pytest.mark.parametrize("form", ["table", "folder", "tars"])
def test_contamination_refuses_what_the_build_refuses(hostile, built, built_sample, prefect_server, form):
    source = hostile.table / "metadata.jsonl" if form == "table" else getattr(hostile, form)
    out = hostile.root / f"contamination-{form}"
    run(["contamination"], {"corpus": str(built_sample[0]), "out": str(out), "judge": None, "dask": THREADS,
                            "eval_set": {"source": str(source), "chunk_size": 8}},
        hostile.root / "configs", prefect_server)
    assert_nothing_outside_read(hostile, out)
    got = contamination_reasons(out)
    reference = {k: r for k, (_, r) in built[form].items() if k in got}
    assert len(reference) >= {"table": 14, "folder": 6, "tars": 8}[form]
    assert {k: got[k] for k in reference} == reference


def test_evaluate_refuses_what_the_build_refuses(hostile, built, built_sample, prefect_server):
    from tasks.stats.reference import stats_path

    out = hostile.root / "evaluate"
    reference = built_sample[0] / (stats_path("test", "dinov2_vits14_gpic_eval_s28") + ".npz")
    result = run(["evaluate"], {"generated": [str(hostile.folder), str(hostile.tars)], "reference": str(reference),
                                "out": str(out), "model": DINO, "runtime": {"torch_threads": 1}, "dask": THREADS,
                                "metrics": {"k": 2, "mmd_subsets": 2, "mmd_subset_size": 2}},
                 hostile.root / "configs", prefect_server)
    assert_nothing_outside_read(hostile, out)
    errors = json.loads((out / "metrics.json").read_text())["generated"]["error_examples"]
    got = {form: {_tail(n).rsplit("/", 1)[-1]: r for n, r in errors.items() if ("#" in n) == (form == "tars")}
           for form in ("folder", "tars")}
    assert result["generated"]["embedded"] == 3  # good0, good1, the tar's good
    assert sorted(got["folder"]) == ["bomb", "fifo", "link_out", "zero"]
    assert sorted(got["tars"]) == sorted([*TAR_MEMBERS, "bomb"])
    assert got == {form: {k: built[form][k][1] for k in got[form]} for form in got}


def test_qualify_prompts_refuses_what_the_build_refuses(hostile, built, prefect_server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt_id": "p1", "text": "a photo", "cohort": "a"}) + "\n")
    out = hostile.root / "qualify"
    run(["qualify-prompts"], {"prompts": {"path": str(prompts)}, "out": str(out), "density": None,
                              "variance": {"generated": str(hostile.generated)}, "dask": THREADS},
        hostile.root / "configs", prefect_server)
    assert_nothing_outside_read(hostile, out)
    rows = [r for p in sorted((out / "work" / "prompts" / "generated").rglob("*.parquet"))
            for r in pq.read_table(p).to_pylist()]
    images = {name.rsplit(".", 1)[0]: (error or "").replace("'m1/p1/", "'").replace(".png'", ".jpg'")
              for r in rows for name, _, error in json.loads(r["images"])}
    assert set(images) == {"good0", "good1", "link_out", "zero", "fifo", "bomb"}
    assert images == {k: r for k, (_, r) in built["folder"].items() if k in images}
