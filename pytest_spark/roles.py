"""The plugin's two roles, as pytest-xdist's ``DSession``: ``Controller`` (the session that
owns the sim, the run directory, the launched cluster, the results and the report) or
``Worker`` (an xdist worker, attached to the controller's sim and run directory).
``plugin.pytest_configure`` registers one of them, once active; both share ``Active``
(fixtures, settings, the sim, the run directory, measurements, parametrisation per node,
categories, usage errors)."""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_spark.state import CLUSTER_KEY, RUN_DIR_KEY, SETTINGS_KEY, SIM_KEY
from pytest_spark.suitedir import (
    API_FIXTURES,
    CATEGORY_MARKERS,
    CLUSTER_FIXTURES,
    NODE_FIXTURES,
    SERVER_FIXTURES,
    MarkerTypos,
    cluster_usage_error,
    item_fixtures,
    nothing_collected,
    suite_header,
    unknown_markers,
)

if TYPE_CHECKING:
    from pytest_spark.access.simcontrol import SimCluster
    from pytest_spark.measure.once import Measurements
    from pytest_spark.settings.resolve import Settings

SIM_INFO = "spark_sim_cluster_json"  # workerinput keys: what a worker attaches to
RUN_DIR = "spark_run_dir"


class Active:
    """The plugin asked for, in either role: fixtures, settings, the sim, the run
    directory, measurements, the cluster's parametrisation, categories and usage errors."""

    name = "active"

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.collected = 0  # items collected, before -m/-k deselect

    def start(self) -> None:
        from pytest_spark import fixtures
        from pytest_spark.access.simcontrol import served_by_sim
        from pytest_spark.measure.once import MEASURE_KEY
        from pytest_spark.readiness.reachability import LostNodes, VerdictFirst
        from pytest_spark.settings.resolve import resolve
        from pytest_spark.verdict import RepeatedSetupFailure

        config = self.config
        config.addinivalue_line("filterwarnings", "default::pytest_spark.verdict.SparkCheckWarning")
        # a check's notes (AskedAloneWarning among them) say how it came to its verdict
        config.addinivalue_line("filterwarnings", "default::pytest_spark.infra.finding.CheckNote")
        config.pluginmanager.register(fixtures, "spark.fixtures")
        # NodeUnreachable out of a check: one failure per lost node, later checks skip citing it
        config.pluginmanager.register(
            LostNodes(lambda: config.stash.get(CLUSTER_KEY, None)), "spark.lost"
        )
        # test_node_reachable runs first and whatever the selection (-m link, -k, -x);
        # test_cluster_serving whenever a selected check needs the server (-m tool_calls)
        first = VerdictFirst(
            self.needs_nodes, lambda item: bool(item_fixtures(item) & SERVER_FIXTURES)
        )
        config.pluginmanager.register(first, "spark.reachability")
        # no verdict collected: a session fixture's failure is one error, not one per check
        config.pluginmanager.register(RepeatedSetupFailure(), "spark.repeated")
        settings = resolve(config)
        # -m linkk: a usage error at session start, before the session contacts anything
        config.pluginmanager.register(MarkerTypos(), "spark.marker-typos")
        if settings.sim:
            config.stash[SIM_KEY] = self.sim(settings)
            settings = served_by_sim(settings, config.stash[SIM_KEY])
        config.stash[SETTINGS_KEY] = settings
        config.stash[RUN_DIR_KEY] = self.run_dir()
        config.stash[MEASURE_KEY] = self.measurements(config.stash[RUN_DIR_KEY])

    def needs_nodes(self, item: pytest.Item) -> bool:
        """Whether the check reaches the nodes: through the cluster's fixtures, or through
        the server on the head (attached or launched; not --spark-api-url alone), whose
        reachability verdict then says an unreachable head with its fix."""
        fixtures = item_fixtures(item)
        if fixtures & CLUSTER_FIXTURES:
            return True
        settings = self.config.stash.get(SETTINGS_KEY, None)
        on_head = settings is not None and settings.head and not settings.api_url
        return bool(on_head and fixtures & SERVER_FIXTURES)

    def sim(self, settings: Settings) -> SimCluster:
        raise NotImplementedError

    def run_dir(self) -> Path:
        raise NotImplementedError

    def measurements(self, run_dir: Path) -> Measurements:
        raise NotImplementedError

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from pytest_spark.measure.once import MEASURE_KEY

        cluster = config.stash.get(CLUSTER_KEY, None)
        if cluster is not None:
            cluster.close()
        measurements = config.stash.get(MEASURE_KEY, None)
        if measurements is not None:
            measurements.close()
        sim = config.stash.get(SIM_KEY, None)
        if sim is not None:
            sim.down()

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        names = set(metafunc.fixturenames)
        settings = metafunc.config.stash[SETTINGS_KEY]
        if not names & CLUSTER_FIXTURES or not settings.head:
            return  # no head: reported once, at collection end
        from pytest_spark.access.cluster import node_names

        if names & NODE_FIXTURES:
            ids = [name for name, _, _ in node_names(settings)]
            metafunc.parametrize("_spark_node", ids, ids=ids, indirect=True, scope="session")
        if "spark_twin" in names:
            ifs = settings.fabric_ifs
            count = len(ifs) or settings.profile.link.fabric_twins
            twin_ids = list(ifs) if ifs else [f"twin{i}" for i in range(count)]
            metafunc.parametrize("spark_twin", list(range(count)), ids=twin_ids, scope="session")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """A check's notes (``CheckNote`` warnings: how it came to its verdict) kept with it,
        for the results and the report; every warning goes on to pytest's summary as
        before (warned again, as it was, once the check returns)."""
        from pytest_spark.infra.finding import CheckNote
        from pytest_spark.report.results import NOTES_PROP

        log: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as log:
                return (yield)
        finally:
            notes = [str(w.message) for w in log if issubclass(w.category, CheckNote)]
            if notes:
                item.user_properties.append((NOTES_PROP, notes))
            for w in log:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        """The check's category is its closest category marker (a test's own mark wins over
        its module's)."""
        from pytest_spark.report.results import CATEGORY_PROP

        self.collected += 1
        for mark in item.iter_markers():
            if mark.name in CATEGORY_MARKERS:
                item.user_properties.append((CATEGORY_PROP, mark.name))
                return

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        # -m nosuch: before anything is contacted (an xdist worker's usage error is an
        # INTERNALERROR: there MarkerTypos, in the controller, catches a category's typo)
        problem = None if hasattr(config, "workerinput") else unknown_markers(config, items)
        if problem:
            raise pytest.UsageError(problem)
        settings = config.stash[SETTINGS_KEY]
        if settings.head:
            return
        cluster_tests = [i for i in items if set(getattr(i, "fixturenames", ())) & CLUSTER_FIXTURES]
        if settings.api_url:
            why = (
                "needs the cluster's nodes (--spark-head): only the API was given (--spark-api-url)"
            )
            for item in cluster_tests:
                item.add_marker(pytest.mark.skip(reason=why))
            return
        api_tests = [i for i in items if set(getattr(i, "fixturenames", ())) & API_FIXTURES]
        if cluster_tests + api_tests:
            raise cluster_usage_error(cluster_tests + api_tests)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from pytest_spark.readiness.reachability import (
            MARK,
            REACHABILITY_VERDICT_KEY,
            SERVING_MARK,
        )
        from pytest_spark.readiness.serving import SERVING_VERDICT_KEY

        for key, marker in (
            (SERVING_VERDICT_KEY, SERVING_MARK),
            (REACHABILITY_VERDICT_KEY, MARK),
        ):
            session.config.stash[key] = any(i.get_closest_marker(marker) for i in session.items)
        if self.collected == 0 and not session.testsfailed:
            raise pytest.UsageError(nothing_collected(session.config))

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        from pytest_spark.settings.expectations import coverage_lines, expectations_lines

        settings = config.stash[SETTINGS_KEY]
        return [
            *coverage_lines(settings.profile, settings.head, settings.workers, settings.sim),
            *expectations_lines(settings.profile, settings.source("threshold"), settings.recipe),
            *suite_header(config),
        ]


class Controller(Active):
    """The session's owner: starts the sim, makes the run directory, records the results,
    writes the report, stops what --spark-launch started, hands workers what they attach to."""

    name = "controller"
    previous_sigterm: Any = None

    def start(self) -> None:
        from pytest_spark.report import register_controller

        super().start()
        register_controller(self.config)  # results, HTML, history, summary, redaction (report/)
        if threading.current_thread() is threading.main_thread():
            self.previous_sigterm = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)

    def sim(self, settings: Settings) -> SimCluster:
        from pytest_spark.access.simcontrol import sim_up

        engine = settings.sim_engine
        return sim_up(settings.sim_nodes, () if engine == "emulator" else ("--engine", engine))

    def run_dir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="pytest-spark-run-"))

    def measurements(self, run_dir: Path) -> Measurements:
        from pytest_spark.measure.once import Measurements

        return Measurements(run_dir, "main", shared=False)

    @pytest.hookimpl(optionalhook=True)  # pytest-xdist's, when it is installed
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[RUN_DIR] = str(node.config.stash[RUN_DIR_KEY])
        sim = node.config.stash.get(SIM_KEY, None)
        if sim is not None:
            node.workerinput[SIM_INFO] = str(sim.state_dir / "cluster.json")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Under xdist the controller collects nothing: the serving layout is found here,
        before the workers start (they read it from the run directory)."""
        if session.config.pluginmanager.has_plugin("dsession"):
            self.find_layout(session.config)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        super().pytest_collection_finish(session)
        needs = CLUSTER_FIXTURES | API_FIXTURES
        if any(item_fixtures(item) & needs for item in session.items):
            self.find_layout(session.config)

    def find_layout(self, config: pytest.Config) -> None:
        """The serving layout, found once before any check runs: attached without
        --spark-container, each node's sparkrun rank container by its labels. Several
        sparkrun jobs and no --spark-job is a usage error listing them."""
        settings = config.stash[SETTINGS_KEY]
        explicit = settings.source("container") != "default" and settings.job is None
        if not settings.head or settings.launch or explicit:
            return
        from pytest_spark.access import layout
        from pytest_spark.access.cluster import Cluster

        cluster = config.stash.get(CLUSTER_KEY, None) or Cluster(settings)
        config.stash[CLUSTER_KEY] = cluster
        try:
            found = cluster.layout
        except layout.LayoutError as exc:
            raise pytest.UsageError(str(exc)) from None
        layout.save(config.stash[RUN_DIR_KEY], found)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Stop what --spark-launch started, once, whatever happened."""
        config = session.config
        settings = config.stash.get(SETTINGS_KEY, None)
        if settings is None or not settings.head or RUN_DIR_KEY not in config.stash:
            return
        from pytest_spark.access.cluster import Cluster
        from pytest_spark.readiness.launch import stop_if_launched

        try:
            cluster = config.stash.get(CLUSTER_KEY, None) or Cluster(settings)
            problem = stop_if_launched(cluster, config.stash[RUN_DIR_KEY], settings.keep)
        except Exception as exc:  # teardown must never cost the report and the JSON
            problem = f"could not stop the launched cluster: {type(exc).__name__}: {exc}"
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if problem and reporter is not None:
            reporter.write_line(f"pytest-dgx-spark teardown: {problem}", red=True)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self.previous_sigterm)
        super().pytest_unconfigure(config)
        run_dir = config.stash.get(RUN_DIR_KEY, None)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)


class Worker(Active):
    """An xdist worker: attaches to the controller's sim and run directory, and shares
    the session's measurements with the other workers (taken once, in isolation)."""

    name = "worker"

    def start(self) -> None:
        from pytest_spark.report import register_worker

        super().start()
        register_worker(self.config)  # redaction of the reports this worker builds

    def sim(self, settings: Settings) -> SimCluster:
        from pytest_spark.access.simcontrol import sim_attach

        return sim_attach(Path(self.config.workerinput[SIM_INFO]))  # type: ignore[attr-defined]

    def run_dir(self) -> Path:
        return Path(self.config.workerinput[RUN_DIR])  # type: ignore[attr-defined]

    def measurements(self, run_dir: Path) -> Measurements:
        from pytest_spark.measure.once import Measurements

        worker = self.config.workerinput["workerid"]  # type: ignore[attr-defined]
        measurements = Measurements(run_dir, worker, shared=True)
        self.config.pluginmanager.register(measurements, "spark.measure")
        return measurements


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (CI cancelling a job) ends the session like Ctrl-C: teardown runs, the
    launched cluster is stopped, the report and JSON are written, exit code 2."""
    raise KeyboardInterrupt(f"signal {signum}")
