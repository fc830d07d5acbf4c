"""Earlier versions of a module, read from git: the reference that a rewrite's outputs are
compared with byte for byte (release planning, the folder listing)."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_at(commit: str, path: str, name: str) -> types.ModuleType:
    """The module ``name`` as file ``path`` was at ``commit``, not registered in ``sys.modules``."""
    source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout
    module = types.ModuleType(name)
    exec(compile(source, f"{commit[:7]}:{path}", "exec"), module.__dict__)
    return module
