"""The reports operators read: JSON results (``results``), HTML (pytest-html) with plots and
a verdict summary, run history with regression checks, a terminal summary, and secret
redaction everywhere.

The views (``terminal``, ``html``) render plain data (``model``: ``ReportState``,
``ReportOutcome``), never the plugin (``session.ReportPlugin``) that builds it.

May import: the wiring's state (stash keys), checks, parsers, access, settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_spark.report.redact import Redactor


def register_controller(config: pytest.Config) -> None:
    """Register the report plugins of the controller (the process that writes the report;
    from ``pytest_configure``, once settings are resolved): the JSON results, the report,
    the pytest-html hooks when pytest-html is active, and redaction."""
    from pytest_spark.report.html import HtmlHooks, html_active, report_title
    from pytest_spark.report.redact import Redactor
    from pytest_spark.report.results import RESULTS_KEY, ResultsRecorder, cluster_info
    from pytest_spark.report.session import ReportPlugin, validate
    from pytest_spark.state import RUN_DIR_KEY, SETTINGS_KEY

    settings = config.stash[SETTINGS_KEY]
    info, run_dir = cluster_info(settings), config.stash[RUN_DIR_KEY]
    recorder = ResultsRecorder(config, settings.results, info, run_dir)
    config.stash[RESULTS_KEY] = recorder
    config.pluginmanager.register(recorder, "spark.results")
    redactor = Redactor.from_settings(settings)
    validate(settings)
    plugin = ReportPlugin(config, settings, redactor)
    config.pluginmanager.register(plugin, "spark.report")
    if html_active(config):
        hooks = HtmlHooks(report_title(settings), redactor, plugin.outcome)
        config.pluginmanager.register(hooks, "spark.html")
    register_worker(config, redactor)


def register_worker(config: pytest.Config, redactor: Redactor | None = None) -> None:
    """Register redaction, the one report plugin of an xdist worker (which builds the
    reports it sends); last, so its tryfirst logreport hook runs before every other's."""
    from pytest_spark.report.redact import Redactor, Sanitizer
    from pytest_spark.state import SETTINGS_KEY

    redactor = redactor or Redactor.from_settings(config.stash[SETTINGS_KEY])
    config.pluginmanager.register(Sanitizer(redactor), "spark.redact")
