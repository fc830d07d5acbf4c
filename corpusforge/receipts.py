"""The identity every flow's receipt starts with, so any receipt says the same way which
flow wrote it, with which code and which settings (the fields: docs/receipt.md).

Receipts written before issue 23 spell the flow ``build_corpus``, ``near_dedup`` and
``prompt-qualification``, and a contamination receipt names its code version
``scanner_version``; a near-dedup version's report.html is titled by the flow name, so
"near_dedup" there became "near-dedup". No other byte of any output changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from corpusforge.config import is_secret
from corpusforge.version import code_version

BUILD_FLOW = "build-corpus"  # the build's flow name: readers tell a build's receipt by it


def redact(obj: Any, path: tuple[Any, ...] = ()) -> Any:
    """``obj`` with every credential (:func:`corpusforge.config.is_secret`: in storage options,
    an endpoint's key) replaced by '***'; other values, whatever their name, are kept."""
    if isinstance(obj, dict):
        return {k: "***" if is_secret((*path, k)) else redact(v, (*path, k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v, (*path, i)) for i, v in enumerate(obj)]
    return obj


def flow_receipt(flow: str, code_modules: Iterable[str], config: BaseModel, *,
                 config_exclude: Iterable[str] = (), **sections: Any) -> dict[str, Any]:
    """A flow's receipt: the identity fields (``corpusforge``, ``code_version``, ``config``), then ``sections``.
    ``config_exclude``: top-level config fields that never change an output and are left
    out (the Dask cluster of the scans), so equal runs on other clusters write equal receipts."""
    identity = {"corpusforge": flow, "code_version": code_version(*code_modules),
                "config": redact(config.model_dump(mode="json", exclude=set(config_exclude) or None))}
    if clash := identity.keys() & sections.keys():
        raise ValueError(f"receipt sections {sorted(clash)} would replace identity fields")
    return {**identity, **sections}
