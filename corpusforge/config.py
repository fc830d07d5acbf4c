"""The base of every flow's configuration: strict pydantic, loadable from YAML.

Strict (unknown keys are errors) so a misspelt setting fails loudly instead of silently
keeping its default; field titles and descriptions become the Prefect UI's form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import BaseModel, ConfigDict


class FlowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> Self:
        """Load a YAML file; keyword overrides that are not None (e.g. source, out) win."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)
