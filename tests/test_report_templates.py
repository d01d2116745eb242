"""The report's HTML comes from jinja2 templates with autoescape on: no hand-escaping
helper is left in the report package, the templates ship in the wheel, and a node name or
message holding markup or ``&`` reaches every fragment as text, escaped once."""

from __future__ import annotations

import html
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

from report_fakes import Tags, assert_no_injected_markup

from pytest_spark.report import html as report_html
from pytest_spark.report.results import FINDING_PROP, NODE_PROP, NOTES_PROP
from pytest_spark.report.templating import environment, fragment

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "pytest_spark" / "report"
NODE = "sp&rk<script>alert(1)</script>"
MESSAGE = (
    'rate 100 < 200 & "slow" <img src=x onerror=alert(1)>\n--- last 1 log lines of a&b ---\nx<y'
)


def test_no_hand_escaping_helper_remains() -> None:
    assert environment().autoescape is True
    for path in REPORT.glob("*.py"):
        text = path.read_text()
        assert "def esc(" not in text, path
        if path.name != "redact.py":  # the redactor looks for a secret's escaped forms
            assert not re.search(r"\bhtml\.escape\(|\bescape\(", text), path
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(d.startswith("jinja2") for d in pyproject["project"]["dependencies"])
    shipped = pyproject["tool"]["setuptools"]["package-data"]["pytest_spark"]
    assert "report/templates/*" in shipped
    assert sorted(p.name for p in (REPORT / "templates").iterdir()) == [
        "accuracy.html",
        "check.html",
        "depth.html",
        "fragments.html",
        "style.css",
        "summary.html",
    ]


def _report(**finding: object) -> SimpleNamespace:
    return SimpleNamespace(
        failed=False,
        skipped=False,
        longrepr=None,
        keywords={},
        nodeid="tests_infra/test_links.py::test_rate[x]",
        when="call",
        user_properties=[(FINDING_PROP, finding), (NODE_PROP, NODE)],
    )


def _shown(fragment_html: str) -> str:
    assert_no_injected_markup(fragment_html)
    return "".join(Tags(fragment_html).text)


def test_markup_and_ampersands_are_text_escaped_once() -> None:
    report = _report(
        level="warn",
        node=NODE,
        message=MESSAGE,
        measured=100,
        expected=200,
        unit="Gb/<s>",
        evidence={"ethtool a&b": "Speed: <100G> & down"},
    )
    block = report_html.check_html(report)  # type: ignore[arg-type]
    assert block is not None
    text = _shown(block)
    assert NODE in text and 'rate 100 < 200 & "slow" <img' in text
    assert "last 1 log lines of a&b" in text and "x<y" in text
    assert "evidence: ethtool a&b" in text and "Speed: <100G> & down" in text
    assert "&amp;amp;" not in block and "&lt;script&gt;" in block
    cells: list[str] = ['<td class="col-testId">x</td>', "<td>result</td>", "<td>d</td>"]
    report_html.HtmlHooks(None, _NoRedaction(), None).pytest_html_results_table_row(  # type: ignore[arg-type]
        report,  # type: ignore[arg-type]
        cells,
    )
    row = "".join(cells)
    assert NODE in _shown(row) and "100 Gb/<s> / >= 200 Gb/<s>" in _shown(row)
    for value in (fragment("banner", "fail", NODE), fragment("text", NODE)):
        assert _shown(value) == NODE and html.unescape(value).count(NODE) == 1
    assert report_html.metadata_value({NODE: MESSAGE}, True) == {
        fragment("text", NODE): fragment("text", MESSAGE)
    }
    skipped = fragment("skip_log", f"needs {NODE}", "tests_infra/x.py", 3)
    assert _shown(skipped) == f"needs {NODE}\n(tests_infra/x.py:3)\n"


class _NoRedaction:
    def text(self, value: str) -> str:
        return value


def test_a_checks_notes_are_shown_under_its_row() -> None:
    """A passing check's notes (CheckNote: a request asked again alone) show in its block,
    escaped; a check with none shows no note."""
    note = "asked again alone it answered in 2.1 s <b>"
    report = _report(level="pass", node=NODE, message="the call assembled", measured=1)
    plain = report_html.check_html(report)  # type: ignore[arg-type]
    assert plain is not None and "Note:" not in _shown(plain)
    report.user_properties.append((NOTES_PROP, [note]))
    block = report_html.check_html(report)  # type: ignore[arg-type]
    assert block is not None
    text = _shown(block)
    assert "PASS" in text and f"Note: {note}" in text
    # a check with no finding of its own (a plain pass) but a note still gets its block
    bare = SimpleNamespace(**{**vars(report), "user_properties": [(NOTES_PROP, [note])]})
    shown = report_html.check_html(bare)  # type: ignore[arg-type]
    assert shown is not None and f"Note: {note}" in _shown(shown)
