"""The one code-version rule: a hash of the source of the modules a stage runs.

A stage's code version hashes the source files of its own modules and of every project
module they import, transitively (the ground floor it uses), found by reading their
``import`` statements — never the whole tree. Editing the sample generator, a flow, or
another stage's module therefore invalidates nothing here; editing this stage's module
(a comment included) reruns exactly this stage, and later stages rerun only if its
outputs' bytes changed (their fingerprints hold output digests, not code versions).
"""

from __future__ import annotations

import dis
import functools
import hashlib
from pathlib import Path

from corpusforge import __version__

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("corpusforge", "tasks")
# Files that are code of a module without being Python: a changed template reruns the
# units whose pages it lays out.
MODULE_DATA = {"corpusforge.html": "corpusforge/templates"}


def _module_file(module: str) -> Path | None:
    """The source file of a project module (a package's ``__init__.py``), or None."""
    if module.split(".", 1)[0] not in PROJECT_PACKAGES:
        return None
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> frozenset[str]:
    """Project modules named by any import statement in ``path`` (function-level ones too),
    read once per version of the file in a process (a build asks for a few hundred closures
    that share most modules: compiling each file again was ~3 s of a settled no-op rerun)."""
    stat = path.stat()
    return _imports_of(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _imports_of(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    """:func:`_imports` of one version of the file (``mtime_ns`` and ``size`` key the cache).

    Read from the compiled bytecode (``IMPORT_NAME`` with its level and from-list), not
    with ``ast.parse``: building Python AST objects shares recursion counters across
    threads on CPython 3.11 (python/cpython#106905), so a parse here while another thread
    (Prefect, a library) parses failed one of them with "AST constructor recursion depth
    mismatch" — a lock of our own cannot cover the other thread. ``compile`` builds no
    AST objects. Relative imports (level > 0) are not followed, as before.
    """
    names: set[str] = set()
    stack = [compile(path.read_bytes(), str(path), "exec", dont_inherit=True)]
    while stack:
        code = stack.pop()
        ops = list(dis.get_instructions(code))
        for i, op in enumerate(ops):
            if op.opname == "IMPORT_NAME" and ops[i - 2].argval == 0:  # preceded by level, from-list
                names.add(op.argval)
                names.update(f"{op.argval}.{name}" for name in ops[i - 1].argval or ())
        stack.extend(c for c in code.co_consts if isinstance(c, type(code)))
    return frozenset(n for n in names if _module_file(n) is not None)


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
    for module in module_closure(*modules, exclude=exclude):
        h.update(module.encode() + b"\0")
        h.update(_module_file(module).read_bytes())  # type: ignore[union-attr]
        if module in MODULE_DATA:
            for data in sorted(p for p in (ROOT / MODULE_DATA[module]).iterdir() if p.is_file()):
                h.update(data.name.encode() + b"\0" + data.read_bytes())
    return f"{__version__}+{h.hexdigest()[:12]}"
