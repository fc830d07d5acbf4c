"""deployments/prefect.yaml, checked statically with Prefect's own model, then used as a
user would: a real Prefect server with its UI on loopback, `prefect deploy`, a run of the
build deployment triggered through the API the UI uses with one parameter changed, a
process worker started here picking it up; its artifacts read back; then the real UI in
headless Chromium starts a custom run with one field of the form changed."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.operate import (ROOT, artifacts_dir, browser, child_runs, clean_env, prefect_cli, run_logs, stop,
                           wait_for_run)

PREFECT_YAML = ROOT / "deployments" / "prefect.yaml"
FLOWS = {"build-corpus": "flows.build_corpus.build_corpus",
         "extract-features": "flows.extract_features.extract_features_flow",
         "near-dedup": "flows.near_dedup.near_dedup_flow",
         "reference-stats": "flows.reference_stats.reference_stats_flow",
         "evaluate": "flows.evaluate.evaluate_flow"}
if (ROOT / "flows" / "contamination.py").exists():
    FLOWS["contamination"] = "flows.contamination.contamination_flow"
if (ROOT / "flows" / "prompt_qualification.py").exists():
    FLOWS["qualify-prompts"] = "flows.prompt_qualification.prompt_qualification_flow"
POOL = "corpusforge-process"
PROGRESS_STAGES = ("ingest", "staging", "features", "graph queries", "release")


def load_yaml() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def resolved(value, data: str):
    """The deployment's parameters as `prefect deploy` stores them (env placeholders applied)."""
    from prefect.utilities.templating import apply_values

    old = os.environ.get("CORPUSFORGE_DATA")
    os.environ["CORPUSFORGE_DATA"] = data
    try:
        return apply_values(value, os.environ, remove_notset=False)
    finally:
        if old is None:
            os.environ.pop("CORPUSFORGE_DATA")
        else:
            os.environ["CORPUSFORGE_DATA"] = old


def test_prefect_yaml_validates_with_prefects_own_model():
    from prefect.cli.deploy._models import DeploymentConfig, PrefectYamlModel, RawScheduleConfig
    from prefect.flows import Flow, load_flow_from_entrypoint

    raw = load_yaml()
    model = PrefectYamlModel.model_validate(raw)
    # Prefect's model ignores unknown keys: a misspelt one would silently do nothing.
    known = set(DeploymentConfig.model_fields)
    for d in raw["deployments"]:
        assert set(d) <= known, f"{d['name']}: unknown keys {set(d) - known}"
    deployments = {d.name: d for d in model.deployments}
    assert set(deployments) == set(FLOWS), "one deployment per flow"
    assert model.pull == [] or raw["pull"] == []
    for name, d in deployments.items():
        assert d.entrypoint == FLOWS[name]
        flow = load_flow_from_entrypoint(d.entrypoint)
        assert isinstance(flow, Flow) and flow.name == name
        assert d.work_pool is not None and d.work_pool.name == POOL
        assert d.description and d.enforce_parameter_schema is True
        limit = d.concurrency_limit
        assert limit is not None and (limit if isinstance(limit, int) else limit.limit) >= 1
        # the defaults are a valid config of the flow (the form starts valid)
        config_model = importlib.import_module(d.entrypoint.rsplit(".", 1)[0])
        params = resolved(d.parameters, "/data")
        annotation = flow.fn.__annotations__["config"]
        annotation.model_validate(params["config"])
        assert config_model is not None
        assert "{{" not in json.dumps(params)
    build = deployments["build-corpus"]
    (schedule,) = build.schedules
    schedule = RawScheduleConfig.model_validate(schedule) if isinstance(schedule, dict) else schedule
    assert schedule.cron == "0 3 * * *" and schedule.active is False, "nightly, paused until switched on"
    limit = build.concurrency_limit
    assert (limit if isinstance(limit, int) else limit.limit) == 1, "two builds never share an output root"


def test_deployment_parameters_carry_no_credentials():
    from corpusforge.secrets import find_secrets

    for d in load_yaml()["deployments"]:
        assert not find_secrets(d.get("parameters", {})), d["name"]


def test_parameter_schema_renders_as_a_form():
    """What the UI's form is built from: titled fields, no tuple schema (prefixItems) that
    the form shows as a list with an error under every item."""
    from prefect.utilities.callables import parameter_schema

    for entrypoint in FLOWS.values():
        module, name = entrypoint.rsplit(".", 1)
        schema = parameter_schema(getattr(importlib.import_module(module), name)).model_dump()
        text = json.dumps(schema)
        assert "prefixItems" not in text, entrypoint
        assert schema["required"] == ["config"]
        config = schema["definitions"][schema["properties"]["config"]["$ref"].rsplit("/", 1)[1]] \
            if "$ref" in schema["properties"]["config"] else schema["properties"]["config"]
        assert config.get("additionalProperties") is False, "unknown keys are refused by the server too"


# ---- the round trip on a real server -----------------------------------------------------

@pytest.fixture(scope="module")
def deployed(tmp_path_factory, prefect_server_with_ui):
    """A Prefect server with its UI, every deployment of prefect.yaml deployed, a sample
    source under CORPUSFORGE_DATA, and a process worker polling the pool."""
    from sample_corpus import write_sample_corpus

    home = tmp_path_factory.mktemp("prefect-home")
    data = tmp_path_factory.mktemp("data")
    write_sample_corpus(str(data / "source"), n=40, seed=0)
    with prefect_server_with_ui(home) as api:
        env = clean_env(PREFECT_HOME=str(home), PREFECT_API_URL=api, CORPUSFORGE_DATA=str(data))
        cli = prefect_cli()
        subprocess.run([cli, "work-pool", "create", POOL, "--type", "process"], env=env, check=True,
                       capture_output=True, cwd=ROOT)
        out = subprocess.run([cli, "--no-prompt", "deploy", "--all", "--prefect-file", str(PREFECT_YAML)], env=env,
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        import httpx

        names = {d["name"] for d in httpx.post(f"{api}/deployments/filter", json={}).json()}
        assert names == set(FLOWS), (names, out.stdout[-3000:], out.stderr[-3000:])
        worker_log = open(home / "worker.log", "wb")
        worker = subprocess.Popen([cli, "worker", "start", "--pool", POOL, "--type", "process"],
                                  env=dict(env, PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="5"),
                                  stdout=worker_log, stderr=subprocess.STDOUT, cwd=str(data), start_new_session=True)
        try:
            yield {"api": api, "data": data, "home": home}
        finally:
            stop(worker)
            worker_log.close()


def deployment(api: str, name: str) -> dict:
    import httpx

    (dep,) = httpx.post(f"{api}/deployments/filter", json={"deployments": {"name": {"any_": [name]}}}).json()
    return dep


def worker_log_tail(deployed) -> str:
    return (deployed["home"] / "worker.log").read_text(errors="replace")[-4000:]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(900)
def test_every_flow_is_deployed(deployed):
    for name in FLOWS:
        dep = deployment(deployed["api"], name)
        assert dep["work_pool_name"] == POOL and dep["entrypoint"] == FLOWS[name]
        assert dep["parameter_openapi_schema"]["properties"]["config"]
    build = deployment(deployed["api"], "build-corpus")
    assert build["parameters"]["config"]["source"] == f"{deployed['data']}/source"
    assert [s["active"] for s in build["schedules"]] == [False]
    assert build["global_concurrency_limit"]["limit"] == 1
    assert build["concurrency_options"]["collision_strategy"] == "ENQUEUE"


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(900)
def test_build_triggered_through_the_api_runs_on_the_worker(deployed):
    import httpx

    api = deployed["api"]
    dep = deployment(api, "build-corpus")
    config = json.loads(json.dumps(dep["parameters"]["config"]))
    config["splits"] = {"seed": 7}  # the one parameter changed
    run = httpx.post(f"{api}/deployments/{dep['id']}/create_flow_run",
                     json={"parameters": {"config": config}}).json()
    assert run["parameters"]["config"]["splits"] == {"seed": 7}
    final = wait_for_run(api, run["id"])
    assert final["state_type"] == "COMPLETED", worker_log_tail(deployed)

    # one build is one flow run with its work as a clearly named subflow run
    (sub,) = child_runs(api, run["id"])
    assert sub["name"] == f"{final['name']} on dask" and sub["state_type"] == "COMPLETED"
    flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={}).json()}
    assert flows[final["flow_id"]] == "build-corpus" and flows[sub["flow_id"]] == "build-corpus-on-dask"

    receipt = json.loads((deployed["data"] / "corpus" / "receipt.json").read_text())
    assert receipt["seeds"]["splits"] == 7 and receipt["counts"]["records"] == 40
    assert (deployed["data"] / "corpus" / "report.html").exists()

    artifacts = {a["key"]: a for a in httpx.post(f"{api}/artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run["id"], sub["id"]]}}}).json() if a["key"]}
    summary = artifacts["build-corpus-summary"]
    assert summary["type"] == "markdown"
    assert "## Outcomes" in summary["data"] and "## Splits" in summary["data"]
    for status, n in receipt["counts"]["by_status"].items():
        assert f"| {status} | {n} |" in summary["data"]
    table = artifacts["build-corpus-outcomes"]
    assert table["type"] == "table"
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    assert sum(r["records"] for r in rows) == receipt["counts"]["records"]
    progress = artifacts["build-corpus-progress"]
    assert progress["type"] == "progress" and float(progress["data"]) == 100.0
    # updated during the long stages: every update is also a log line of the run
    logs = [m for m in run_logs(api, [sub["id"]]) if m.startswith("progress ")]
    for stage in PROGRESS_STAGES:
        assert any(f"%: {stage}: " in m for m in logs), (stage, logs)


def _runs_out_to(api: str, deployment_id: str, out: str, seconds: int) -> list[dict[str, Any]]:
    """The deployment's runs whose config writes to ``out``, polled until one shows up."""
    import httpx

    mine: list[dict[str, Any]] = []
    for _ in range(seconds):
        runs = httpx.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}}).json()
        mine = [r for r in runs if r["parameters"]["config"].get("out") == out]
        if mine:
            break
        time.sleep(1)
    return mine


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(900)
def test_custom_run_from_the_prefect_ui(deployed, chromium):
    """Open the build deployment in the real UI, change one field of the form, submit, and
    see the run complete; the screenshot is kept in test-artifacts/."""
    import httpx

    api = deployed["api"]
    base = api[: -len("/api")]
    dep = deployment(api, "build-corpus")
    new_out = str(deployed["data"] / "corpus-from-ui")
    errors: list[str] = []
    shots = artifacts_dir()
    with browser() as b:
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{base}/deployments/deployment/{dep['id']}", wait_until="networkidle")
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("Custom run").first.click()
        page.wait_for_url(re.compile(r".*/run(\?.*)?$"), timeout=30_000)
        page.wait_for_load_state("networkidle")
        # the form field of the "Output root" property: the input inside its labelled block
        block = page.get_by_text("Output root", exact=True).locator(
            "xpath=ancestor::*[contains(concat(' ', normalize-space(@class), ' '), ' p-label ')][1]")
        field = block.locator("textarea, input").first
        field.wait_for(timeout=30_000)
        assert field.input_value() == dep["parameters"]["config"]["out"]
        field.fill(new_out)
        page.screenshot(path=str(shots / "prefect-ui-custom-run-form.png"))
        # the form creates the run (the UI's "scheduled to start" toast can come and go before a
        # loaded machine's browser is polled for it, so the server is asked instead)
        page.get_by_role("button", name="Submit").click()
        mine = _runs_out_to(api, dep["id"], new_out, seconds=60)
        locked = "database is locked" in (deployed["home"] / "server.log").read_text(errors="replace")
        if not mine and locked:
            # Prefect's SQLite refused the write (seen once under load: a worker's heartbeat held
            # the lock, the UI said "Something went wrong"); a user submits again, and so does this
            print("the Prefect server's SQLite was locked when the form was sent: submitted again")
            page.get_by_role("button", name="Submit").click()
            mine = _runs_out_to(api, dep["id"], new_out, seconds=90)
        if len(mine) != 1:
            page.screenshot(path=str(shots / "prefect-ui-custom-run-not-submitted.png"), full_page=True)
        assert len(mine) == 1, f"the form created {len(mine)} runs"
        run_id = mine[0]["id"]
        page.goto(f"{base}/runs/flow-run/{run_id}", wait_until="networkidle")
        final = wait_for_run(api, run_id)
        page.reload(wait_until="networkidle")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(shots / "prefect-ui-custom-run-completed.png"), full_page=True)
    assert final["state_type"] == "COMPLETED", worker_log_tail(deployed)
    assert final["parameters"]["config"]["out"] == new_out
    assert final["parameters"]["config"]["source"] == dep["parameters"]["config"]["source"]
    assert (Path(new_out) / "receipt.json").exists()
    assert not errors, errors
    assert httpx.get(f"{api}/flow_runs/{run_id}").json()["deployment_id"] == dep["id"]
