"""Credentials never travel as flow parameters.

The Prefect server stores every flow run's parameters in plain text, so a config that reaches a
flow holds no credential: they come from the environment, from Prefect Secret blocks named in the
config (``secret_block: NAME``, merged inside the flow run), or, from Python or the CLI, out of the
config itself (:func:`split_secrets` takes them out and :func:`held_secrets` puts them back in
memory, so they reach the Dask workers but not the server). A flow run whose parameters still
carry one refuses to start (:func:`refuse_inline_secrets`). See docs/deployments.md ("Credentials").
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel

from corpusforge.config import SECRET_BLOCK, is_secret

M = TypeVar("M", bound=BaseModel)
Path = tuple[Any, ...]

_HELD: contextvars.ContextVar[dict[Path, Any] | None] = contextvars.ContextVar("corpusforge_secrets", default=None)


def find_secrets(obj: Any, path: Path = ()) -> dict[Path, Any]:
    """Every non-empty credential (:func:`is_secret`), by its path in ``obj``."""
    found: dict[Path, Any] = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:  # a list's index is never a credential's name
        if is_secret((*path, k)) and v not in (None, "", {}, []):
            found[(*path, k)] = v
        else:
            found.update(find_secrets(v, (*path, k)))
    return found


def _parent(data: Any, path: Path) -> Any:
    """The mapping or list that holds the value at ``path``."""
    for k in path[:-1]:
        data = data[k]
    return data


def split_secrets(config: M) -> tuple[M, dict[Path, Any]]:
    """``config`` without its inline credentials, and the credentials by path."""
    data = config.model_dump(mode="json")
    found = find_secrets(data)
    if not found:
        return config, {}
    for path in found:
        del _parent(data, path)[path[-1]]
    return type(config).model_validate(data), found


def refuse_inline_secrets(config: BaseModel) -> None:
    """Raise when flow parameters carry credentials (they are stored by the server)."""
    found = find_secrets(config.model_dump(mode="json"))
    if found:
        where = ", ".join(".".join(str(p) for p in path) for path in found)
        raise ValueError(
            f"credentials in the flow's parameters ({where}): the Prefect server stores parameters "
            "in plain text. Put them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, or the "
            "deployment's job_variables.env), or in a Prefect Secret block named by `secret_block:` in the "
            "storage options")


@contextlib.contextmanager
def held_secrets(secrets: dict[Path, Any]) -> Iterator[None]:
    """Hold credentials taken out of a config for the flow run started in this context."""
    token = _HELD.set(dict(secrets) or None)
    try:
        yield
    finally:
        _HELD.reset(token)


def _load_block(name: str) -> dict[str, Any]:
    from prefect.blocks.system import Secret

    try:
        value = Secret.load(name).get()
    except ValueError as exc:
        raise ValueError(f"Prefect Secret block {name!r} (named by {SECRET_BLOCK}) not found: create it with "
                         f"Secret(value={{...}}).save({name!r}) or in the UI's Blocks page") from exc
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"Prefect Secret block {name!r} must hold a JSON object of storage options") from exc
    if not isinstance(value, dict):
        raise ValueError(f"Prefect Secret block {name!r} must hold a JSON object of storage options")
    return value


def _resolve_blocks(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = {k: _resolve_blocks(v) for k, v in obj.items() if k != SECRET_BLOCK}
        if obj.get(SECRET_BLOCK):
            for k, v in _load_block(str(obj[SECRET_BLOCK])).items():
                if isinstance(v, dict) and isinstance(out.get(k), dict):
                    out[k] = {**out[k], **v}
                else:
                    out[k] = v
        return out
    if isinstance(obj, list):
        return [_resolve_blocks(v) for v in obj]
    return obj


def has_secret_blocks(obj: Any) -> bool:
    if isinstance(obj, dict):
        return bool(obj.get(SECRET_BLOCK)) or any(has_secret_blocks(v) for v in obj.values())
    if isinstance(obj, list):
        return any(has_secret_blocks(v) for v in obj)
    return False


def with_secrets(config: M) -> M:
    """``config`` with held credentials put back and Secret blocks resolved (in memory only)."""
    held = _HELD.get()
    data = config.model_dump(mode="json")
    if not held and not has_secret_blocks(data):
        return config
    for path, value in (held or {}).items():
        _parent(data, path)[path[-1]] = value
    return type(config).model_validate(_resolve_blocks(data))
