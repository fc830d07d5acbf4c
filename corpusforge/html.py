"""HTML pages from the Jinja2 templates in ``corpusforge/templates/``.

Every page corpusforge writes (the run report, the contamination report, the
near-duplicate calibration sheet) extends ``base.html``, which inlines the one
stylesheet ``style.css``: a page stays one self-contained file that can be mailed or
archived. Autoescaping is on, so a value reaches the page as text unless the caller
marks it :class:`markupsafe.Markup`; an undefined name is an error, not an empty string.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

__all__ = ["Markup", "render"]

_ENV = Environment(loader=PackageLoader("corpusforge", "templates"), autoescape=True, undefined=StrictUndefined,
                   trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render(template: str, **context: Any) -> str:
    """The page ``template`` (a file name in corpusforge/templates/) filled with ``context``."""
    return _ENV.get_template(template).render(**context)
