"""The terminal summary: verdict per category and node, key figures, regressions, paths;
the verdict line last, after pytest's own; the short test summary's lines led by what failed
where (node, measured, expected)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_spark.report.figures import key_figures
from pytest_spark.report.results import CATEGORY_PROP, category_of, finding_of
from pytest_spark.report.summary import first_line, short_headline, verdict_line

if TYPE_CHECKING:
    from pytest_spark.report.model import ReportOutcome
    from pytest_spark.report.redact import Redactor

COLOR = {
    "fail": {"red": True, "bold": True},
    "warn": {"yellow": True},
    "pass": {"green": True},
    "skip": {"yellow": True},
    "none": {},
}


def html_path(config: pytest.Config) -> Path | None:
    raw = getattr(config.option, "htmlpath", None)
    if not raw:
        return None
    return Path.cwd() / Path(os.path.expandvars(raw)).expanduser()


def terminal_width(tr: Any) -> int:
    """The terminal's width as pytest's own lines use it (80 in a pipe, COLUMNS honoured)."""
    writer = getattr(tr, "_tw", None)
    width = getattr(writer, "fullwidth", None)
    return width if isinstance(width, int) and width > 20 else 80


def figures_lines(figures: list[tuple[str, str]], width: int) -> list[str]:
    """``figures: a | b | c`` on one line when it fits the terminal, else one figure a line
    under the first (or, none measured, one line naming them)."""
    items = [f"{k} {v}" for k, v in figures]
    one = "figures: " + " | ".join(items)
    if len(one) <= width or len(items) < 2:
        return [one]
    if all(v.startswith("not measured") for _, v in figures):
        return [f"figures: not measured ({', '.join(k for k, _ in figures)})"]
    return ["figures: " + items[0], *("         " + item for item in items[1:])]


def write_summary(
    tr: Any, outcome: ReportOutcome, redactor: Redactor, results: Path | None, config: pytest.Config
) -> None:
    """The summary of ``outcome`` (``results``: the results JSON path, if written)."""
    if config.option.collectonly:  # nothing ran: no verdicts, no figures to show
        return
    state = outcome.state
    if outcome.error:
        tr.write_sep("-", "pytest-dgx-spark summary", red=True)
        tr.write_line(outcome.error, red=True)
    if state is None or not state.active:
        return
    redact = redactor.text
    tr.write_sep("-", "pytest-dgx-spark summary")
    if state.interrupted:
        tr.write_line("session interrupted: partial results", yellow=True, bold=True)
    table = state.table
    rows = [
        c for c in table.categories if any(table.cell(c, n).verdict != "none" for n in table.nodes)
    ]
    width = (
        max(
            [len(n) for n in table.nodes]
            + [12]
            + [len(table.cell(c, n).text()) for c in rows for n in table.nodes]
        )
        + 2
    )
    label = max([12] + [len(c) + 2 for c in rows])  # structured_output is 17 wide
    screen = terminal_width(tr)
    # As many node columns as the terminal holds; the rest in a table of their own below.
    per_table = max(1, (screen - label) // width)
    nodes = list(table.nodes)
    for start in range(0, len(nodes), per_table):
        group = nodes[start : start + per_table]
        tr.write_line(f"{'category':<{label}}" + "".join(f"{redact(n):<{width}}" for n in group))
        for category in rows:
            tr.write(f"{category:<{label}}")
            for node in group:
                cell = table.cell(category, node)
                tr.write(f"{cell.text():<{width}}", **COLOR[cell.verdict])
            tr.write("\n")
    for line in figures_lines(key_figures(state.figures), screen):
        tr.write_line(line)
    comparison = state.comparison
    if comparison is not None:
        shown = ", ".join(f"{d.name} {d.pct:+.1f}%" for d in comparison.deltas if d.pct is not None)
        tr.write_line(f"compared with {comparison.baseline_desc}: {shown or 'no common figures'}")
        if comparison.regressions:
            tr.write_line(f"REGRESSION: {comparison.message()}", red=True, bold=True)
    elif state.compare_note:
        tr.write_line(f"compare: {state.compare_note}", yellow=True)
    if results is not None:
        tr.write_line(f"results JSON: {Path(results).resolve()}")
    html = html_path(config)
    if html is not None:
        tr.write_line(f"HTML report:  {html}")
    if state.history_path is not None:
        tr.write_line(f"history:      {state.history_path}")
        if state.history_where:
            tr.write_line(f"              {state.history_where}; --spark-history=DIR or off")
    elif state.history_note:
        tr.write_line(f"history:      {state.history_note}")


def write_verdict(
    tr: Any, outcome: ReportOutcome, redactor: Redactor, config: pytest.Config
) -> None:
    """The HTML report's verdict line (``summary.verdict_line``), the terminal's last: after
    pytest's "1 failed, 115 skipped" (from a trylast ``pytest_unconfigure``). Wrapped to
    the terminal's width, continuation lines indented."""
    if config.option.collectonly:
        return
    state = outcome.state
    if state is None or not state.active:
        return
    line = redactor.text(verdict_line(state.doc, state.table))
    width = terminal_width(tr)
    wrapped = textwrap.wrap(
        line, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=True
    )
    for part in wrapped or [line]:
        tr.write_line(part, **COLOR[state.table.overall])


PYTEST_FAIL = "Failed: "  # pytest.fail's exception type, before every check's failure


def crash_line(report: Any) -> str | None:
    """The line pytest's short test summary shows after a failed suite check's id (the
    first line of the failure, cut to the terminal's width): ``summary.short_headline``,
    what failed where and the figures first, instead of ``Failed: `` and the message's
    start. None: not a suite check's failure."""
    props = dict(getattr(report, "user_properties", ()))
    if not (props.get(CATEGORY_PROP) or category_of(report.keywords)):
        return None
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is None or not isinstance(crash.message, str):
        return None
    message = crash.message.removeprefix(PYTEST_FAIL)
    finding = finding_of(props)
    if first_line(finding.get("message")) != first_line(message):
        return first_line(message)  # not the finding's failure (a fixture's): as it is
    return short_headline({**finding, "message": message})


def shorten_crash_lines(tr: Any) -> None:
    """Lead each failed suite check's short-summary line with ``crash_line`` (before
    pytest writes that summary, which it does after every ``pytest_terminal_summary``)."""
    for key in ("failed", "error"):
        for report in tr.stats.get(key, ()):
            line = crash_line(report) if isinstance(report, pytest.TestReport) else None
            if line:
                crash = report.longrepr.reprcrash
                rest = crash.message.removeprefix(PYTEST_FAIL)
                # the whole failure after it: -vv and CI print every line (not cut)
                crash.message = rest if first_line(rest) == line else f"{line}\n{rest}"
