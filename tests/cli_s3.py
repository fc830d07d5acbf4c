"""Running the ``corpusforge`` console script as users do against the loopback S3 server:
credentials and endpoint given once in the child's environment (``AWS_*``), nothing of
them in a config file; and reading output trees back, locally or from S3, to compare."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from tests.operate import clean_env
from tests.s3server import ACCESS_KEY, SECRET_KEY

ROOT = Path(__file__).resolve().parent.parent


def corpusforge() -> str:
    return str(Path(sys.executable).parent / "corpusforge")


def s3_env(s3: dict, prefect_api: str, **override: str) -> dict[str, str]:
    """The child's environment: the S3 server's keys and endpoint, the session's Prefect API."""
    env = clean_env(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                    AWS_ENDPOINT_URL=s3["client_kwargs"]["endpoint_url"], AWS_DEFAULT_REGION="us-east-1",
                    PREFECT_API_URL=prefect_api, PYTHONPATH=str(ROOT))
    env.update(override)
    return env


def local_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def s3_tree(fs, uri: str) -> dict[str, bytes]:
    """Every file under ``uri`` (``s3://bucket/x`` or ``bucket/x``) by its path below it."""
    root = uri.removeprefix("s3://")
    return {p.split(root + "/", 1)[1]: fs.cat_file(p) for p in sorted(fs.find(root))}


def hashes(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
