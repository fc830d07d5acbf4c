"""The one code-version rule: a hash of the source of the modules a stage runs.

A stage's code version hashes the source files of its own modules and of every project
module they import, transitively (the ground floor it uses), found by reading their
``import`` statements — never the whole tree. Editing the sample generator, a flow, or
another stage's module therefore invalidates nothing here; editing this stage's module
(a comment included) reruns exactly this stage, and later stages rerun only if its
outputs' bytes changed (their fingerprints hold output digests, not code versions).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import threading
from pathlib import Path

from corpusforge import __version__

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("corpusforge", "tasks")
# ast.parse is not safe in several threads at once on CPython 3.11 (python/cpython#106905),
# and a Dask worker runs tasks on several threads: one closure is computed at a time.
_LOCK = threading.Lock()


def _module_file(module: str) -> Path | None:
    """The source file of a project module (a package's ``__init__.py``), or None."""
    if module.split(".", 1)[0] not in PROJECT_PACKAGES:
        return None
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """Project modules named by any import statement in ``path`` (function-level ones too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if _module_file(n) is not None}


def module_closure(*modules: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """``modules`` and every project module they import, transitively, sorted."""
    seen: set[str] = set()
    stack = list(modules)
    while stack:
        module = stack.pop()
        if module in seen or module in exclude:
            continue
        path = _module_file(module)
        if path is None:
            raise ModuleNotFoundError(f"{module} is not a module of this project")
        seen.add(module)
        stack.extend(_imports(path) - seen)
    return sorted(seen)


@functools.cache
def code_version(*modules: str, exclude: tuple[str, ...] = ()) -> str:
    """Package version plus a hash of the source of ``modules`` and their import closure."""
    h = hashlib.sha256()
    with _LOCK:
        closure = module_closure(*modules, exclude=exclude)
    for module in closure:
        h.update(module.encode() + b"\0")
        h.update(_module_file(module).read_bytes())  # type: ignore[union-attr]
    return f"{__version__}+{h.hexdigest()[:12]}"
