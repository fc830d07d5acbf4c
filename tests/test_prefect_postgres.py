"""Prefect on PostgreSQL (issue 22): the server the compose stack and infra/ run, where
more than one build reports at once (SQLite locks under concurrent writers). A real
PostgreSQL started by the test, a real ``prefect server start`` on it, and a flow whose
batches run on a Dask worker process that reports its task runs there; the runs are then
read back from PostgreSQL's own tables."""

from __future__ import annotations

import asyncio

import pytest

from corpusforge.cluster import DaskConfig, as_task, dask_config, run_tasks, task_runner
from tests.test_cluster import square

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(600)]


async def rows(database: str, query: str) -> list[tuple]:
    import asyncpg

    conn = await asyncpg.connect(database.replace("postgresql+asyncpg", "postgresql"))
    try:
        return [tuple(r) for r in await conn.fetch(query)]
    finally:
        await conn.close()


def test_a_flow_reports_to_a_prefect_server_on_postgres(tmp_path, monkeypatch, postgres, prefect_server_with_ui):
    from prefect import flow
    from prefect.settings import PREFECT_API_URL, temporary_settings

    square_task = as_task(square, "square")
    config = DaskConfig(n_workers=1, processes=True, gpu="off")

    @flow(name="on-postgres", task_runner=task_runner(config))
    def on_postgres(n: int) -> list[int]:
        with dask_config(config):
            return run_tasks(square_task, [dict(x=x, folder=str(tmp_path), fail_once=-99) for x in range(n)])

    home = tmp_path / "prefect"
    home.mkdir()
    with postgres() as database, prefect_server_with_ui(home, database=database) as api:
        monkeypatch.setenv("PREFECT_API_URL", api)  # the Dask worker process started below reports here...
        with temporary_settings(updates={PREFECT_API_URL: api}):  # ...and so does this process's flow run
            assert on_postgres(6) == [x * x for x in range(6)]
        flows = asyncio.run(rows(database, "SELECT f.name, r.state_type FROM flow_run r JOIN flow f ON f.id = r.flow_id"))
        tasks = asyncio.run(rows(database, "SELECT name, state_type FROM task_run ORDER BY name"))
    assert flows == [("on-postgres", "COMPLETED")]
    assert tasks == [(f"square {i}/4", "COMPLETED") for i in range(1, 5)]  # 6 units, 4 batches on 1 worker
    assert not list(home.glob("*.db")), "the server wrote a SQLite database"
