"""The lock (constraints.txt): what the suite ran against is pinned, and it is what was installed.

A dependency's next release once broke every S3 URI on a fresh install while the suite,
run on older versions, stayed green. ``make install`` installs exactly the lock; these
tests fail when the environment drifted from it or when the lock no longer satisfies
pyproject.toml. ``make upgrade`` runs the suite on new releases before rewriting the lock,
so it turns off the drift check (``CORPUSFORGE_LOCK_CHECK=0``) for that run only.
"""

from __future__ import annotations

import os
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        assert match, f"constraints.txt: not an exact pin: {line!r}"
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_every_requirement_of_the_project_is_locked_at_a_version_it_allows():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = locked()
    for spec in [*project["dependencies"], *extras["test"], *extras["sample"]]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a dependency but not in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} breaks {req}"


@pytest.mark.skipif(os.environ.get("CORPUSFORGE_LOCK_CHECK") == "0", reason="make upgrade: new releases on trial")
def test_the_installed_environment_is_the_lock():
    pins = locked()
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    installed.pop("corpusforge", None)
    for tool in ("pip", "setuptools", "wheel"):  # the installer itself is not part of the lock
        installed.pop(tool, None)
    drift = {n: (v, pins.get(n)) for n, v in installed.items() if pins.get(n) != v}
    assert drift == {}, f"installed vs constraints.txt (run `make install`, or `make upgrade` to move the lock): {drift}"


def test_make_install_uses_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^LOCK\s*\?=\s*constraints\.txt$", makefile, re.M)
    assert "$(call install_into,$(VENV),-c $(LOCK))" in makefile
    assert "CORPUSFORGE_LOCK_CHECK=0" in makefile.split("\nupgrade:", 1)[1]
