"""The command line: --help on every subcommand, and the sample subcommand end to end."""

from __future__ import annotations

import json
import subprocess

import pytest

from flows.cli import FLOW_COMMANDS, main

SUBCOMMANDS = ["build", "plan", "diff", "sample", *FLOW_COMMANDS]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: corpusforge " + command in capsys.readouterr().out


def test_console_script_is_installed(cli):
    out = subprocess.run([*cli, "--help"], capture_output=True, text=True, check=True)
    assert all(c in out.stdout for c in SUBCOMMANDS)


def test_sample_subcommand_writes_a_corpus(tmp_path, capsys):
    assert main(["sample", "--out", str(tmp_path / "s"), "--n", "40", "--seed", "3"]) == 0
    assert (tmp_path / "s" / "metadata.parquet").exists()
    truth = json.loads((tmp_path / "s" / "ground_truth.json").read_text())
    assert truth["bad_records"]


def test_unknown_config_keys_are_rejected(tmp_path):
    from pydantic import ValidationError

    from flows.build_corpus import BuildConfig

    path = tmp_path / "bad.yaml"
    path.write_text("splits: {shard_sise: 10}\n")
    with pytest.raises(ValidationError):
        BuildConfig.from_yaml(path, source="x", out="y")
