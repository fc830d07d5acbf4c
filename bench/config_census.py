"""Count the pydantic models this project defines (issue 23: config classes and fields).

Imports every module under corpusforge/, tasks/ and flows/ and lists each ``BaseModel``
subclass defined there with the number of its fields (inherited ones included, as a
reader of that class sees them); fields of ``*Advanced`` models (the ``advanced:``
sections of rarely-set knobs) are also counted apart. Run: ``python bench/config_census.py [-v]``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from pydantic import BaseModel

PACKAGES = ("corpusforge", "tasks", "flows")


def _modules() -> list[str]:
    """Every module file of the packages (read from disk: pkgutil skips namespace packages)."""
    root = Path(__file__).resolve().parent.parent
    names = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def census() -> dict[str, int]:
    """Qualified class name → number of model fields, for every model defined in the project."""
    found: dict[str, int] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError as e:  # an optional dependency (e.g. a GPU library) is missing here
            print(f"skipped {name}: {e}", file=sys.stderr)
            continue
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
                    and value.__module__.split(".")[0] in PACKAGES):
                found[f"{value.__module__}.{value.__qualname__}"] = len(value.model_fields)
    return dict(sorted(found.items()))


def main() -> None:
    found = census()
    if "-v" in sys.argv:
        for name, fields in found.items():
            print(f"{fields:4d}  {name}")
    advanced = sum(n for name, n in found.items() if name.endswith("Advanced"))
    print(f"{len(found)} classes, {sum(found.values())} fields ({advanced} of them in advanced: sections)")


if __name__ == "__main__":
    main()
