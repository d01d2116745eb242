"""Verdict per category per node, from the JSON results document (pure)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pytest_spark.report.results import CATEGORIES

CLUSTER = "cluster"  # checks that are about the whole cluster (no single node)
RANK = {"fail": 4, "warn": 3, "pass": 2, "skip": 1, "none": 0}


@dataclass
class Cell:
    # passed/failed/error/skipped/warn, and noted: checks with notes (how they came to their
    # verdict: a request asked again alone), which do not change the verdict
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def verdict(self) -> str:
        c = self.counts
        if c["failed"] or c["error"]:
            return "fail"
        if c["warn"]:
            return "warn"
        if c["passed"]:
            return "pass"
        if c["skipped"]:
            return "skip"
        return "none"

    def text(self) -> str:
        c = self.counts
        parts = [
            f"{c[k]} {label}"
            for k, label in (
                ("passed", "passed"),
                ("failed", "failed"),
                ("error", "error"),
                ("skipped", "skipped"),
            )
            if c[k]
        ]
        if c["warn"]:
            parts.append(f"{c['warn']} warned")
        if c["noted"]:
            parts.append(f"{c['noted']} noted")
        return ", ".join(parts) or "-"


@dataclass
class VerdictTable:
    nodes: list[str]
    cells: dict[tuple[str, str], Cell]

    def cell(self, category: str, node: str) -> Cell:
        return self.cells.get((category, node)) or Cell()

    def category(self, category: str) -> Cell:
        total = Cell()
        for (cat, _), cell in self.cells.items():
            if cat == category:
                total.counts.update(cell.counts)
        return total

    @property
    def categories(self) -> list[str]:
        """Every category, in the suite's order (unrun ones too: they show as '-')."""
        return list(CATEGORIES)

    @property
    def overall(self) -> str:
        verdicts = [c.verdict for c in self.cells.values()]
        return max(verdicts, key=lambda v: RANK[v]) if verdicts else "none"


def verdict_table(doc: dict[str, Any]) -> VerdictTable:
    nodes = [str(n.get("name")) for n in (doc.get("cluster") or {}).get("nodes") or ()]
    cells: dict[tuple[str, str], Cell] = {}
    for check in doc.get("checks") or ():
        category = check.get("category")
        if category not in CATEGORIES:
            continue
        node = str(check.get("node") or CLUSTER)
        if node not in nodes and node != CLUSTER:
            nodes.append(node)
        cell = cells.setdefault((category, node), Cell())
        outcome = check.get("outcome") or "passed"
        cell.counts[outcome] += 1
        if outcome == "passed" and check.get("level") == "warn":
            cell.counts["warn"] += 1
        if check.get("notes"):
            cell.counts["noted"] += 1
    if any(node == CLUSTER for _, node in cells):
        nodes.append(CLUSTER)
    return VerdictTable(nodes, cells)


def outcome_counts(doc: dict[str, Any]) -> dict[str, int]:
    return dict(Counter(str(c.get("outcome")) for c in doc.get("checks") or ()))


def first_line(message: Any) -> str:
    """A message's first non-empty line."""
    return next((ln.strip() for ln in str(message or "").splitlines() if ln.strip()), "")


def short_headline(record: dict[str, Any]) -> str:
    """A failure's first line, led by what failed where and its figures when its finding
    failed with figures: ``spark-head enp1s0f1np1: 100 Gb/s / >= 200 Gb/s; link rate ...``
    (``record``: a results record or a finding: node, measured, expected, unit, bound,
    level, message). The verdict line's and pytest's short test summary's, which cut it."""
    headline = first_line(record.get("message"))
    if record.get("level") != "fail":
        return headline
    node = str(record.get("node") or "")
    figures = measured_expected(record)
    where, sep, rest = headline.partition(": ")
    if not (sep and node and where.startswith(node) and len(where) <= 60):
        where, rest = node, headline  # the message does not start with where: the node
    if figures:
        lead = f"{where}: {figures}" if where else figures
        return f"{lead}; {rest}" if rest else lead
    return f"{where}: {rest}" if where else rest


HEADLINE_MAX = 200  # the verdict line's first failure, cut at a word


def _failing(doc: dict[str, Any]) -> str:
    """``: in accuracy, tool_calls; first test_x: headline`` for the FAIL verdict."""
    bad = [c for c in doc.get("checks") or () if c.get("outcome") in ("failed", "error")]
    if not bad:
        return ""
    categories = ", ".join(dict.fromkeys(str(c.get("category") or "uncategorised") for c in bad))
    first = bad[0]
    name = str(first.get("nodeid", "")).split("::", 1)[-1]
    headline = short_headline(first)
    if len(headline) > HEADLINE_MAX:
        headline = headline[: HEADLINE_MAX - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    return f" in {categories}; first: {name}: {headline}"


RUN_OUTCOMES = ("passed", "failed", "xpassed", "xfailed")  # pytest-html's "N tests took"


def verdict_line(doc: dict[str, Any], table: VerdictTable | None = None) -> str:
    """The run's verdict in one line, the HTML report's banner and the terminal's last line
    alike (``table``: ``verdict_table(doc)``, when the caller has it). Its count of checks
    run is pytest-html's "N tests took" (passed, failed, xpassed, xfailed: skips and errors
    are not in it), and skips and errors are named apart, so the counts cannot disagree."""
    counts = outcome_counts(doc)
    run = sum(counts.get(k, 0) for k in RUN_OUTCOMES)
    errors, skipped = counts.get("error", 0), counts.get("skipped", 0)
    others = "".join(
        f", {n} {label}"
        for n, label in ((errors, "error" if errors == 1 else "errors"), (skipped, "skipped"))
        if n
    )
    failed = counts.get("failed", 0)
    overall = (table or verdict_table(doc)).overall
    return {
        "fail": f"Verdict: FAIL ({failed} of {run} checks run failed{others})" + _failing(doc),
        "warn": f"Verdict: PASS with warnings ({run} checks run{others})",
        "pass": f"Verdict: PASS ({run} checks run{others})",
        "skip": f"Verdict: nothing checked ({skipped} checks skipped)",
        "none": "Verdict: no suite checks ran",
    }[overall]


def fmt_value(value: Any) -> str:
    """A measured or expected value, short: numbers to 4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(fmt_value(v) for v in value)
    return json.dumps(value, default=str)


BOUNDS = (">=", "<=", ">", "<", "==")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def bound_of(finding: dict[str, Any]) -> str | None:
    """The direction of a numeric threshold: the finding's own ``bound`` (``>=``, ``<=``),
    else read off the verdict (a pass above the threshold, or a failure below it, is a
    floor); None when the figures cannot say (equal, or not numbers)."""
    bound = finding.get("bound")
    if bound in BOUNDS:
        return str(bound)
    measured, expected = finding.get("measured"), finding.get("expected")
    if not isinstance(measured, int | float) or not isinstance(expected, int | float):
        return None
    if isinstance(measured, bool) or isinstance(expected, bool) or measured == expected:
        return None
    level, outcome = finding.get("level"), finding.get("outcome")
    if level is None and outcome is None:  # no verdict to read the direction off
        return None
    failed = level in ("fail", "warn") or outcome == "failed"
    above = measured > expected
    return ">=" if above != failed else "<="


def with_unit(text: str, unit: str | None) -> str:
    """``text unit``, unless ``text`` already ends with the unit (``< 90 C`` stays as is)."""
    if not unit or text == "-":
        return text
    stripped = text.rstrip()
    before = stripped[: -len(unit)]
    if stripped.endswith(unit) and (not before or before[-1].isdigit() or before[-1].isspace()):
        return text
    return f"{text} {unit}"


def measured_expected(finding: dict[str, Any]) -> str:
    """``"100 Gb/s / >= 200 Gb/s"``: each side with its unit once, the threshold with its
    direction; empty when the check recorded no figures."""
    measured, expected = finding.get("measured"), finding.get("expected")
    if measured is None and expected is None:
        return ""
    unit = finding.get("unit")
    bound = bound_of(finding) if _is_number(expected) else None
    wanted = fmt_value(expected)
    if bound:
        wanted = f"{bound} {wanted}"
    if not _is_number(measured) or not (_is_number(expected) or bound or _starts_bound(wanted)):
        # words or records on either side: the unit once, at the end
        return with_unit(f"{fmt_value(measured)} / {wanted}", unit)
    return f"{with_unit(fmt_value(measured), unit)} / {with_unit(wanted, unit)}"


def _starts_bound(text: str) -> bool:
    return text.lstrip().startswith(("<", ">", "="))


HINT_STARTS = (
    "usually",
    "likely",
    "probably",
    "check",
    "run ",
    "see ",
    "start",
    "set ",
    "stop",
    "lower",
    "raise",
    "give",
    "point",
    "use ",
    "read",
    "restart",
    "reseat",
    "replace",
    "fix",
    "try",
    "make sure",
    "another",
    "a stale",
    "the usual",
)


def remediation(message: str) -> str:
    """The "what usually fixes it" part of a failure message (STYLE.md), or ''."""
    for line in message.splitlines():
        stripped = line.strip()
        if stripped.lower().startswith("fix:"):
            return stripped[4:].strip()
    body = message.split("\n---", 1)[0]
    sentences = [s.strip() for s in body.replace("\n", " ").split(". ")]
    for i, sentence in enumerate(sentences):
        if i and sentence.lower().startswith(HINT_STARTS):
            return ". ".join(sentences[i:]).strip()
    for sentence in sentences:
        if "; see " in sentence or ": check " in sentence:
            return sentence
    return ""
