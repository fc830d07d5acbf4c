"""``corpusforge plan`` and ``corpusforge diff`` as users run them.

The plan's agreement with what each run then does, and the diff's agreement with an
independent pyarrow comparison, are checked on every case of ``test_rerun_matrix.py``;
here: the reasons a unit recomputes, that plan writes nothing, the ``plan_only``
flow parameter's artifact, and that the account of changes is the same whether a build
wrote it in place, a build into a new root wrote it with ``--previous``, or ``diff``
wrote it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpusforge.contract import COMPUTED, MAYBE, SKIPPED, Marker, explain, unit_fingerprint
from flows.build_corpus import BuildConfig, build, build_corpus
from tests.test_rerun_matrix import tree_with_markers


def test_explain_names_what_changed():
    """The reason names the code version, each config field by its path, or the inputs."""
    config = [{"min_side": 64, "max_side": 4096}, 8]
    old = unit_fingerprint("ingest", "v1", config, ["a"])
    marker = Marker(str(old), {}, "", {}, old.parts)
    assert explain(marker, unit_fingerprint("ingest", "v1", config, ["a"])) == (SKIPPED, "unchanged")
    assert explain(marker, unit_fingerprint("ingest", "v1", [{"min_side": 300, "max_side": 4096}, 8], ["a"])) == (
        COMPUTED, "config [0].min_side")
    assert explain(marker, unit_fingerprint("ingest", "v2", config, ["a"])) == (COMPUTED, "code version v1 → v2")
    assert explain(marker, unit_fingerprint("ingest", "v1", config, ["b"])) == (COMPUTED, "input digest changed")
    # inputs written by upstream units during the run: only code and config are certain
    assert explain(marker, unit_fingerprint("ingest", "v1", config, ["?"]), inputs_known=False)[0] == MAYBE
    assert explain(marker, unit_fingerprint("ingest", "v1", [{"min_side": 1, "max_side": 1}, 9], ["?"]),
                   inputs_known=False) == (COMPUTED, "config [0].max_side, [0].min_side, [1]")
    assert explain(None, old) == (COMPUTED, "no completed output")
    assert explain(Marker("x", {}, "", {}), old)[0] == COMPUTED  # a marker from before keys were recorded


def test_plan_of_an_unchanged_build_skips_everything_and_a_changed_setting_names_itself(built_sample, sample_corpus,
                                                                                        tmp_path, capsys):
    """In-process (the fast tier's plan test): over the session's built sample corpus, the
    plan of the same settings skips every unit and writes nothing; with another validation
    setting, ingest recomputes for that setting and what reads it may."""
    from flows.cli import main
    from tests.built_sample import config

    out = built_sample[0]
    before = tree_with_markers(out)
    settings = config(sample_corpus, out).model_dump(mode="json", exclude={"source", "out"})
    plans = {}
    for name, validation in (("same", settings["validation"]), ("other", {**settings["validation"], "min_side": 100})):
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps({**settings, "validation": validation}))
        capsys.readouterr()
        assert main(["plan", "--source", str(sample_corpus), "--out", str(out), "--config", str(path), "--json"]) == 0
        plans[name] = {s["stage"]: s for s in json.loads(capsys.readouterr().out)["stages"]}
    assert tree_with_markers(out) == before
    assert plans["same"] and all(s["counts"]["recompute"] == 0 and s["counts"]["delete"] == 0
                                 for s in plans["same"].values()), plans["same"]
    assert plans["same"]["ingest"]["counts"]["skip"] == len(plans["same"]["ingest"]["units"]) >= 4
    ingest, dedup = plans["other"]["ingest"], plans["other"]["exact_dedup"]
    assert {(u["action"], u["reason"]) for u in ingest["units"]} == {("recompute", "config validation.min_side")}
    assert dedup["counts"]["recompute if upstream output changes"] == len(dedup["units"]) > 0


def test_diff_counts_and_lists_what_changed_between_two_versions(built_sample, tmp_path, capsys):
    """In-process (the fast tier's diff test): a copy of the built sample corpus whose manifest
    lost one record and filtered another: ``diff`` finds exactly those two."""
    from flows.cli import main

    old = built_sample[0]
    new = tmp_path / "new"
    shutil.copytree(old, new)
    parts = sorted((new / "manifest").rglob("*.parquet"))
    rows = pq.read_table(parts[0]).to_pylist()
    kept = [r for r in rows if r["status"] == "kept"]
    removed, filtered = kept[0]["key"], kept[1]["key"]
    edited = [{**r, "status": "filtered", "reason": "planted"} if r["key"] == filtered else r
              for r in rows if r["key"] != removed]
    pq.write_table(pa.Table.from_pylist(edited, schema=pq.read_schema(parts[0])), parts[0])
    assert main(["diff", str(old), str(new), "--out", str(tmp_path / "diff")]) == 0
    summary = json.loads(capsys.readouterr().out.split("\n\nWritten")[0])
    assert summary["records"] == {"added": 0, "removed": 1, "changed": 1}
    assert summary["changed_fields"]["status"] == summary["changed_fields"]["reason"] == 1
    changes = {r["key"]: r for r in pq.read_table(tmp_path / "diff" / "changes.parquet").to_pylist()}
    assert set(changes) == {removed, filtered}
    assert changes[removed]["change"] == "removed"
    assert changes[filtered]["change"] == "changed"
    assert changes[filtered]["fields"].split(",")[:2] == ["status", "reason"]
    assert "1 removed, 1 changed" in (tmp_path / "diff" / "CHANGES.md").read_text()


def _cli(cli: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cli, *args], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)


SMALL = {"input": {"partition_size": 40}, "staging": {"shard_size": 30},
         "splits": {"shard_size": 20, "val": 0.1, "test": 0.15}, "near_dedup": None}


def small_config(source: Path, out: Path, **changes) -> BuildConfig:
    return BuildConfig.model_validate({"source": str(source), "out": str(out), **SMALL, **changes})


def config_file(tmp_path: Path) -> str:
    """The settings of :func:`small_config` as a CLI config file (JSON is YAML)."""
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(SMALL))
    return str(path)


@pytest.fixture(scope="module")
def versions(tmp_path_factory, sample_corpus, prefect_server) -> dict[str, Path]:
    """v1 built, then one caption edited, one row deleted and one appended, rebuilt in place."""
    root = tmp_path_factory.mktemp("versions")
    source = root / "source"
    shutil.copytree(sample_corpus, source)
    rows = pq.read_table(source / "metadata.parquet").to_pylist()
    pq.write_table(pa.Table.from_pylist(rows[:-1]), source / "metadata.parquet")
    out = root / "out"
    build(small_config(source, out))
    shutil.copytree(out, root / "v1")
    edited = next(r for r in rows[30:] if r.get("caption"))
    edited["caption"] += " (edited)"
    pq.write_table(pa.Table.from_pylist([r for r in rows if r is not rows[5]]), source / "metadata.parquet")
    return {"source": source, "out": out, "v1": root / "v1", "root": root, "edited": edited["key"],
            "deleted": rows[5]["key"], "appended": rows[-1]["key"]}


def test_plan_writes_nothing_and_predicts_the_rerun(versions, tmp_path, cli):
    out, config = versions["out"], config_file(tmp_path)
    before = tree_with_markers(out)
    result = _cli(cli, "plan", "--source", str(versions["source"]), "--out", str(out), "--config", config, "--json")
    assert result.returncode == 0, result.stderr
    assert tree_with_markers(out) == before
    plan = {s["stage"]: s for s in json.loads(result.stdout)["stages"]}
    # the deleted row shifts every later partition's rows: all of them change
    assert plan["ingest"]["counts"]["recompute"] == len(plan["ingest"]["units"]) >= 4
    assert all(u["reason"] == "input digest changed" for u in plan["ingest"]["units"] if u["action"] == "recompute")
    assert plan["ingest"]["estimate"]["basis"] == "the last run log's stage time per unit"
    text = _cli(cli, "plan", "--source", str(versions["source"]), "--out", str(out), "--config", config)
    assert text.returncode == 0 and "recompute if upstream output changes" in text.stdout
    assert tree_with_markers(out) == before


def test_plan_names_regrouped_partitions_not_a_config_change(versions, tmp_path):
    """Fewer rows, fewer input partitions: exact dedup's groups and buckets are cut anew. No
    setting changed, so no reason may say "config [1]" (the partition range in a unit's key)."""
    from flows.build_corpus import BUILD_MODULES
    from flows.plan import plan_build

    source = tmp_path / "source"
    shutil.copytree(versions["source"], source)
    rows = pq.read_table(source / "metadata.parquet").to_pylist()
    pq.write_table(pa.Table.from_pylist(rows[:100]), source / "metadata.parquet")
    reasons = {u.reason for s in plan_build(small_config(source, versions["out"]), BUILD_MODULES) for u in s.units}
    assert not [r for r in reasons if "config" in r], reasons
    assert "the input's partitions were regrouped (partitions added or removed)" in reasons


def test_plan_of_a_new_root_creates_nothing(versions, tmp_path, cli):
    out = tmp_path / "new" / "corpus"
    result = _cli(cli, "plan", "--source", str(versions["source"]), "--out", str(out),
                  "--config", config_file(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "new").exists()
    stages = json.loads(result.stdout)["stages"]
    assert stages[0]["counts"]["recompute"] == len(stages[0]["units"]) > 0
    assert stages[0]["estimate"]["basis"] == "no times recorded"


def test_changes_are_the_same_in_place_with_previous_and_from_diff(versions, tmp_path, cli):
    source, out, v1 = versions["source"], versions["out"], versions["v1"]
    build(small_config(source, out))
    in_place = (out / "changes.parquet").read_bytes()
    changes = pq.read_table(out / "changes.parquet").to_pylist()
    kinds = {r["key"]: (r["change"], r["fields"]) for r in changes}
    assert kinds[versions["edited"]][0] == "changed" and "caption" in kinds[versions["edited"]][1].split(",")
    assert kinds[versions["deleted"]][0] == "removed" and kinds[versions["appended"]][0] == "added"
    assert "caption edited" in (out / "CHANGES.md").read_text()

    fresh = tmp_path / "fresh"
    build(small_config(source, fresh, previous=str(v1)))
    assert (fresh / "changes.parquet").read_bytes() == in_place
    assert (fresh / "CHANGES.md").read_bytes() == (out / "CHANGES.md").read_bytes()

    result = _cli(cli, "diff", str(v1), str(out), "--out", str(tmp_path / "cli"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cli" / "changes.parquet").read_bytes() == in_place
    assert json.loads(result.stdout.split("\n\nWritten")[0])["records"]["changed"] >= 1

    build(small_config(source, out))  # a rerun with nothing new: an empty account, not a stale one
    assert pq.read_table(out / "changes.parquet").num_rows == 0
    assert "0 added, 0 removed, 0 changed" in (out / "CHANGES.md").read_text()


def test_plan_only_flow_run_writes_nothing_and_shows_the_plan(versions, prefect_server):
    out = versions["out"]
    before = tree_with_markers(out)
    config = small_config(versions["source"], out, plan_only=True, dask={"n_workers": 1, "processes": False})
    result = build_corpus(config)
    assert tree_with_markers(out) == before
    assert [s["stage"] for s in result["stages"]][:3] == ["ingest", "exact_dedup", "resolve"]
    artifacts = httpx.post(f"{prefect_server}/artifacts/filter", json={"artifacts": {"key": {"any_": [
        "build-corpus-plan"]}}}).json()
    assert artifacts and "Plan for a build into" in artifacts[-1]["data"]
