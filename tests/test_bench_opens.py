"""bench/opens.py: files opened counted at the OS level (strace), so the scale benchmark's
files-opened bound sees what fsspec does not — folder listings, DuckDB's reads, threads and
child processes — and only inside the step's window."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from bench import opens

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/strace"), reason="needs strace (.ci/run installs it)")


def _run_traced(tmp_path, code: str) -> int:
    log = str(tmp_path / "opens.log")
    env = dict(os.environ, **{opens.LOG_ENV: log})
    script = "from bench import opens\n" + textwrap.dedent(code)
    subprocess.run(opens.traced([sys.executable, "-c", script], log), check=True, env=env,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return opens.count(log, str(tmp_path / "data"))


def test_scandir_threads_and_child_processes_are_counted_and_only_inside_the_window(tmp_path):
    data = tmp_path / "data"
    for d in ("a", "b", "c"):
        (data / d).mkdir(parents=True)
    (data / "a" / "x.txt").write_text("x")
    (tmp_path / "outside.txt").write_text("o")
    count = _run_traced(tmp_path, f"""
        import os, subprocess, threading
        data = {str(data)!r}
        open(os.path.join(data, "a", "x.txt")).read()          # before the window: not counted
        opens.mark("start")
        for d in ("a", "b", "c"):
            list(os.scandir(os.path.join(data, d)))            # 3 folder opens
        open({str(tmp_path / "outside.txt")!r}).read()         # not under data: not counted
        t = threading.Thread(target=lambda: open(os.path.join(data, "a", "x.txt")).read())
        t.start(); t.join()                                    # 1, in a thread
        subprocess.run(["cat", os.path.join(data, "a", "x.txt")], check=True, capture_output=True)  # 1, a child
        os.chdir(os.path.join(data, "a")); open("x.txt").read()  # 1, by a relative path
        opens.mark("end")
        open(os.path.join(data, "a", "x.txt")).read()          # after the window: not counted
    """)
    assert count == 6


def test_a_duckdb_read_is_counted(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "data" / "t.parquet")
    count = _run_traced(tmp_path, f"""
        import duckdb
        opens.mark("start")
        table = {str(tmp_path / 'data' / 't.parquet')!r}
        assert duckdb.sql(f"select count(*) from read_parquet('{{table}}')").fetchall() == [(3,)]
        opens.mark("end")
    """)
    assert count >= 1


def test_a_window_without_its_end_mark_is_an_error_not_a_count(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(ValueError, match="no start and end marks"):
        _run_traced(tmp_path, "opens.mark('start')\n")
