"""The shape of the code outside tests, at one or more git revisions (issue 32's report): lines per
folder, modules over 400 lines, functions over 80 lines, and import cycles among the project's
modules (every ``import``, function-level ones included, as tests/test_layers.py scans them).

Read from git objects, not the working tree, so a before/after is one run:
``python bench/code_shape.py dea7487 HEAD``. Lines are physical lines (``wc -l``), blank and
docstring lines included. The ``duplicates`` count is the workplace tool's and is not computed here.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import Counter, defaultdict

FOLDERS = ("corpusforge", "tasks", "flows")
LONG_MODULE = 400
LONG_FUNCTION = 80


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def read_sources(rev: str) -> dict[str, str]:
    """Every ``.py`` file under :data:`FOLDERS` at ``rev``, by path."""
    paths = [p for p in _git("ls-tree", "-r", "--name-only", rev, "--", *FOLDERS).splitlines() if p.endswith(".py")]
    return {p: _git("show", f"{rev}:{p}") for p in paths}


def module_name(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def folder_of(path: str) -> str:
    """``tasks/<stage>`` for the stages, else the top folder."""
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "tasks" and len(parts) > 2 else parts[0]


def long_functions(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, lines) of every function or method longer than :data:`LONG_FUNCTION`."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > LONG_FUNCTION]


def imports_of(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The project modules one module imports (``from x import y`` counts ``x.y`` when that is a module)."""
    found = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def shape(rev: str) -> dict:
    sources = read_sources(rev)
    modules = {module_name(p) for p in sources}
    lines: Counter[str] = Counter()
    long_mods, long_funcs, graph = [], [], defaultdict(set)
    for path, text in sorted(sources.items()):
        n = text.count("\n")
        lines[folder_of(path)] += n
        if n > LONG_MODULE:
            long_mods.append((path, n))
        tree = ast.parse(text, path)
        long_funcs += [(f"{path}:{name}", size) for name, size in long_functions(tree)]
        name = module_name(path)
        graph[name] = imports_of(tree, name, path.endswith("__init__.py"), modules)
    return {"rev": _git("rev-parse", "--short", rev).strip(), "lines": lines, "total": sum(lines.values()),
            "long_modules": long_mods, "long_functions": long_funcs, "cycles": cycles(graph)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", help="git revisions to compare, oldest first")
    parser.add_argument("--list", action="store_true", help="name every long module and function")
    args = parser.parse_args()
    shapes = [shape(r) for r in args.revs]
    folders = sorted(set().union(*(s["lines"] for s in shapes)))
    print("| folder | " + " | ".join(s["rev"] for s in shapes) + " |")
    print("| --- |" + " --- |" * len(shapes))
    for f in folders:
        print(f"| {f} | " + " | ".join(str(s["lines"][f]) for s in shapes) + " |")
    for label, key in (("total lines", "total"), ("modules > 400 lines", "long_modules"),
                       ("functions > 80 lines", "long_functions"), ("import cycles", "cycles")):
        print(f"| **{label}** | " + " | ".join(str(s[key] if key == "total" else len(s[key])) for s in shapes) + " |")
    if args.list:
        for s in shapes:
            print(f"\n{s['rev']}:")
            for path, n in s["long_modules"] + s["long_functions"]:
                print(f"  {n:5d}  {path}")
            for c in s["cycles"]:
                print("  cycle: " + " -> ".join(c))


if __name__ == "__main__":
    main()
