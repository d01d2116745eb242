"""The reports operators read: JSON results (``results``), HTML (pytest-html) with plots and
a verdict summary, run history with regression checks, a terminal summary, and secret
redaction everywhere.

May import: the wiring's state (stash keys), checks, parsers, access, settings.
"""

from __future__ import annotations

import pytest


def html_active(config: pytest.Config) -> bool:
    """pytest-html is loaded and writes a report in this session (``--html``)."""
    return bool(config.pluginmanager.hasplugin("html") and config.getoption("htmlpath", None))


def register(config: pytest.Config) -> None:
    """Register the report plugins (from ``pytest_configure``, once settings are resolved).

    The redaction plugin runs everywhere (xdist workers build the reports); the rest only
    on the controller; the pytest-html hooks only when pytest-html is active.
    """
    from pytest_spark.report.redact import Redactor, Sanitizer
    from pytest_spark.report.session import ReportPlugin, validate
    from pytest_spark.state import SETTINGS_KEY

    settings = config.stash[SETTINGS_KEY]
    redactor = Redactor.from_settings(settings)
    if not hasattr(config, "workerinput"):
        validate(settings)
        plugin = ReportPlugin(config, settings, redactor)
        config.pluginmanager.register(plugin, "spark.report")
        if html_active(config):
            from pytest_spark.report.html import HtmlHooks

            config.pluginmanager.register(HtmlHooks(plugin), "spark.html")
    # Last, so its tryfirst logreport hook runs before every other plugin's.
    config.pluginmanager.register(Sanitizer(redactor), "spark.redact")
