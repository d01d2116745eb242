"""Controller-side report plugin: at the end of the session it reads the JSON results
document once, redacts it, derives figures, keeps the run in the history, compares it with
an earlier run, fails the session on regressions, and feeds the HTML, terminal and JSON.

Session-level failure (a regression beyond ``--spark-compare-fail``): ``session.exitstatus``
becomes 1 (TESTS_FAILED) when it was 0 or 5, the terminal summary prints one red message
listing every regression (old -> new, percentage), the HTML summary shows it in a red box
with the deltas, the JSON results carry ``report.compare.regressions`` and the JUnit XML a
``spark_regressions`` testsuite property.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.report.environment import environment
from pytest_spark.report.figures import figures_of, metrics_of
from pytest_spark.report.history import (
    History,
    cluster_identity,
    compare,
    git_commit,
    history_record,
    resolve_history_dir,
)
from pytest_spark.report.model import ReportOutcome, ReportState
from pytest_spark.report.redact import Redactor
from pytest_spark.report.results import RESULTS_KEY
from pytest_spark.report.summary import outcome_counts, verdict_table
from pytest_spark.settings.resolve import SettingsError
from pytest_spark.state import SIM_KEY


def validate(settings: Any) -> None:
    """Start-up checks that involve more than one report option."""
    wants = settings.compare is not None or settings.compare_fail
    if wants and settings.history is None:
        which = "compare" if settings.compare is not None else "compare_fail"
        raise SettingsError(
            f"--spark-{which.replace('_', '-')} (from {settings.source(which)}) compares "
            f"with the run history, but --spark-history is off (from "
            f"{settings.source('history')}): give a history directory"
        )


class ReportPlugin:
    """Registered on the controller only (``report.register_controller``)."""

    def __init__(self, config: pytest.Config, settings: Any, redactor: Redactor) -> None:
        self.config = config
        self.settings = settings
        self.redactor = redactor
        self.outcome = ReportOutcome()  # what the terminal and HTML views render
        root, self.history_where = resolve_history_dir(  # why there, when the default chose
            settings.history,
            settings.source("history"),
            config.rootpath,
            config.inipath,
            config.invocation_params.dir,
            os.environ,
        )
        self.history_root: Path | None = root
        self.arena_line: str | None = None  # where --spark-arena wrote, or why not
        self._check_named_run()

    # -- start-up -----------------------------------------------------------------------
    def _sim_nodes(self) -> list[str] | None:
        sim = self.config.stash.get(SIM_KEY, None)
        return [str(n.get("name")) for n in sim.info.get("nodes", ())] if sim else None

    def _identity(self, doc: dict[str, Any]) -> dict[str, Any]:
        return cluster_identity(doc.get("cluster") or {}, self._sim_nodes(), self.settings.api_url)

    def _base_doc(self) -> dict[str, Any]:
        recorder = self.config.stash.get(RESULTS_KEY, None)
        if recorder is None:
            return {"version": 1, "cluster": {}, "checks": []}
        doc = recorder.document()
        serving = recorder.serving()
        if serving is not None:
            doc["serving"] = serving
        return doc

    def _check_named_run(self) -> None:
        ref = self.settings.compare
        if ref in (None, "last") or self.history_root is None:
            return
        history = History(self.history_root, self._identity(self._base_doc()))
        if history.find(ref) is None:
            runs = ", ".join(r.label for r in history.runs()[-5:]) or "none"
            raise SettingsError(
                f"--spark-compare {ref} (from {self.settings.source('compare')}): no such run "
                f"in {history.dir} (latest runs there: {runs})"
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not (self.settings.head or self.settings.api_url):
            return
        doc = self.redactor.value(self._base_doc())
        env = environment(doc, self.settings, None)
        early = ("Cluster", "Cluster nodes", "Threshold profile", "SSH host-key policy")
        self._set_metadata({k: v for k, v in env.items() if k in early})

    # -- end of session -------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        try:
            self.outcome.state = self._build(int(exitstatus))
        except Exception as exc:  # the report must not take the session down
            self.outcome.error = f"pytest-dgx-spark report: {type(exc).__name__}: {exc}"
            return
        state = self.outcome.state
        if getattr(self.settings, "arena", None) is not None:
            self.arena_line = self._write_arena(self.settings.arena)
        if state.regression_message:
            if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            self._junit_property("spark_regressions", state.regression_message)
        if state.active:
            self._set_metadata(state.environment)

    def _build(self, exitstatus: int) -> ReportState:
        doc = self.redactor.value(self._base_doc())
        figures = figures_of(doc)
        metrics = metrics_of(figures)
        identity = self._identity(doc)
        state = ReportState(doc, figures, metrics, verdict_table(doc), identity, None, exitstatus)
        if not state.active:
            return state
        state.commit = git_commit(self.config.rootpath)
        state.environment = environment(doc, self.settings, state.commit)
        settings = self.settings
        ref = settings.compare or ("last" if settings.compare_fail else None)
        history = History(self.history_root, identity) if self.history_root else None
        if ref is not None and history is not None:
            if not metrics:
                state.compare_note = "nothing to compare: this run recorded no figures"
            else:
                baseline = history.find(ref)
                if baseline is None:
                    state.compare_note = (
                        f"nothing to compare with: no earlier run of "
                        f"cluster {identity['id']} in {history.dir}"
                    )
                else:
                    try:
                        state.comparison = compare(baseline, metrics, settings.compare_fail)
                    except (OSError, ValueError) as exc:
                        state.compare_note = f"cannot read {baseline.path}: {exc}"
        if history is not None and metrics:
            started = self._started()
            record = history_record(
                identity=identity,
                metrics=metrics,
                started=started,
                exitstatus=exitstatus,
                outcomes=outcome_counts(doc),
                commit=state.commit,
            )
            try:
                state.history_path = history.save(record, started)
                state.history_where = self.history_where
            except OSError as exc:
                state.history_note = f"could not write the run history: {exc}"
        elif history is None:
            state.history_note = "run history off (--spark-history off)"
        return state

    def _write_arena(self, directory: Path) -> str:
        """--spark-arena: the depth sweep in the Spark Arena's files (report.arena)."""
        from pytest_spark.report.arena import context_of, write_arena

        try:
            written = write_arena(
                directory, self.redactor.value(self._base_doc()), context_of(self.settings)
            )
        except OSError as exc:
            return f"Spark Arena figures: could not write {directory}: {exc}"
        if isinstance(written, str):
            return f"Spark Arena figures: nothing written to {directory}: {written}"
        return "Spark Arena figures: " + ", ".join(str(p) for p in written)

    def _started(self) -> datetime:
        recorder = self.config.stash.get(RESULTS_KEY, None)
        started: datetime = recorder.started if recorder is not None else datetime.now(UTC)
        return started

    def _set_metadata(self, env: dict[str, Any]) -> None:
        try:
            from pytest_metadata.plugin import metadata_key
        except ImportError:
            return
        metadata = self.config.stash.get(metadata_key, None)
        if metadata is None:
            return
        from pytest_spark.report.html import html_active, metadata_value

        escape = html_active(self.config)

        for key, value in env.items():
            metadata[key] = metadata_value(self.redactor.value(value), escape)
        for key, value in list(metadata.items()):
            if key not in env:
                metadata[key] = self.redactor.value(value)

    def _junit_property(self, name: str, value: str) -> None:
        try:
            from _pytest.junitxml import xml_key
        except ImportError:
            return
        xml = self.config.stash.get(xml_key, None)
        if xml is not None:
            xml.add_global_property(name, value)

    # -- outputs ---------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_spark_update_results(
        self, config: pytest.Config, results: dict[str, Any]
    ) -> Generator[None, list[None], list[None]]:
        """Around every other implementation: redact the JSON results in place and add the
        report's figures and comparison before they run, redact again after (what they
        added is redacted too)."""
        self._redact(results)
        state = self.outcome.state
        if state is not None and state.active:
            results["report"] = state.to_json()
        outcome = yield
        self._redact(results)
        return outcome

    def _redact(self, results: dict[str, Any]) -> None:
        clean = self.redactor.value(results)
        results.clear()
        results.update(clean)

    def pytest_terminal_summary(
        self, terminalreporter: Any, exitstatus: int, config: pytest.Config
    ) -> None:
        from pytest_spark.report.terminal import shorten_crash_lines, write_summary

        results = getattr(self.settings, "results", None)
        write_summary(terminalreporter, self.outcome, self.redactor, results, config)
        if self.arena_line:
            terminalreporter.write_line(self.arena_line)
        shorten_crash_lines(terminalreporter)  # pytest's short summary comes after this hook

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """The verdict line, last: pytest's "1 failed, 115 skipped" line is written at the
        end of its ``pytest_sessionfinish``, after every ``pytest_terminal_summary``."""
        from pytest_spark.report.terminal import write_verdict

        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            write_verdict(reporter, self.outcome, self.redactor, config)
