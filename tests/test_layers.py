"""The layer contract (.importlinter): flows → tasks → corpusforge, no stage package imports
another but for a stage's public files.py, which imports nothing but the ground floor, the
shared package imports no stage, Prefect stays in flows/ and the ground floor's orchestration
adapter, and no package's modules import each other in a circle. The
linter runs on the code as it is, and on a copy with a planted violation, which it must
refuse (a test of the configuration itself). No module imports itself through others,
checked from the source (every import statement, in function bodies too)."""

from __future__ import annotations

import ast
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
    # a stage's files.py, which other stages may import, is a leaf: no back door to its stage
    ("tasks/contamination/files.py", "from tasks.contamination.stage import run_scan",
     "A stage's files.py imports nothing but the ground floor"),
    ("tasks/graph/planted.py", "from corpusforge.cluster import fan_out", "Prefect and the fan-out only in flows/"),
    ("tasks/captions/planted.py", "import prefect", "Prefect and the fan-out only in flows/"),
    ("corpusforge/planted.py", "from tasks.staging.stage import cut_staging", "flows -> tasks -> corpusforge"),
    ("flows/planted_a.py", "def a():\n    from flows.planted_b import b", "No import cycles"),  # the linter
    ("flows/planted_b.py", "def b():\n    from flows.planted_a import a", "No import cycles"),  # names .planted_b
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
        short = "." + name.rsplit(".", 1)[1]  # how a cycle names the modules of its package
        assert name in sections[contract] or short in sections[contract], \
            f"{name} not reported under {contract!r}:\n{result.stdout}"


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


PACKAGES = ("flows", "tasks", "corpusforge")


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the three packages -> those of them it imports, from every import
    statement in its source (module level, function bodies, ``TYPE_CHECKING`` blocks alike).
    ``from a.b import c`` imports ``a.b.c`` when that is a module, else ``a.b``."""
    files = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        graph[module] = {m for n in names if (m := known(n)) not in (None, module)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            if (m := todo.pop()) not in seen:
                seen.add(m)
                todo += graph[m]
        return seen

    reached = {m: reach(m) for m in graph}
    return sorted({tuple(sorted(n for n in reached[m] if m in reached[n])) for m in graph if m in reached[m]})


def test_no_module_imports_itself_through_others():
    assert circles(import_graph(ROOT)) == []


def test_planted_circles_are_found(tmp_path):
    """A function-level import back (what hid the circles of issue 32) and a package whose
    ``__init__`` imports a module that imports the package: both are circles."""
    root = _copy(tmp_path)
    (root / "flows" / "plan.py").write_text((root / "flows" / "plan.py").read_text()
                                            + "\n\ndef planted():\n    from flows import build_corpus\n")
    (root / "tasks" / "graph" / "planted.py").write_text('"""Planted."""\n\nimport tasks.graph\n')
    (root / "tasks" / "graph" / "__init__.py").write_text((root / "tasks" / "graph" / "__init__.py").read_text()
                                                          + "\nfrom . import planted\n")
    assert circles(import_graph(root)) == [("flows.build_corpus", "flows.plan"), ("tasks.graph", "tasks.graph.planted")]
