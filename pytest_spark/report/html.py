"""pytest-html hooks (registered only when pytest-html is active) and the HTML they add.

Every string that reaches the page goes through :func:`esc` (pytest-html inserts extras,
summary parts, table cells and environment values as raw HTML), after redaction.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any

import pytest

from pytest_spark.report.accuracy import accuracy_html
from pytest_spark.report.figures import key_figures
from pytest_spark.report.results import CATEGORY_PROP, FINDING_PROP, NODE_PROP, category_of
from pytest_spark.report.summary import measured_expected, remediation

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

STYLE = """<style>
body{display:flex;flex-direction:column;align-items:stretch}
body>h1,body>p{order:0}
body>.summary{order:1}
body>#environment-header,body>#environment{order:2;align-self:flex-start}
body>#results-table{order:3}
body>footer{order:4}
#spark-report{margin:0 0 12px 0;max-width:1200px;color:#333}
#environment{margin-bottom:16px}
#spark-report h3{margin:14px 0 6px 0;font-size:14px}
.spark-banner{padding:8px 12px;margin:6px 0;border-radius:3px;font-size:14px;font-weight:bold}
.spark-banner.spark-fail{background:#f2dede;color:#a94442;border:1px solid #ebccd1}
.spark-banner.spark-pass{background:#dff0d8;color:#3c763d;border:1px solid #d6e9c6}
.spark-banner.spark-warn{background:#fcf8e3;color:#8a6d3b;border:1px solid #faebcc}
.spark-banner.spark-none,.spark-banner.spark-skip{background:#f5f5f5;color:#555}
.spark-table{border-collapse:collapse;margin:4px 0}
.spark-table th,.spark-table td{border:1px solid #ddd;padding:4px 8px;text-align:left}
.spark-table th{background:#f6f6f6}
td.spark-fail{background:#f2dede;color:#a94442;font-weight:bold}
td.spark-warn{background:#fcf8e3;color:#8a6d3b}
td.spark-pass{background:#dff0d8;color:#3c763d}
td.spark-skip{background:#f5f5f5;color:#777}
td.spark-none{color:#bbb}
.spark-plot{margin:8px 0}
.spark-plot img{max-width:100%;border:1px solid #eee}
.spark-plot figcaption,.spark-noplot{color:#666;font-style:italic}
.spark-check{margin:4px 0 8px 0}
.spark-check pre{white-space:pre-wrap;background:#fafafa;border:1px solid #eee;padding:6px;
 max-height:420px;overflow:auto}
.spark-fix{background:#fcf8e3;border-left:4px solid #f0ad4e;padding:6px 10px;margin:6px 0}
</style>"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def metadata_value(value: Any, escape: bool) -> Any:
    """An environment-table value: pytest-html renders these as raw HTML."""
    if not escape:
        return value
    if isinstance(value, dict):
        return {esc(k): esc(v) for k, v in value.items()}
    return esc(value)


def _finding(report: pytest.TestReport) -> dict[str, Any]:
    props = dict(report.user_properties)
    finding = props.get(FINDING_PROP)
    return finding if isinstance(finding, dict) else {}


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


def _pre(text: str) -> str:
    if len(text) > EVIDENCE_CHARS:
        text = text[:EVIDENCE_CHARS] + f"\n... ({len(text) - EVIDENCE_CHARS} more characters)"
    return f"<pre>{esc(text)}</pre>"


def _message_html(message: str) -> str:
    """The message, with each node's log tail (readiness failures) in its own block."""
    head, *tails = message.split("\n--- ")
    parts = [_pre(head)]
    for tail in tails:
        title, _, body = tail.partition("\n")
        parts.append(
            f"<details open><summary>{esc(title.strip(' -'))}</summary>{_pre(body)}</details>"
        )
    return "".join(parts)


def check_html(report: pytest.TestReport) -> str | None:
    """The block shown under a check's row: verdict, figures, message, fix, evidence."""
    finding = _finding(report)
    failed = report.failed
    if not finding and not failed:
        return None
    level = "fail" if failed else str(finding.get("level") or "pass")
    figures = measured_expected(finding)
    where = " ".join(x for x in (_node(report), _category(report)) if x)
    head = f"<b>{VERDICT_TEXT.get(level, level.upper())}</b>"
    if where:
        head += f" {esc(where)}"
    if figures:
        head += f" &middot; measured / expected: {esc(figures)}"
    parts = [f'<div class="spark-check spark-{esc(level)}"><div>{head}</div>']
    message = _message(report) if failed else str(finding.get("message") or "")
    if message:
        parts.append(_message_html(message))
    if failed or level == "warn":
        fix = remediation(message)
        if fix:
            parts.append(f'<div class="spark-fix"><b>What usually fixes it:</b> {esc(fix)}</div>')
        evidence = finding.get("evidence") or {}
        if isinstance(evidence, dict):
            for name, text in evidence.items():
                text = text if isinstance(text, str) else json.dumps(text, indent=1)
                parts.append(
                    f"<details open><summary>evidence: {esc(name)}</summary>{_pre(text)}</details>"
                )
    extras = {k.removeprefix("spark_data:") for k, _ in report.user_properties}
    plotted = sorted(extras & set(FIGURE_KEYS))
    if plotted:
        parts.append(
            f"<div>figures recorded ({esc(', '.join(plotted))}): plotted in the "
            "summary at the top</div>"
        )
    parts.append("</div>")
    return "".join(parts)


def _verdicts_html(state: ReportState) -> str:
    table = state.table
    head = "".join(f"<th>{esc(n)}</th>" for n in table.nodes)
    rows = []
    for category in table.categories:
        total = table.category(category)
        cells = [f'<td class="spark-{total.verdict}"><b>{esc(category)}</b></td>']
        for node in table.nodes:
            cell = table.cell(category, node)
            label = VERDICT_TEXT[cell.verdict]
            detail = "" if cell.verdict == "none" else f"<br><small>{esc(cell.text())}</small>"
            cells.append(f'<td class="spark-{cell.verdict}">{label}{detail}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<table id="spark-verdicts" class="spark-table"><tr><th>category</th>{head}</tr>'
        f"{''.join(rows)}</table>"
    )


def _deltas_html(state: ReportState) -> str:
    comparison = state.comparison
    if comparison is None:
        return (
            f'<p class="spark-noplot">Run history: {esc(state.compare_note)}</p>'
            if state.compare_note
            else ""
        )
    rows = []
    for d in comparison.deltas:
        status = "fail" if d.regressed else "pass" if d.limit is not None else "none"
        pct = "n/a" if d.pct is None else f"{d.pct:+.1f}%"
        limit = "-" if d.limit is None else f"{d.limit:g}% ({d.better} is better)"
        verdict = "REGRESSED" if d.regressed else "ok" if d.limit is not None else ""
        rows.append(
            f"<tr><td>{esc(d.name)}</td><td>{d.old:.4g}</td><td>{d.new:.4g}</td>"
            f"<td>{esc(d.unit)}</td><td>{pct}</td><td>{esc(limit)}</td>"
            f'<td class="spark-{status}">{verdict}</td></tr>'
        )
    missing = (
        f"<p>Not measured in this run: {esc(', '.join(comparison.missing))}</p>"
        if comparison.missing
        else ""
    )
    return (
        f"<h3>Compared with {esc(comparison.baseline_desc)}</h3>"
        '<table id="spark-deltas" class="spark-table"><tr><th>figure</th><th>before</th>'
        "<th>now</th><th>unit</th><th>change</th><th>fail limit</th><th></th></tr>"
        f"{''.join(rows)}</table>{missing}"
    )


def _plots_html(state: ReportState) -> str:
    parts = ["<h3>Plots</h3>"]
    for plot in state.plots:
        if plot.uri:
            parts.append(
                f'<figure class="spark-plot" id="spark-plot-{esc(plot.key)}">'
                f'<img alt="{esc(plot.title)}" src="{esc(plot.uri)}">'
                f"<figcaption>{esc(plot.title)}: {esc(plot.note)}</figcaption>"
                "</figure>"
            )
        else:
            parts.append(
                f'<p class="spark-noplot" id="spark-plot-{esc(plot.key)}">'
                f"{esc(plot.title)}: {esc(plot.note)}</p>"
            )
    return "".join(parts)


def _failing(doc: dict[str, Any]) -> str:
    """``: in accuracy, tool_calls; first test_x: headline`` for the FAIL banner."""
    bad = [c for c in doc.get("checks") or () if c.get("outcome") in ("failed", "error")]
    if not bad:
        return ""
    categories = ", ".join(dict.fromkeys(str(c.get("category") or "uncategorised") for c in bad))
    first = bad[0]
    name = str(first.get("nodeid", "")).split("::", 1)[-1]
    headline = next(
        (ln.strip() for ln in str(first.get("message") or "").splitlines() if ln.strip()), ""
    )
    if len(headline) > 200:
        headline = headline[:197] + "..."
    return f" in {categories}; first: {name}: {headline}"


def summary_html(state: ReportState) -> str:
    overall = state.table.overall
    counts = state.table
    failed = sum(c.counts["failed"] + c.counts["error"] for c in counts.cells.values())
    total = sum(sum(c.counts.values()) - c.counts["warn"] for c in counts.cells.values())
    banners = []
    if state.interrupted:
        banners.append(("warn", "Session INTERRUPTED: the results below are partial"))
    verdict = {
        "fail": f"Verdict: FAIL ({failed} of {total} checks failed{_failing(state.doc)})",
        "warn": f"Verdict: PASS with warnings ({total} checks)",
        "pass": f"Verdict: PASS ({total} checks)",
        "skip": f"Verdict: nothing checked ({total} checks skipped)",
        "none": "Verdict: no suite checks ran",
    }[overall]
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
    parts = ['<div id="spark-report">', STYLE]
    parts += [f'<div class="spark-banner spark-{kind}">{esc(text)}</div>' for kind, text in banners]
    parts.append("<h3>Verdict per category and node</h3>")
    parts.append(_verdicts_html(state))
    figures = "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in key_figures(state.figures)
    )
    parts.append(
        f'<h3>Key figures</h3><table id="spark-figures" class="spark-table">{figures}</table>'
    )
    parts.append(accuracy_html(state.doc.get("accuracy"), esc))
    parts.append(_deltas_html(state))
    parts.append(_plots_html(state))
    parts.append("</div>")
    return "".join(parts)


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
            prefix.append(f'<div class="spark-banner spark-fail">{esc(outcome.error)}</div>')
        state = outcome.state
        if state is not None and state.active:
            prefix.append(self.redactor.text(summary_html(state)))

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells[2:2] = [
            '<th class="sortable" data-column-type="node">Node</th>',
            '<th class="sortable" data-column-type="category">Category</th>',
            "<th>Measured / expected</th>",
        ]

    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        test_id = report.nodeid + (f"::{report.when}" if report.when != "call" else "")
        for i, cell in enumerate(cells):
            if cell.startswith('<td class="col-testId">'):
                cells[i] = f'<td class="col-testId">{esc(test_id)}</td>'
        finding = _finding(report)
        level = "fail" if report.failed else str(finding.get("level") or "")
        figures = measured_expected(finding)
        cells[2:2] = [
            f'<td class="col-node">{esc(_node(report))}</td>',
            f'<td class="col-category">{esc(_category(report))}</td>',
            f'<td class="col-figures spark-{esc(level or "none")}">{esc(figures)}</td>',
        ]

    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        """A skip's log is its reason and where it was said, not pytest's raw
        ``(path, line, 'Skipped: ...')`` tuple."""
        longrepr = report.longrepr
        if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3 and data:
            path, line, reason = longrepr
            reason = str(reason).removeprefix("Skipped: ")
            data[0] = self.redactor.text(f"{esc(reason)}\n({esc(path)}:{esc(line)})\n")

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
