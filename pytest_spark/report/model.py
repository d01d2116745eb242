"""What the report's outputs (JSON ``report``, terminal summary, HTML) show: plain data,
built once per session by :class:`pytest_spark.report.session.ReportPlugin`. The views take
this, not the plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.report.figures import Figures, Metric, key_figures
from pytest_spark.report.history import Comparison
from pytest_spark.report.plots import Plot, all_plots
from pytest_spark.report.summary import VerdictTable

INTERRUPTED = int(pytest.ExitCode.INTERRUPTED)


@dataclass
class ReportState:
    """Everything the HTML, terminal and JSON outputs show; built once per session."""

    doc: dict[str, Any]  # the redacted results document
    figures: Figures
    metrics: dict[str, Metric]
    table: VerdictTable
    identity: dict[str, Any]
    commit: dict[str, Any] | None
    exitstatus: int
    environment: dict[str, Any] = field(default_factory=dict)
    history_path: Path | None = None
    history_note: str = ""
    history_where: str = ""  # why the history is where it is, when the default chose it
    comparison: Comparison | None = None
    compare_note: str = ""

    @property
    def interrupted(self) -> bool:
        return self.exitstatus == INTERRUPTED

    @property
    def active(self) -> bool:
        """Anything to report (suite checks ran, or a cluster was given)?"""
        return bool(self.doc.get("checks")) or bool((self.doc.get("cluster") or {}).get("head"))

    @property
    def regression_message(self) -> str:
        return self.comparison.message() if self.comparison else ""

    @cached_property
    def plots(self) -> list[Plot]:
        return all_plots(self.figures)

    def to_json(self) -> dict[str, Any]:
        return {
            "figures": {name: m.to_dict() for name, m in sorted(self.metrics.items())},
            # as the terminal and the HTML show them; "not measured (attached)" included
            "key_figures": dict(key_figures(self.figures)),
            "cluster_identity": self.identity,
            "history": str(self.history_path) if self.history_path else None,
            "history_note": self.history_note or None,
            "compare": self.comparison.to_dict() if self.comparison else None,
            "compare_note": self.compare_note or None,
        }


@dataclass
class ReportOutcome:
    """The end of the session as the views render it: the report (``state``), or the error
    that stopped building it. Both None until the plugin's ``pytest_sessionfinish``."""

    state: ReportState | None = None
    error: str | None = None
