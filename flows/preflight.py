"""Checks the CLI makes before any server or cluster starts, so that a user's mistake is
one clear line (and exit code 2) instead of a Prefect run's traceback.

Each check raises :class:`UserError` with what is wrong and what to do. They only read:
nothing is created or written, locally or on object storage, before they all pass. The
build's checks are :func:`check_build`; every other flow's are its module's ``preflight``,
made of the checks here (this module imports no flow).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from corpusforge.secrets import has_secret_blocks
from corpusforge.storage import is_remote, require_separate

PROBE_SECONDS = 20.0  # longest a storage probe may take before the storage counts as unreachable
CORPUS_HINT = "give the output root of a finished `corpusforge build`"  # what a flow's corpus must be


class UserError(Exception):
    """A mistake in what the user asked for; ``str()`` is the one line to print."""


@contextlib.contextmanager
def as_user_error() -> Iterator[None]:
    """A check's ValueError (an output root overlapping an input, an index too large) is
    the user's mistake: its message becomes the one line printed."""
    try:
        yield
    except ValueError as exc:
        raise UserError(str(exc)) from None


# ---- the config file ---------------------------------------------------------------------

def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names allowed next to ``loc`` (for 'unknown key' hints)."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        for candidate in (annotation, *getattr(annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
                break
        else:
            return []
    return sorted(getattr(current, "model_fields", {}))


def describe_validation(error: ValidationError, model: type[BaseModel]) -> str:
    """All of a pydantic error's problems on one line, with the allowed keys for an unknown one."""
    parts = []
    for e in error.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if e["type"] == "extra_forbidden":
            allowed = _field_names(model, loc)
            hint = f" (allowed here: {', '.join(allowed)})" if allowed else ""
            parts.append(f"unknown key {_where(loc)}{hint}")
        elif e["type"] == "missing":
            parts.append(f"{_where(loc)} is required")
        else:
            given = e.get("input")
            shown = f" (got {given!r})" if isinstance(given, (str, int, float, bool)) or given is None else ""
            parts.append(f"{_where(loc)}: {e['msg']}{shown}")
    return "; ".join(parts)


def load_config(cls: type[BaseModel], path: str | None, **overrides: Any) -> Any:
    """The config of a flow from a YAML file (and CLI overrides), or a one-line UserError."""
    data: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise UserError(f"config file {path} not found")
        try:
            loaded = yaml.safe_load(file.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise UserError(f"config {path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"config {path}: cannot read it ({exc})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise UserError(f"config {path}: expected a mapping of settings, got {type(loaded).__name__}")
        data = loaded or {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"config {path or '(command line)'}: {describe_validation(exc, cls)}") from None
    except ValueError as exc:  # a model validator's own message
        raise UserError(f"config {path or '(command line)'}: {exc}") from None


# ---- storage ----------------------------------------------------------------------------

PROBE_CONNECT_SECONDS = 5  # botocore's connect timeout for a probe (one attempt)
PROBE_READ_SECONDS = 10  # and its read timeout


def _probe_options(uri: str, options: dict[str, Any]) -> dict[str, Any]:
    """The user's options for a quick probe: an S3 endpoint that does not answer fails in
    seconds. Only options s3fs accepts: s3fs hands unknown ones to aiobotocore's session
    (a top-level ``retries`` refused every S3 URI), so timeouts and the single attempt go
    where botocore reads them, ``config_kwargs``."""
    if not uri.startswith(("s3://", "s3a://")):
        return dict(options)
    probe = dict(options)
    config = dict(probe.get("config_kwargs") or {})
    config.setdefault("connect_timeout", PROBE_CONNECT_SECONDS)
    config.setdefault("read_timeout", PROBE_READ_SECONDS)
    config.setdefault("retries", {"total_max_attempts": 1})
    probe["config_kwargs"] = config
    probe["skip_instance_cache"] = True
    return probe


def _probe(uri: str, options: dict[str, Any]) -> str:
    """'file', 'dir' or 'missing' for ``uri``; raises the storage client's error when unreachable."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri, **_probe_options(uri, options))
    if hasattr(fs, "retries"):
        fs.retries = 1  # s3fs's own retry loop (5 tries by default) around botocore's single attempt
    if fs.isfile(path):
        return "file"
    if fs.isdir(path):
        return "dir"
    return "missing"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: botocore keeps the transport's error in ``kwargs['error']``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        wrapped = getattr(e, "kwargs", None)
        todo += [e.__cause__, e.__context__, getattr(e, "os_error", None),
                 wrapped.get("error") if isinstance(wrapped, dict) else None]


def unreachable_reason(exc: BaseException) -> str:
    """Why a storage probe failed, in the words an operator acts on."""
    import errno
    import socket

    for e in _causes(exc):
        name = type(e).__name__
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return "connection refused"
        if isinstance(e, socket.gaierror):
            return f"host name not found ({e})"
        if name in ("ConnectTimeoutError", "ReadTimeoutError") or isinstance(e, TimeoutError):
            return f"timed out ({name})"
    for e in _causes(exc):
        if type(e).__name__ == "EndpointConnectionError":
            return f"cannot connect ({e})"
        if type(e).__name__ == "NoCredentialsError":
            return ("no credentials found (key and secret in storage_options, AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY in the environment, or anon: true for a public bucket)")
    return f"{type(exc).__name__}: {exc}"


def _bucket(uri: str) -> str:
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}"


def probe(uri: str, options: dict[str, Any], what: str) -> str:
    """Whether ``uri`` is a file, a folder or missing; UserError naming the cause (connection
    refused, timeout, access denied) when the storage cannot be used."""
    if has_secret_blocks(options):
        return "unknown"  # credentials come from the server's Secret block: checked in the run
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(_probe, uri, options).result(timeout=PROBE_SECONDS)
    except concurrent.futures.TimeoutError:
        raise UserError(f"cannot reach the storage of {what} {uri}: timed out after {PROBE_SECONDS:.0f} s: check "
                        "its endpoint (storage_options.client_kwargs.endpoint_url or AWS_ENDPOINT_URL) and the "
                        "network") from None
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except PermissionError as exc:
        raise UserError(f"{what} {uri}: access denied ({exc}): check the credentials (AWS_* in the "
                        "environment, key/secret or a secret_block in storage_options)") from None
    except ImportError as exc:
        raise UserError(f"{what} {uri}: no filesystem for this URI ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - anything else means: this storage is not reachable
        raise UserError(f"cannot reach the storage of {what} {uri}: {unreachable_reason(exc)}: check the "
                        "endpoint (storage_options.client_kwargs.endpoint_url or AWS_ENDPOINT_URL) and that "
                        "the server runs") from None
    finally:
        pool.shutdown(wait=False)  # a probe still hanging must not hold the CLI past its timeout


def require_exists(uri: str, options: dict[str, Any], what: str, hint: str) -> None:
    if probe(uri, options, what) == "missing":
        if is_remote(uri) and probe(_bucket(uri), options, what) == "missing":
            raise UserError(f"{what} {uri}: no such bucket {_bucket(uri)}")
        raise UserError(f"{what} {uri} does not exist: {hint}")


def require_writable_root(uri: str, options: dict[str, Any], what: str) -> None:
    """The output root can be created: locally, its nearest existing folder is writable;
    remotely, the bucket answers. Nothing is created here."""
    if is_remote(uri):
        if probe(_bucket(uri), options, what) == "missing":
            raise UserError(f"{what} {uri}: no such bucket {_bucket(uri)} (create it first)")
        return
    import os

    path = Path(uri).absolute()
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {uri} is a file, not a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what} {uri}: {existing} is not a writable folder")


# ---- models and weights -------------------------------------------------------------------

def _walk(obj: Any, name: str = "") -> Iterator[tuple[str, Any]]:
    """(field name, value) of ``obj`` and of everything in it, depth first; a list's items
    go under their list's field name."""
    yield name, obj
    if isinstance(obj, BaseModel):
        for field in type(obj).model_fields:
            yield from _walk(getattr(obj, field), field)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _walk(item, name)


def model_specs(obj: Any) -> list[Any]:
    """Every feature ModelSpec anywhere in a config."""
    from tasks.shared.features.config import ModelSpec

    return [value for _, value in _walk(obj) if isinstance(value, ModelSpec)]


def allowlists(obj: Any) -> set[str]:
    """Every SHA-256 of a ``torchscript_allowlist`` anywhere in a config, lower case."""
    return {str(v).lower() for name, v in _walk(obj)
            if name == "torchscript_allowlist" and not isinstance(v, (list, tuple))}


def check_models(config: BaseModel) -> None:
    """Every learned model has weights (or says random_init), local weights exist and have
    the pinned SHA-256, TorchScript only when allow-listed."""
    allowed = allowlists(config)
    for spec in model_specs(config):
        check_model(spec, allowed)


def check_model(spec: Any, allowed: set[str]) -> None:
    """:func:`check_models` of one spec, ``allowed`` the config's TorchScript allow-list."""
    from tasks.shared.features.weights import WeightsError, fetch_weights

    if spec.name == "wfd":
        return
    if spec.weights is None:
        if not spec.random_init:
            raise UserError(f"model {spec.model_id} has no weights: set weights {{uri, sha256}} to a pinned file "
                            "(see `corpusforge doctor`), or random_init: true for an untrained run")
        return
    w = spec.weights
    if w.format == "torchscript" and w.sha256.lower() not in allowed:
        raise UserError(f"weights {w.uri} of {spec.model_id} refused: TorchScript is executable code; add its "
                        "sha256 to torchscript_allowlist if you trust it")
    if is_remote(w.uri):
        require_exists(w.uri, w.storage_options, f"weights of {spec.model_id}", "check weights.uri")
        return
    try:
        fetch_weights(w)
    except WeightsError as exc:
        raise UserError(f"weights of {spec.model_id} refused: {exc}") from None
    except OSError as exc:
        raise UserError(f"weights of {spec.model_id}: cannot read {w.uri} ({exc})") from None


# ---- per command -------------------------------------------------------------------------

def check_build(config: Any) -> None:
    require_exists(config.source, config.input.storage_options, "source",
                   "give a metadata table (.parquet/.jsonl/.csv), a folder of tars or a folder of images")
    with as_user_error():
        require_separate(config.out, [("source", config.source)], "choose an --out outside it")
    require_writable_root(config.out, config.storage_options, "output root")
    require_records(config.source, config.input)
    require_fetch_identity(config)
    if config.previous is not None:
        check_corpus(config.previous, config.storage_options, "previous version")
    check_models(config)


def require_records(source: str, cfg: Any) -> None:
    """The source holds at least one input record: an empty one is the user's mistake, said
    before a server or cluster starts rather than as the ingest plan's traceback."""
    from tasks.ingest.sources import why_empty

    if has_secret_blocks(cfg.storage_options):
        return  # credentials come from the server's Secret block: checked in the run
    try:
        why = why_empty(source, cfg)
    except ValueError as exc:
        raise UserError(f"source {source}: {exc}") from None
    if why is not None:
        raise UserError(f"source {source} holds no input records ({why}): nothing to build; give a table "
                        "with rows, a folder of tars or a folder of images")


def require_fetch_identity(config: Any) -> None:
    """A URL-list source is fetched from other people's servers: the build says who it is (a
    User-Agent with a contact, as Wikimedia's policy asks) or does not start."""
    from tasks.ingest.sources import detect_kind, is_url_list

    if has_secret_blocks(config.input.storage_options) or config.input.kind not in ("auto", "table"):
        return
    try:
        kind, uri = detect_kind(config.source, config.input.storage_options)
        urls = kind == "table" and is_url_list(uri, config.input)
    except (OSError, ValueError) as exc:
        raise UserError(f"source {config.source}: {exc}") from None
    if urls and config.fetch.user_agent is None:
        raise UserError(f"source {config.source} is a URL list: set fetch.user_agent to a User-Agent that names "
                        "a contact, e.g. 'mybuild/1.0 (+https://example.org/bot; bot@example.org)'")
    if urls and config.fetch.store is not None:
        require_writable_root(config.fetch.store, config.fetch.storage_options, "fetch store")


def check_corpus(uri: str, options: dict[str, Any], what: str = "corpus") -> None:
    require_exists(uri, options, what, CORPUS_HINT)


def check_corpus_models(config: Any) -> None:
    """The checks of a flow that reads a built corpus (``config.corpus``) with feature models:
    the corpus exists, the models have weights."""
    check_corpus(config.corpus, config.storage_options)
    check_models(config)
