"""The layer contract (.importlinter): flows → tasks → corpusforge, no stage package imports
another, the shared package imports no stage, and Prefect stays in flows/ and the ground
floor's orchestration adapter. The linter runs on the code as it is, and on a copy with a
planted violation, which it must refuse (a test of the configuration itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / ".importlinter"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def _copy(tmp_path: Path) -> Path:
    """The three packages and the contract, sources only."""
    for package in ("flows", "tasks", "corpusforge"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_code_keeps_every_layer_contract():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# (module planted, its import, the contract it breaks)
PLANTED = [
    ("tasks/stats/planted.py", "from tasks.graph.stage import near_duplicate_stage", "No stage package imports another"),
    ("tasks/shared/planted.py", "from tasks.release.splits import SPLITS", "The shared package imports no stage"),
    ("tasks/graph/planted.py", "from corpusforge.cluster import fan_out", "Prefect and the fan-out only in flows/"),
    ("tasks/captions/planted.py", "import prefect", "Prefect and the fan-out only in flows/"),
    ("corpusforge/planted.py", "from tasks.staging.stage import plan_staging", "flows -> tasks -> corpusforge"),
]


def test_planted_imports_break_their_contracts(tmp_path):
    """One copy with every violation planted (one linter run): each is reported under its contract."""
    root = _copy(tmp_path)
    for module, line, _ in PLANTED:
        (root / module).write_text(f'"""Planted by the test."""\n\n{line}\n')
    result = _lint(root)
    assert result.returncode != 0
    report = result.stdout.split("Broken contracts", 1)[-1]
    starts = sorted({report.index(contract): contract for _, _, contract in PLANTED}.items())
    sections = {contract: report[start:end] for (start, contract), (end, _) in
                zip(starts, [*starts[1:], (len(report), "")], strict=True)}
    for module, _, contract in PLANTED:
        name = module.removesuffix(".py").replace("/", ".")
        assert name in sections[contract], f"{name} not reported under {contract!r}:\n{result.stdout}"


def test_the_flow_processes_import_no_model_library():
    """A flow process only coordinates: importing every flow (what `corpusforge` and a
    Prefect worker do before a run starts) loads no torch, open_clip or timm, which cost
    seconds of every run's start and belong to the workers that build a model."""
    flows = sorted(p.stem for p in (ROOT / "flows").glob("*.py") if p.stem != "__init__")
    code = (f"import importlib, sys\nfor m in {flows!r}: importlib.import_module('flows.' + m)\n"
            "print(sorted(m for m in ('torch', 'open_clip', 'timm', 'onnxruntime') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout
