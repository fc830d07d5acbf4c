"""Degenerate corpora (issue 14, scenario 10): each gives a complete output — manifest,
receipt and report — or one clear error, never a crash in a plot or a report. Every input
record appears in the manifest exactly once. Tiny inputs, one in-process Dask worker."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from PIL import Image

from flows.build_corpus import BuildConfig, run_build
from tasks.release.versions import ReleaseRefused

pytestmark = [pytest.mark.scenario(10), pytest.mark.timeout(600)]


def png(seed: int, side: int = 300) -> bytes:
    arr = (np.random.default_rng(seed).random((side, side, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def build(source: Path, out: Path, **overrides) -> dict:
    data = {"source": str(source), "out": str(out), "input": {"partition_size": 8},
            "staging": {"shard_size": 8}, "splits": {"shard_size": 8, "val": 0.1, "test": 0.1},
            "dask": {"n_workers": 1, "processes": False},
            "licenses": None}  # bare images carry no licence; these tests are about the images
    data.update(overrides)
    return run_build(BuildConfig.model_validate(data))


def manifest(out: Path) -> list[dict]:
    return ds.dataset(out / "manifest", format="parquet").to_table().to_pylist()


def assert_complete(out: Path, n_inputs: int) -> list[dict]:
    rows = manifest(out)
    assert len(rows) == n_inputs
    for name in ("receipt.json", "report.html", "report.md"):
        assert (out / name).stat().st_size > 0, name
    return rows


@pytest.mark.slow
def test_one_image(tmp_path, prefect_server):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.png").write_bytes(png(1))
    build(src, tmp_path / "out")
    rows = assert_complete(tmp_path / "out", 1)
    assert rows[0]["status"] == "kept"


@pytest.mark.parametrize("name,content,error", [
    ("metadata.parquet", pq, "no input records"),         # a valid table with zero rows
    ("metadata.jsonl", b"", "no input records"),
    ("metadata.csv", b"path,caption\n", "no input records"),
    ("metadata.csv", b"", "metadata.csv: not a readable table"),
    ("metadata.parquet", b"", "metadata.parquet: not a readable table"),
    (None, None, "no input records"),                       # an empty folder
])
def test_empty_input_is_one_clear_error_and_writes_nothing(tmp_path, name, content, error):
    """An empty source is one clear error, raised while planning, before any output exists.
    (Planning runs in-process here: it is the first stage of the flow.)"""
    from corpusforge.storage import Store
    from tasks.ingest.sources import SourceConfig, cut_partitions

    src = tmp_path / "src"
    src.mkdir()
    if content is pq:
        pq.write_table(pa.table({"path": pa.array([], pa.string())}), src / name)
    elif name:
        (src / name).write_bytes(content)
    with pytest.raises(ValueError, match=error):
        cut_partitions(str(src), Store(str(tmp_path / "out")), SourceConfig())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))


@pytest.mark.slow
def test_empty_input_fails_the_build_with_that_error(tmp_path, prefect_server):
    (tmp_path / "src").mkdir()
    with pytest.raises(ValueError, match="no input records"):
        build(tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out" / "manifest").exists()


@pytest.mark.slow
def test_no_valid_image(tmp_path, prefect_server):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(b"")
    (src / "b.png").write_bytes(b"not an image")
    (src / "c.png").write_bytes(png(3)[:200])
    with pytest.raises(ReleaseRefused, match="the release would be empty"):  # complete, but not published
        build(src, tmp_path / "out")
    rows = assert_complete(tmp_path / "out", 3)
    assert {r["status"] for r in rows} == {"error"}
    assert not (tmp_path / "out" / "current.json").exists()


@pytest.mark.slow
def test_all_images_identical(tmp_path, prefect_server):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.png").write_bytes(png(1))
    build(src, tmp_path / "out")
    rows = assert_complete(tmp_path / "out", 5)
    assert sorted(r["status"] for r in rows) == ["exact_duplicate"] * 4 + ["kept"]


@pytest.mark.slow
def test_no_near_duplicate_and_one_split_empty(tmp_path, prefect_server):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"{i}.png").write_bytes(png(10 + i))
    build(src, tmp_path / "out", splits={"shard_size": 8, "val": 0.0, "test": 0.2})
    rows = assert_complete(tmp_path / "out", 6)
    assert {r["status"] for r in rows} == {"kept"}
    assert "val" not in {r["split"] for r in rows}
