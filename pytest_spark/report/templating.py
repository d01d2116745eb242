"""The report's HTML, rendered from jinja2 templates (``templates/``) with autoescape on:
every value that reaches the page is escaped by default; only markup that a template
rendered (a ``Markup`` string) goes in as it is."""

from __future__ import annotations

from functools import cache
from typing import Any

import jinja2
from markupsafe import Markup


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pytest_spark.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )


def render(name: str, **context: Any) -> str:
    """Template ``name`` rendered with ``context``, as one string of HTML."""
    return environment().get_template(name).render(**context).strip()


def fragment(macro: str, *args: Any) -> Markup:
    """One macro of ``fragments.html`` (a table cell, a banner, a value as text)."""
    module = environment().get_template("fragments.html").module
    result: Markup = getattr(module, macro)(*args)
    return Markup(result)
