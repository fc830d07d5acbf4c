"""The documentation stays a map a newcomer can trust: a short README that starts with the two
commands, pages narrow enough to read, and no link that leads nowhere.

In-process and fast (fast tier): it reads the Markdown files and the Makefile, nothing else.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BENCH = ROOT / "bench" / "README.md"
MAX_README_LINES = 300
MAX_LINE = 200

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks: links in code are not links."""
    lines, code = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            code = not code
            continue
        if not code:
            lines.append((n, line))
    return lines


def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for _, line in _prose(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = _anchor(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
    out = set()
    for base, count in seen.items():
        out.add(base)
        out.update(f"{base}-{i}" for i in range(1, count))
    return out


def _linked_pages() -> list[Path]:
    return [README, *DOCS, BENCH]


def test_the_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move reference material to docs/ (limit {MAX_README_LINES})"


@pytest.mark.parametrize("path", [README, *DOCS, BENCH], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_line_is_wider_than_the_limit(path: Path) -> None:
    wide = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_LINE]
    assert not wide, f"{path.relative_to(ROOT)}: lines over {MAX_LINE} characters: {wide}"


def test_every_stage_has_its_page() -> None:
    assert len(DOCS) >= 10, "docs/ holds one page per stage"


@pytest.mark.parametrize("path", _linked_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_an_existing_file_and_heading(path: Path) -> None:
    broken = []
    for n, line in _prose(path):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"line {n}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                broken.append(f"line {n}: {target} (no such heading in {dest.relative_to(ROOT)})")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.M))


def test_the_readme_starts_with_the_two_commands_and_they_exist() -> None:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S)
    assert block, "README.md has no command block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"], f"the README's first commands are {commands[:2]}"
    assert "make test-fast" in text, "the README names the fast tier's command"
    targets = _make_targets()
    for target in ("demo", "test", "test-fast"):
        assert target in targets, f"Makefile has no target {target!r}"
