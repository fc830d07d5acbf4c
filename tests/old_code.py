"""Earlier versions of a module, read from git: the reference that a rewrite's outputs are
compared with byte for byte (release assignment, the folder listing)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Modules that moved into stage packages since those commits: an old module's imports are
# pointed at where the same code lives now.
MOVED = {"tasks.sources": "tasks.ingest.sources", "tasks.validate": "tasks.shared.validate",
         "tasks.ingest.validate": "tasks.shared.validate",
         "tasks.licenses": "tasks.ingest.licenses", "tasks.exact_dedup": "tasks.ingest.exact_dedup",
         "tasks.ingest": "tasks.ingest.partition", "tasks.splits": "tests.release_reference",
         "tasks.manifest": "tasks.release.manifest", "tasks.release_image": "tasks.release.release_image",
         "tasks.release_card": "tasks.release.release_card", "tasks.release": "tasks.release.shards",
         "tasks.receipt": "tasks.report.receipt", "tasks.run_log": "tasks.report.run_log",
         "tasks.changes": "tasks.report.changes", "tasks.staging": "tasks.staging.stage"}
_IMPORT = re.compile(r"^(\s*from )(tasks(?:\.\w+)+)( import )", re.M)
# Old code imports every file name from corpusforge.layout; most now live in a stage's files.py.
_LAYOUT = re.compile(r"^(\s*from )corpusforge\.layout( import )", re.M)
# Names renamed since (issue 32: one word per meaning): an old module importing one gets
# today's object under its old name.
RENAMED = {"RELEASE_PLAN_DIR": "RELEASE_ASSIGNMENT_DIR", "RELEASE_PLAN_SCHEMA": "RELEASE_ASSIGNMENT_SCHEMA",
           "release_plan_path": "release_assignment_path", "plan_release": "assign_release"}


def __getattr__(name: str) -> object:
    """A name old code imported from corpusforge.layout, from wherever it is now (``from tests.old_code import``)."""
    stages = sorted(p.parent.name for p in ROOT.glob("tasks/*/files.py"))
    for module in ("corpusforge.layout", *(f"tasks.{stage}.files" for stage in stages)):
        if hasattr(found := importlib.import_module(module), name):
            return getattr(found, name)
    raise AttributeError(name)


def _moved(source: str) -> str:
    def repoint(m: re.Match[str]) -> str:
        name = m.group(2)
        if name.startswith("tasks.features"):
            name = "tasks.shared" + name[len("tasks"):]
        return m.group(1) + MOVED.get(name, name) + m.group(3)
    return _LAYOUT.sub(r"\1tests.old_code\2", _IMPORT.sub(repoint, source))


def _renamed(source: str) -> str:
    """Old imports of a name that its module no longer has but has under :data:`RENAMED`'s
    new name, made ``new as old``."""
    lines = source.splitlines(keepends=True)
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.module]
    for node in imports:
        module = importlib.import_module(node.module)
        for alias in reversed(node.names):
            new = RENAMED.get(alias.name)
            if new and alias.asname is None and not hasattr(module, alias.name):
                line = lines[alias.lineno - 1]
                lines[alias.lineno - 1] = f"{line[:alias.col_offset]}{new} as {alias.name}{line[alias.end_col_offset:]}"
    return "".join(lines)


def module_at(commit: str, path: str, name: str) -> types.ModuleType:
    """The module ``name`` as file ``path`` was at ``commit``, not registered in ``sys.modules``."""
    source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout
    module = types.ModuleType(name)
    # registered while it runs only: a dataclass looks its module up there (the name may be gone
    # since, or be today's module of that name, which is put back)
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        exec(compile(_renamed(_moved(source)), f"{commit[:7]}:{path}", "exec"), module.__dict__)
    finally:
        if previous is None:
            del sys.modules[name]
        else:
            sys.modules[name] = previous
    return module
