"""infra/: every manifest parses; Kubernetes core objects validate against the Kubernetes
JSON schemas (kubernetes-validate, strict); the Dask operator's resources against the
shape of their CRDs, with their pod specs validated as Kubernetes PodSpecs; the GPU worker
group asks for one GPU and declares the Dask resource the feature tasks need; the
Kubernetes work pool's job template passes Prefect's own validation."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
K8S_VERSION = "1.30"
DASK_KINDS = {"DaskCluster", "DaskWorkerGroup", "DaskAutoscaler"}

# The shape of the Dask Kubernetes operator's CRDs (kubernetes.dask.org/v1); PodSpec and
# ServiceSpec parts are checked against the Kubernetes schemas separately.
_WORKER = {"type": "object", "required": ["spec"], "additionalProperties": False,
           "properties": {"replicas": {"type": "integer", "minimum": 0}, "spec": {"type": "object"}}}
DASK_SCHEMAS = {
    "DaskCluster": {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["scheduler", "worker"], "additionalProperties": False,
        "properties": {"idleTimeout": {"type": "integer"},
                       "scheduler": {"type": "object", "required": ["spec", "service"], "additionalProperties": False,
                                     "properties": {"spec": {"type": "object"}, "service": {"type": "object"}}},
                       "worker": _WORKER}}}},
    "DaskWorkerGroup": {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["cluster", "worker"], "additionalProperties": False,
        "properties": {"cluster": {"type": "string"}, "worker": _WORKER}}}},
    "DaskAutoscaler": {"type": "object", "required": ["spec"], "properties": {"spec": {
        "type": "object", "required": ["cluster", "minimum", "maximum"], "additionalProperties": False,
        "properties": {"cluster": {"type": "string"}, "minimum": {"type": "integer", "minimum": 0},
                       "maximum": {"type": "integer", "minimum": 1}}}}},
}


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(INFRA.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((str(path.relative_to(ROOT)), doc))
    return docs


def by_kind(kind: str) -> list[dict]:
    return [d for _, d in documents() if d["kind"] == kind]


def validate_k8s(doc: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def validate_pod_spec(spec: dict, name: str) -> None:
    validate_k8s({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def containers(doc: dict) -> list[dict]:
    specs = []
    if doc["kind"] == "DaskCluster":
        specs = [doc["spec"]["scheduler"]["spec"], doc["spec"]["worker"]["spec"]]
    elif doc["kind"] == "DaskWorkerGroup":
        specs = [doc["spec"]["worker"]["spec"]]
    elif doc["kind"] in ("Deployment", "StatefulSet"):
        specs = [doc["spec"]["template"]["spec"]]
    return [c for s in specs for c in s["containers"]]


def test_every_manifest_parses_with_kind_version_and_name():
    docs = documents()
    assert {d["kind"] for _, d in docs} >= DASK_KINDS | {"Deployment", "ServiceAccount", "Role", "RoleBinding",
                                                          "ConfigMap"}
    for where, d in docs:
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), where
        if d["kind"] in DASK_KINDS:
            assert d["apiVersion"] == "kubernetes.dask.org/v1", where


@pytest.mark.parametrize("where,doc", [w for w in documents() if w[1]["kind"] not in DASK_KINDS],
                         ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_core_objects_validate_against_kubernetes_schemas(where, doc):
    validate_k8s(doc)


def test_dask_operator_resources_validate():
    for kind in DASK_KINDS:
        (doc,) = by_kind(kind)
        jsonschema.validate(doc, DASK_SCHEMAS[kind])
    cluster = by_kind("DaskCluster")[0]
    validate_pod_spec(cluster["spec"]["scheduler"]["spec"], "scheduler")
    validate_pod_spec(cluster["spec"]["worker"]["spec"], "cpu-worker")
    validate_k8s({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "scheduler"},
                  "spec": cluster["spec"]["scheduler"]["service"]})
    validate_pod_spec(by_kind("DaskWorkerGroup")[0]["spec"]["worker"]["spec"], "gpu-worker")


def test_gpu_and_cpu_worker_groups_and_autoscaler():
    cluster, gpu, scaler = by_kind("DaskCluster")[0], by_kind("DaskWorkerGroup")[0], by_kind("DaskAutoscaler")[0]
    assert gpu["spec"]["cluster"] == scaler["spec"]["cluster"] == cluster["metadata"]["name"]
    assert 1 <= scaler["spec"]["minimum"] <= scaler["spec"]["maximum"]
    (gpu_worker,) = gpu["spec"]["worker"]["spec"]["containers"]
    assert gpu_worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    args = gpu_worker["args"]
    assert args[args.index("--resources") + 1] == "GPU=1", "feature tasks ask for GPU=1 (dask.model_task_resources)"
    assert gpu_worker["image"].endswith(":cuda")
    (cpu_worker,) = cluster["spec"]["worker"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in cpu_worker["resources"]["limits"] and "--resources" not in cpu_worker["args"]
    for doc in (cluster, gpu, *by_kind("Deployment"), *by_kind("StatefulSet")):
        for c in containers(doc):
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]
    ports = {p["name"]: p["port"] for p in cluster["spec"]["scheduler"]["service"]["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}


def named(kind: str, name: str) -> dict:
    (doc,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return doc


def test_prefect_worker_runs_the_kubernetes_pool_with_rights_to_start_jobs():
    deployment = named("Deployment", "corpusforge-prefect-worker")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["command"][:3] == ["prefect", "worker", "start"]
    assert c["command"][c["command"].index("--pool") + 1] == "corpusforge-kubernetes"
    assert any(e["name"] == "PREFECT_API_URL" for e in c["env"])
    (role,) = by_kind("Role")
    jobs = [r for r in role["rules"] if "jobs" in r["resources"]]
    assert jobs and "create" in jobs[0]["verbs"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == by_kind("ServiceAccount")[0]["metadata"]["name"]


def test_kubernetes_work_pool_job_template():
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.utilities.templating import apply_values

    template = json.loads((INFRA / "prefect" / "kubernetes-job-template.json").read_text())
    pool = WorkPoolCreate(name="corpusforge-kubernetes", type="kubernetes", base_job_template=template)
    assert pool.base_job_template == template  # Prefect's validator: every placeholder is a variable
    jsonschema.Draft202012Validator.check_schema(template["variables"])
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    values = {**defaults, "name": "build-corpus-run", "command": "prefect flow-run execute",
              "env": {"CORPUSFORGE_DATA": "s3://bucket/data"}, "labels": {"app": "corpusforge"}}
    manifest = apply_values(template["job_configuration"]["job_manifest"], values)
    manifest["spec"]["template"]["spec"]["containers"][0]["args"] = values["command"].split()
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": k, "value": v} for k, v in values["env"].items()]
    validate_k8s(manifest)
    assert manifest["kind"] == "Job" and manifest["apiVersion"] == "batch/v1"
    assert not any(k in json.dumps(template).lower() for k in ("aws_secret", "secret_access_key"))


def test_prefect_server_runs_on_postgres_with_the_password_from_a_secret():
    """The Prefect server every pod reports to (the ConfigMap's PREFECT_API_URL) keeps its
    runs in the PostgreSQL StatefulSet on a volume; the password is only a Secret reference."""
    server, db = named("Deployment", "prefect-server"), named("StatefulSet", "prefect-db")
    (c,) = containers(server)
    assert c["command"][:3] == ["prefect", "server", "start"]
    env = {e["name"]: e for e in c["env"]}
    value = lambda name: env[name]["value"]  # noqa: E731
    assert value("PREFECT_SERVER_DATABASE_DRIVER") == "postgresql+asyncpg"
    services = {d["metadata"]["name"]: d for d in by_kind("Service")}
    assert value("PREFECT_SERVER_DATABASE_HOST") in services
    db_service = services[value("PREFECT_SERVER_DATABASE_HOST")]
    assert db_service["spec"]["selector"].items() <= db["spec"]["template"]["metadata"]["labels"].items()
    assert int(value("PREFECT_SERVER_DATABASE_PORT")) == db_service["spec"]["ports"][0]["port"] == 5432
    (pg,) = containers(db)
    pg_env = {e["name"]: e for e in pg["env"]}
    assert value("PREFECT_SERVER_DATABASE_USER") == pg_env["POSTGRES_USER"]["value"]
    assert value("PREFECT_SERVER_DATABASE_NAME") == pg_env["POSTGRES_DB"]["value"]
    secret = {"secretKeyRef": {"name": "corpusforge-prefect-db", "key": "password"}}
    assert env["PREFECT_SERVER_DATABASE_PASSWORD"]["valueFrom"] == pg_env["POSTGRES_PASSWORD"]["valueFrom"] == secret
    assert not any("CONNECTION_URL" in name for name in env), "a connection URL would override the parts"
    assert db["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] in {m["name"] for m in pg["volumeMounts"]}
    api = by_kind("ConfigMap")[0]["data"]["PREFECT_API_URL"]
    web = services["prefect-server"]
    assert api == f"http://prefect-server:{web['spec']['ports'][0]['port']}/api"
    assert web["spec"]["selector"].items() <= server["spec"]["template"]["metadata"]["labels"].items()
