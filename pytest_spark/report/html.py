"""pytest-html hooks (registered only when pytest-html is active) and the HTML they add.

pytest-html inserts extras, summary parts, table cells and environment values as raw HTML:
each is rendered from a jinja2 template (``templates/``, autoescape on), so every value is
escaped by default, and redacted after rendering.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from markupsafe import Markup

from pytest_spark.report.accuracy import accuracy_html
from pytest_spark.report.depth import depth_html
from pytest_spark.report.figures import key_figures
from pytest_spark.report.results import (
    CATEGORY_PROP,
    NODE_PROP,
    category_of,
    finding_of,
    notes_of,
)
from pytest_spark.report.summary import measured_expected, remediation, verdict_line
from pytest_spark.report.templating import fragment, render

if TYPE_CHECKING:
    from pytest_spark.report.model import ReportOutcome, ReportState
    from pytest_spark.report.redact import Redactor
    from pytest_spark.settings.resolve import Settings

EVIDENCE_CHARS = 20000
VERDICT_TEXT = {"fail": "FAIL", "warn": "WARN", "pass": "PASS", "skip": "SKIP", "none": "-"}
FIGURE_KEYS = (
    "busbw_series",
    "latency_series",
    "sweep",
    "throughput_sweep",
    "level",
    "open_loop",
    "startup_timeline",
)

HEADER_CELLS = (
    '<th class="sortable" data-column-type="node">Node</th>',
    '<th class="sortable" data-column-type="category">Category</th>',
    "<th>Measured / expected</th>",
)


def metadata_value(value: Any, escape: bool) -> Any:
    """An environment-table value: pytest-html renders these as raw HTML."""
    if not escape:
        return value
    if isinstance(value, dict):
        return {fragment("text", k): fragment("text", v) for k, v in value.items()}
    return fragment("text", value)


def _finding(report: pytest.TestReport) -> dict[str, Any]:
    return finding_of(dict(report.user_properties))


def _category(report: Any) -> str:
    props = dict(getattr(report, "user_properties", ()))
    return str(props.get(CATEGORY_PROP) or category_of(report.keywords) or "")


def _node(report: pytest.TestReport) -> str:
    return str(_finding(report).get("node") or dict(report.user_properties).get(NODE_PROP) or "")


def _message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).removeprefix("Failed: ")
    return str(longrepr or "")[-4000:]


def _clip(text: str) -> str:
    if len(text) > EVIDENCE_CHARS:
        text = text[:EVIDENCE_CHARS] + f"\n... ({len(text) - EVIDENCE_CHARS} more characters)"
    return text


def check_html(report: pytest.TestReport) -> str | None:
    """The block shown under a check's row: verdict, figures, message (each node's log
    tail of a readiness failure in its own block), notes, fix, evidence."""
    finding = _finding(report)
    failed = report.failed
    notes = notes_of(dict(report.user_properties))
    if not finding and not failed and not notes:
        return None
    level = "fail" if failed else str(finding.get("level") or "pass")
    message = _message(report) if failed else str(finding.get("message") or "")
    head, *tails = message.split("\n--- ")
    fix = remediation(message) if message and (failed or level == "warn") else ""
    evidence = finding.get("evidence") if failed or level == "warn" else None
    extras = {k.removeprefix("spark_data:") for k, _ in report.user_properties}
    return render(
        "check.html",
        level=level,
        verdict=VERDICT_TEXT.get(level, level.upper()),
        where=" ".join(x for x in (_node(report), _category(report)) if x),
        figures=measured_expected({**finding, "level": level}),
        message_head=_clip(head) if message else None,
        message_tails=[
            (title.strip(" -"), _clip(body))
            for title, _, body in (tail.partition("\n") for tail in tails)
        ],
        fix=fix,
        evidence=[
            (name, _clip(text if isinstance(text, str) else json.dumps(text, indent=1)))
            for name, text in (evidence.items() if isinstance(evidence, dict) else ())
        ],
        plotted=sorted(extras & set(FIGURE_KEYS)),
        notes=notes,
    )


def _verdicts(state: ReportState) -> list[dict[str, Any]]:
    table = state.table
    rows = []
    for category in table.categories:
        cells = []
        for node in table.nodes:
            cell = table.cell(category, node)
            cells.append(
                {
                    "verdict": cell.verdict,
                    "label": VERDICT_TEXT[cell.verdict],
                    "detail": "" if cell.verdict == "none" else cell.text(),
                }
            )
        rows.append(
            {"category": category, "verdict": table.category(category).verdict, "cells": cells}
        )
    return rows


def _comparison(state: ReportState) -> dict[str, Any] | None:
    comparison = state.comparison
    if comparison is None:
        return None
    deltas = []
    for d in comparison.deltas:
        deltas.append(
            {
                "name": d.name,
                "old": f"{d.old:.4g}",
                "new": f"{d.new:.4g}",
                "unit": d.unit,
                "change": "n/a" if d.pct is None else f"{d.pct:+.1f}%",
                "limit": "-" if d.limit is None else f"{d.limit:g}% ({d.better} is better)",
                "status": "fail" if d.regressed else "pass" if d.limit is not None else "none",
                "verdict": "REGRESSED" if d.regressed else "ok" if d.limit is not None else "",
            }
        )
    return {
        "baseline": comparison.baseline_desc,
        "deltas": deltas,
        "missing": list(comparison.missing),
    }


def summary_html(state: ReportState) -> str:
    overall = state.table.overall
    banners = []
    if state.interrupted:
        banners.append(("warn", "Session INTERRUPTED: the results below are partial"))
    verdict = verdict_line(state.doc, state.table)
    banners.append((overall, verdict))
    if state.regression_message:
        banners.append(("fail", f"REGRESSION (session failed): {state.regression_message}"))
    policy = str(state.environment.get("SSH host-key policy", ""))
    if policy.startswith("OFF"):
        banners.append(("fail", f"SSH host keys NOT checked: {policy}"))
    if (state.doc.get("cluster") or {}).get("sim"):
        banners.append(
            ("none", "Cluster: sparksim, the embedded simulated cluster (bandwidths scaled 1/200)")
        )
    return render(
        "summary.html",
        banners=banners,
        nodes=state.table.nodes,
        verdicts=_verdicts(state),
        figures=key_figures(state.figures),
        accuracy=Markup(accuracy_html(state.doc.get("accuracy"))),
        depth=Markup(depth_html(state.doc)),
        comparison=_comparison(state),
        history_note=state.compare_note,
        plots=state.plots,
    )


def html_active(config: pytest.Config) -> bool:
    """pytest-html is loaded and writes a report in this session (``--html``)."""
    return bool(config.pluginmanager.hasplugin("html") and config.getoption("htmlpath", None))


def report_title(settings: Settings) -> str | None:
    """The page title: the cluster under test (None: pytest-html's own)."""
    target = "sparksim" if settings.sim else settings.head or settings.api_url or ""
    return f"DGX Spark cluster report: {target}" if target else None


class HtmlHooks:
    """pytest-html hooks; only registered when pytest-html is active (controller). They
    render ``outcome`` (filled in at the end of the session) through ``redactor``."""

    def __init__(self, title: str | None, redactor: Redactor, outcome: ReportOutcome) -> None:
        self.title = title
        self.redactor = redactor
        self.outcome = outcome

    def pytest_html_report_title(self, report: Any) -> None:
        if self.title:
            report.title = self.redactor.text(self.title)

    def pytest_html_results_summary(
        self, prefix: list[str], summary: list[str], postfix: list[str], session: pytest.Session
    ) -> None:
        outcome = self.outcome
        if outcome.error:
            prefix.append(fragment("banner", "fail", outcome.error))
        state = outcome.state
        if state is not None and state.active:
            prefix.append(self.redactor.text(summary_html(state)))

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells[2:2] = HEADER_CELLS

    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        test_id = report.nodeid + (f"::{report.when}" if report.when != "call" else "")
        for i, cell in enumerate(cells):
            if cell.startswith('<td class="col-testId">'):
                cells[i] = fragment("test_id_cell", test_id)
        finding = _finding(report)
        level = "fail" if report.failed else str(finding.get("level") or "")
        figures = measured_expected({**finding, "level": level or None})
        cells[2:2] = [
            fragment("node_cell", _node(report)),
            fragment("category_cell", _category(report)),
            fragment("figures_cell", level or "none", figures),
        ]

    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        """A skip's log is its reason and where it was said, not pytest's raw
        ``(path, line, 'Skipped: ...')`` tuple."""
        longrepr = report.longrepr
        if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3 and data:
            path, line, reason = longrepr
            reason = str(reason).removeprefix("Skipped: ")
            data[0] = self.redactor.text(fragment("skip_log", reason, path, line))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Attach the check's block to its report (after redaction: the Sanitizer's
        tryfirst hook was registered later, so it runs first)."""
        if report.when != "call" and not report.failed:
            return
        block = check_html(report)
        if block is None:
            return
        extras = getattr(report, "extras", None)
        if not isinstance(extras, list):
            extras = []
            report.extras = extras  # type: ignore[attr-defined]
        extras.append(
            {
                "name": "spark check",
                "format_type": "html",
                "content": self.redactor.text(block),
                "mime_type": None,
                "extension": None,
            }
        )
