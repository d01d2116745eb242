"""The reports operators read: JSON results (``results``), HTML (pytest-html) with plots and
a verdict summary, run history with regression checks, a terminal summary, and secret
redaction everywhere.

The views (``terminal``, ``html``) render plain data (``model``: ``ReportState``,
``ReportOutcome``), never the plugin (``session.ReportPlugin``) that builds it.

May import: the wiring's state (stash keys), checks, parsers, access, settings.
"""

from __future__ import annotations

import pytest


def register(config: pytest.Config) -> None:
    """Register the report plugins (from ``pytest_configure``, once settings are resolved).

    The redaction plugin runs everywhere (xdist workers build the reports); the rest only
    on the controller; the pytest-html hooks only when pytest-html is active.
    """
    from pytest_spark.report.html import HtmlHooks, html_active, report_title
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
            hooks = HtmlHooks(report_title(settings), redactor, plugin.outcome)
            config.pluginmanager.register(hooks, "spark.html")
    # Last, so its tryfirst logreport hook runs before every other plugin's.
    config.pluginmanager.register(Sanitizer(redactor), "spark.redact")
