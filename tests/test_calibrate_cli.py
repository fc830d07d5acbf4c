"""`corpusforge calibrate`: thresholds fitted to the user's own pictures, as a user runs it.

A subprocess on a folder of real photographs (tests/data/real_photos) writes the record,
the thresholds as a build config's section (valid for the build's config) and the HTML
report; the same run again writes the same bytes. User errors are one line and exit 2,
with nothing written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from flows.calibrate import CalibrateConfig, run_calibrate
from tasks.graph.config import NearDedupConfig
from tests.test_cli_errors import run_cli

PHOTOS = Path(__file__).parent / "data" / "real_photos"


def test_calibrate_writes_thresholds_record_and_report_and_the_same_bytes_again(tmp_path, cli):
    out = tmp_path / "cal"
    proc = subprocess.run([*cli, "calibrate", "--source", str(PHOTOS), "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1 and "closest unrelated pair" in proc.stdout
    record = json.loads((out / "calibration.json").read_text())
    t = record["thresholds"]
    assert record["sample"]["pictures"] == len(list(PHOTOS.glob("*.jpg"))) and record["model_id"] == "wfd"
    # wfd verifies band pairs: the calibrated link is the pair rule, zero false links on the sample plus the margin
    assert t["fitted"] and t["pair_removal_above"] >= record["closest_unrelated"] + record["margin"]
    assert t["component_link_above"] < t["pair_removal_above"]
    section = yaml.safe_load((out / "near_dedup.yaml").read_text())["near_dedup"]
    cfg = NearDedupConfig.model_validate(section)  # pastes into a build config as it is
    assert cfg.pair_removal_above == t["pair_removal_above"]
    page = (out / "index.html").read_text()
    assert page.count("<tr class=\"pair\">") >= 12 and "Unrelated pairs closest to the threshold" in page
    assert "greyscale" in page and page.count("data:image/jpeg;base64,") >= 24
    again = tmp_path / "again"
    run_calibrate(CalibrateConfig(source=str(PHOTOS), out=str(again)))
    for name in ("calibration.json", "near_dedup.yaml", "index.html"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_calibrate_user_errors_are_one_line(tmp_path, capsys):
    out = tmp_path / "cal"
    line = run_cli(capsys, ["calibrate", "--source", str(tmp_path / "missing"), "--out", str(out)], out)
    assert "does not exist" in line
    few = tmp_path / "few"
    few.mkdir()
    for p in sorted(PHOTOS.glob("*.jpg"))[:3]:
        shutil.copy(p, few / p.name)
    line = run_cli(capsys, ["calibrate", "--source", str(few), "--out", str(out)], out)
    assert "at least 8 decodable pictures, found 3" in line
    config = tmp_path / "c.yaml"
    config.write_text("near_dedup: {model_id: sscd_disc_mixup}\nfeatures: {models: [{name: sscd_disc_mixup}]}\n")
    line = run_cli(capsys, ["calibrate", "--source", str(PHOTOS), "--out", str(out), "--config", str(config)], out)
    assert "weights" in line, line
    line = run_cli(capsys, ["calibrate", "--source", str(PHOTOS), "--out", str(PHOTOS)])
    assert "--out must differ from --source" in line


def test_calibrate_reads_and_writes_s3(s3):
    """The same pictures from a bucket: the same sample (digest of its images), record and report in the bucket."""
    import hashlib

    import s3fs

    from corpusforge.hashing import canonical_json, sha256_bytes

    fs = s3fs.S3FileSystem(**s3, skip_instance_cache=True)
    fs.mkdir("corpusforge-calibrate")
    photos = sorted(PHOTOS.glob("*.jpg"))
    for p in photos:
        fs.pipe_file(f"corpusforge-calibrate/photos/{p.name}", p.read_bytes())
    record = run_calibrate(CalibrateConfig(source="s3://corpusforge-calibrate/photos",
                                           out="s3://corpusforge-calibrate/cal", storage_options=s3))
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in photos]
    assert record["sample"] == {"pictures": len(photos), "per_transform": 8,
                                "sha256": sha256_bytes(canonical_json(digests).encode())}
    assert json.loads(fs.cat_file("corpusforge-calibrate/cal/calibration.json")) == record
    assert b"Unrelated pairs closest to the threshold" in fs.cat_file("corpusforge-calibrate/cal/index.html")
    assert yaml.safe_load(fs.cat_file("corpusforge-calibrate/cal/near_dedup.yaml"))["near_dedup"]["model_id"] == "wfd"
