"""The base of every configuration model: strict pydantic, loadable from YAML, old keys mapped;
and which of a config's values are credentials (:func:`is_secret`).

Strict (unknown keys are errors) so a misspelt setting fails loudly instead of silently
keeping its default; field titles and descriptions become the Prefect UI's form. A model
that renamed or moved a key lists it in ``renamed_keys``, one that made a key a module
constant lists it in ``retired_keys``: a config file written with the old key still loads
to the same model (a retired key only with the value now fixed), and the old key is named
once per process in a one-line deprecation message.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger(__name__)
_warned: set[str] = set()

SECRET_BLOCK = "secret_block"  # names a Prefect Secret block in storage options (corpusforge.secrets)
# Credentials are options of a storage (s3fs's key, secret and token, botocore's aws_*, in any
# ``*storage_options`` mapping) or an endpoint's api_key. Elsewhere these words name other
# things (``input.columns.key``, a judge's ``max_tokens``), which are not secrets.
_SECRET_WORDS = ("secret", "password", "token", "key_id", "access_key", "credential", "session_key")
_OPTIONS = "storage_options"
_CREDENTIALS = {"api_key"}


def is_secret(path: tuple[Any, ...]) -> bool:
    """True when the value at ``path`` in a config dumped as JSON holds a credential: what
    receipts redact (:func:`corpusforge.receipts.redact`) and flow parameters must not carry
    (:mod:`corpusforge.secrets`)."""
    name = str(path[-1]).lower()
    if name in _CREDENTIALS:
        return True
    in_options = any(str(p).endswith(_OPTIONS) for p in path[:-1])
    return in_options and name != SECRET_BLOCK and (name == "key" or any(w in name for w in _SECRET_WORDS))


def _move(data: dict[str, Any], old: str, new: str) -> bool:
    """Move the value at dotted path ``old`` to dotted path ``new`` (copying the dicts on the
    way, never editing the caller's); False when ``old`` is absent."""
    *parents, leaf = old.split(".")
    node = data
    for key in parents:
        node = node.get(key)
        if not isinstance(node, dict):
            return False
    if leaf not in node:
        return False
    # copy the old path's dicts, then take the value out
    node = data
    for key in parents:
        node[key] = dict(node[key])
        node = node[key]
    value = node.pop(leaf)
    *parents, leaf = new.split(".")
    node = data
    for key in parents:
        child = node.get(key)
        node[key] = dict(child) if isinstance(child, dict) else {} if child is None else child
        node = node[key]
        if not isinstance(node, dict):  # the new section was given as a model: nothing to merge into
            raise ValueError(f"{old} is deprecated; set {new} instead")
    if leaf in node:
        raise ValueError(f"both {old} (deprecated) and {new} are set; keep only {new}")
    node[leaf] = value
    return True


# A cosine similarity threshold: a value outside [-1, 1] no pair can reach (or every pair passes),
# so it is a config error, not a setting.
Similarity = Annotated[float, Field(ge=-1, le=1)]


def _deprecated(message: str) -> None:
    """Log a deprecation line, once per process."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class StrictModel(BaseModel):
    """Every config model of the project: unknown keys are errors; renamed keys still load."""

    model_config = ConfigDict(extra="forbid")

    config_section: ClassVar[str] = ""
    """Where this model sits in a config file (e.g. ``near_dedup``), for deprecation messages."""
    renamed_keys: ClassVar[dict[str, str]] = {}
    """Old dotted key → new dotted key with the same meaning, relative to this model."""
    retired_keys: ClassVar[dict[str, Any]] = {}
    """Key that is no longer a setting → the value now fixed in code."""

    @model_validator(mode="before")
    @classmethod
    def _map_old_keys(cls, data: Any) -> Any:
        if not (cls.renamed_keys or cls.retired_keys) or not isinstance(data, dict):
            return data
        data = dict(data)
        prefix = f"{cls.config_section}." if cls.config_section else ""
        for old, new in cls.renamed_keys.items():
            if _move(data, old, new):
                _deprecated(f"config: {prefix}{old} is deprecated; use {prefix}{new} (same meaning)")
        for old, fixed in cls.retired_keys.items():
            if old in data:
                if data.pop(old) != fixed:
                    raise ValueError(f"{prefix}{old} is no longer a setting: it is fixed at {fixed!r}")
                _deprecated(f"config: {prefix}{old} is deprecated; it is no longer a setting (fixed at {fixed!r})")
        return data


class FlowConfig(StrictModel):
    """A flow's parameters: loadable from a YAML file."""

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> Self:
        """Load a YAML file; keyword overrides that are not None (e.g. source, out) win."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)
