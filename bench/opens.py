"""Files a process opens, counted by the kernel's view of it (strace), not by the Python layer.

A counting fsspec filesystem sees only what goes through fsspec: ``os.scandir``, DuckDB's
reads and spills, FAISS's own ``open``/``mmap`` and pyarrow's native readers bypass it. Here
the command runs under ``strace -f`` tracing only the open calls (seccomp-bpf: the other
system calls run untraced, so the step's time is not distorted), every thread and child
process included. The measured process marks its window by opening :func:`mark` files
before and after the work, so the imports and the setup before it are not counted.

A count is every successful open (reading or writing, a file or a folder) of a path under
``under`` inside the window; strace ``-y`` prints the path each returned descriptor resolves
to, so relative paths and ``openat(dirfd, name)`` are counted by where they land.
"""

from __future__ import annotations

import os
import re
import shutil

CALLS = "open,openat,openat2,creat"
LOG_ENV = "CORPUSFORGE_OPENS_LOG"  # set for the traced process: where its marks go
_OPENED = re.compile(r"= \d+<(.+)>$")  # "= 3</abs/path>", also on "<... openat resumed>" lines


def traced(cmd: list[str], log: str) -> list[str]:
    """``cmd`` under strace, writing its open calls to ``log``."""
    if shutil.which("strace") is None:
        raise SystemExit("files opened are counted with strace, which is not installed (apt-get install strace)")
    return ["strace", "-f", "--seccomp-bpf", "-qq", "-y", "-e", f"trace={CALLS}", "-e", "status=successful",
            "-o", log, *cmd]


def mark(which: str) -> None:
    """Open this process's ``which`` ("start" or "end") mark, if it runs under :func:`traced`."""
    log = os.environ.get(LOG_ENV)
    if log:
        open(f"{log}.{which}", "w").close()


def count(log: str, under: str) -> int:
    """Opens of paths under ``under`` between the start and end marks of ``log``."""
    root, start, end = os.path.realpath(under) + os.sep, f"{log}.start", f"{log}.end"
    inside, opened = False, 0
    with open(log, errors="replace") as f:
        for line in f:
            found = _OPENED.search(line.rstrip())
            if found is None:
                continue
            path = found.group(1)
            if path == os.path.realpath(start):
                inside = True
            elif path == os.path.realpath(end):
                return opened
            elif inside and path.startswith(root):
                opened += 1
    raise ValueError(f"{log}: no start and end marks (the step failed, or did not call bench.opens.mark)")
