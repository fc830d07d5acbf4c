"""Statistics and evaluation inputs on a real S3-compatible server (SeaweedFS on loopback)."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import s3fs
from PIL import Image

from corpusforge.storage import Store
from tasks.stats.config import MetricsConfig, SampleConfig
from tasks.stats.evaluate import (ChunkFeatures, evaluate_features, iter_chunk_images, load_reference,
                                  cut_generated)
from tasks.stats.reference import batch_partials, scan_manifest, stats_path, write_group_stats
from tests.test_generated_listing import in_memory_chunks
from tests.test_stats_reference import IDENTITY, MODEL_ID, write_corpus

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]


def test_reference_stats_and_evaluation_inputs_on_s3(s3, tmp_path):
    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    fs.mkdir("corpusforge-stats")
    store = Store("s3://corpusforge-stats/corpus", s3)
    local = Store(str(tmp_path / "local"))
    _, feats = write_corpus(store)
    write_corpus(local)

    written = {}
    for st in (store, local):
        scan = scan_manifest(st, ("test", "val"), SampleConfig(max_rows=6))
        total = batch_partials(st, MODEL_ID, scan.shards, scan.rule)
        marker = next(iter(total.markers.values()))
        written[st.remote] = write_group_stats(st, "test", MODEL_ID, total.groups["test"], marker, scan, "cv")
    stem = stats_path("test", MODEL_ID)
    for ext in (".npz", ".features.npy"):  # same bytes on S3 as locally
        assert store.read_bytes(stem + ext) == local.read_bytes(stem + ext)
    assert written[True]["manifest_sha256"] == written[False]["manifest_sha256"]

    ref = load_reference(store.path(stem + ".npz"), s3)
    assert ref.provenance["model"] == IDENTITY
    assert ref.features.shape == (written[True]["subsample"]["rows"], 6)

    png = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(png, "PNG")  # images are judged as the build judges them
    fs.pipe("corpusforge-stats/gen/a.png", png.getvalue())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("x.png", png.getvalue()), ("x.json", b"{}"), ("y.png", png.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fs.pipe("corpusforge-stats/gen/t/part.tar", buf.getvalue())
    chunks = list(cut_generated(["s3://corpusforge-stats/gen"], s3))
    assert chunks == in_memory_chunks(["s3://corpusforge-stats/gen"], s3, 1000)  # the stamps from the listing too
    assert [(c.kind, c.uris) for c in chunks] == [("files", ("s3://corpusforge-stats/gen/a.png",)),
                                                  ("tar", ("s3://corpusforge-stats/gen/t/part.tar",))]
    names = [n for c in chunks for n, data, err in iter_chunk_images(c, s3) if err is None and data]
    assert names == ["s3://corpusforge-stats/gen/a.png", "s3://corpusforge-stats/gen/t/part.tar#x.png",
                     "s3://corpusforge-stats/gen/t/part.tar#y.png"]

    gen = np.stack(list(feats.values())[:12])
    result = evaluate_features([ChunkFeatures([str(i) for i in range(12)], gen, {}, IDENTITY)], ref,
                               MetricsConfig(k=2, mmd_subsets=2, mmd_subset_size=4))
    assert result["reference"]["provenance"]["manifest_sha256"] == written[True]["manifest_sha256"]
    assert np.isfinite(result["metrics"]["fd"])
