"""JSON results (schema version 1): one record per check, written even on interrupt."""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_spark.access.files import write_json
from pytest_spark.infra.finding import Finding
from pytest_spark.report.accuracy import accuracy_block
from pytest_spark.suitedir import CATEGORY_MARKERS

if TYPE_CHECKING:
    from pytest_spark.settings.resolve import Settings

CATEGORIES = tuple(CATEGORY_MARKERS)  # the report's rows, in the suite's table's order
FINDING_PROP = "spark_finding"
NODE_PROP = "spark_node"
CATEGORY_PROP = "spark_category"
DATA_PREFIX = "spark_data:"
NOTES_PROP = "spark_notes"  # what a check warned as a CheckNote (roles.Active keeps them)
CRASH_PROP = "spark_crashed"  # the exception type when a test died of an exception, not a verdict
# How a check says its verdict; any other exception is a crash (a bug in the check or suite).
VERDICT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    pytest.fail.Exception,
    pytest.skip.Exception,
    pytest.xfail.Exception,
)


def finding_property(finding: Finding) -> tuple[str, str]:
    """A user_properties entry (travels with the report, also across xdist workers): the
    finding as a JSON object, as JUnit XML writes it (pytest writes a property's ``str()``:
    a dict would be a Python repr there); ``finding_of`` reads it back."""
    return FINDING_PROP, encode_finding(
        {
            "level": finding.level,
            "measured": finding.measured,
            "expected": finding.expected,
            "unit": finding.unit,
            "bound": finding.bound,
            "message": finding.message,
            "node": finding.node,
            "evidence": dict(finding.evidence),
        }
    )


def encode_finding(record: dict[str, Any]) -> str:
    # default=str and non-ASCII kept as is, as the results JSON is written (write_json)
    return json.dumps(record, default=str, ensure_ascii=False)


def finding_of(props: dict[str, Any]) -> dict[str, Any]:
    """A check's finding from its report's user properties (``dict(user_properties)``):
    the JSON object ``finding_property`` wrote (a dict, from a caller that put one there,
    is taken as it is); {} when there is none."""
    value = props.get(FINDING_PROP)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def category_of(keywords: Any) -> str | None:
    for category in CATEGORIES:
        if category in keywords:
            return category
    return None


class ResultsRecorder:
    """Collects one record per suite check from the reports; writes JSON at the end."""

    def __init__(
        self,
        config: pytest.Config,
        path: Path | None,
        cluster_info: dict[str, Any],
        run_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.path = path
        self.cluster_info = cluster_info
        self.started = datetime.now(UTC)
        self._t0 = time.monotonic()
        self.checks: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        exc = call.excinfo
        if exc is not None and not isinstance(exc.value, VERDICT_EXCEPTIONS):
            # a fresh list: report.user_properties is the item's own list
            report.user_properties = [*report.user_properties, (CRASH_PROP, exc.typename)]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props: dict[str, Any] = dict(report.user_properties)
        category = props.get(CATEGORY_PROP) or category_of(report.keywords)
        if category is None:
            return
        finding = finding_of(props)
        if report.when == "call" or report.outcome != "passed":
            if report.when != "call" and report.nodeid in self.checks and report.passed:
                return
            outcome: str = report.outcome
            if report.when in ("setup", "teardown") and report.failed:
                outcome = "error"
            if report.skipped:
                outcome = "skipped"
            message = finding.get("message") or ""
            if report.failed or report.skipped:
                message = _longrepr_message(report) or message
            record = self.checks.get(report.nodeid, {})
            if record.get("outcome") in ("failed", "error") and outcome == "passed":
                return
            self.checks[report.nodeid] = {
                "nodeid": report.nodeid,
                "category": category,
                "node": finding.get("node") or props.get(NODE_PROP),
                "outcome": outcome,
                "level": finding.get("level"),
                "measured": finding.get("measured"),
                "expected": finding.get("expected"),
                "unit": finding.get("unit"),
                "bound": finding.get("bound"),
                "message": message,
                "crashed": props.get(CRASH_PROP),
                "duration_s": round(report.duration, 4),
                "evidence": finding.get("evidence") or {},
                "notes": notes_of(props),
                "extra": {
                    k.removeprefix(DATA_PREFIX): v
                    for k, v in props.items()
                    if k.startswith(DATA_PREFIX) and _jsonable(v)
                },
            }

    def document(self) -> dict[str, Any]:
        """The document as far as the checks that have reported so far make it."""
        checks = list(self.checks.values())
        doc = {
            "version": 1,
            "started": self.started.isoformat(),
            "duration_s": round(time.monotonic() - self._t0, 3),
            "cluster": self.cluster_info,
            "checks": checks,
        }
        accuracy = accuracy_block(checks)  # the JSON's block and the report's section
        if accuracy is not None:
            doc["accuracy"] = accuracy
        return doc

    def serving(self) -> dict[str, Any] | None:
        """What the session's launch or attach wrote (``serving.json``), if it got there."""
        path = self.run_dir / "serving.json" if self.run_dir else None
        if path is None or not path.exists():
            return None
        try:
            value = json.loads(path.read_text())
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    @pytest.hookimpl(trylast=True)
    def pytest_spark_generate_results(
        self,
        config: pytest.Config,
        checks: list[dict[str, Any]],
        cluster: dict[str, Any],
        serving: dict[str, Any] | None,
        exitstatus: int,
    ) -> dict[str, Any]:
        """The built-in document; trylast, so that a conftest's implementation replaces it."""
        doc = {**self.document(), "cluster": cluster, "checks": checks, "exitstatus": exitstatus}
        if serving is not None:
            doc["serving"] = serving
        return doc

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        hook = self.config.hook
        # session.exitstatus, not the hook's argument: it includes what other
        # sessionfinish hooks made of it (a regression fails the session).
        doc = hook.pytest_spark_generate_results(
            config=self.config,
            checks=list(self.checks.values()),
            cluster=self.cluster_info,
            serving=self.serving(),
            exitstatus=int(session.exitstatus),
        )
        hook.pytest_spark_update_results(config=self.config, results=doc)
        if self.path is not None:
            write_json(self.path, doc)


# The controller's ResultsRecorder (set by the plugin at configure; read by the report).
RESULTS_KEY: pytest.StashKey[ResultsRecorder] = pytest.StashKey()


def notes_of(props: dict[str, Any]) -> list[str]:
    """A check's notes, from its report's user properties (``dict(user_properties)``)."""
    kept = props.get(NOTES_PROP)
    return [str(note) for note in kept] if isinstance(kept, list | tuple) else []


def _longrepr_message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).removeprefix("Failed: ")
    return str(longrepr or "")[-2000:]


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def cluster_info(settings: Settings) -> dict[str, Any]:
    from pytest_spark.access.cluster import node_names
    from pytest_spark.settings.expectations import server_expectations

    return {
        "head": settings.head,
        "nodes": [
            {"name": n, "role": r, "address": a}
            for n, r, a in (node_names(settings) if settings.head else [])
        ],
        "sim": bool(settings.sim),
        "profile": settings.profile.name,
        "hostkey_check": settings.hostkey_check,
        "server_expectations": [
            e.to_json()
            for e in server_expectations(
                settings.profile, settings.source("threshold"), settings.recipe
            )
        ],
    }
