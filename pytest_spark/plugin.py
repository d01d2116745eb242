"""pytest hooks and option wiring of pytest-dgx-spark (entry point ``spark``)."""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Only what the inert path needs is imported here (options, the activation check, the
# stash keys, where the suite is): installed but not asked for, the plugin must not cost
# the import of paramiko, testinfra and httpx. The rest is imported once active.
from pytest_spark import hooks
from pytest_spark.settings.resolve import add_options, asked_for, refuse_spaced_paths
from pytest_spark.state import (
    CLUSTER_KEY,
    RUN_DIR_KEY,
    SETTINGS_KEY,
    SIM_KEY,
)
from pytest_spark.suitedir import (
    holds_tests,
    installed_selection,
    needed,
    selected,
    suite_base,
    suite_paths,
)

if TYPE_CHECKING:
    from pytest_spark.settings.resolve import Settings

MARKERS = {
    "preflight": "node fitness before serving (docker, GPU, disk, model dir, clocks, env)",
    "link": "fabric link state per node and twin (NIC, RoCE, rate, MTU, reachability)",
    "nccl": "collective (all-reduce) bandwidth and transport over the fabric",
    "readiness": "the served model is up, complete and answering",
    "accuracy": "the model answers correctly: exact canaries alone and under load, a logprob "
    "fingerprint against a baseline, the math set by option (--spark-accuracy=math)",
    "tool_calls": "tool-call parsing end to end",
    "reasoning": "reasoning separation end to end",
    "throughput": "tokens/sec and latency against the profile",
    "structured_output": "response_format (json_schema, json_object) answers end to end",
    "load": "open-loop load and the soak, by option (--spark-open-loop, --spark-soak)",
    "context": "prefix cache and long context (max_model_len) end to end",
}
SIM_INFO = "spark_sim_cluster_json"
RUN_DIR = "spark_run_dir"
SIGTERM_KEY = pytest.StashKey[Any]()
SUITE_KEY = pytest.StashKey[list[Path]]()  # the installed suite, when collection went there
SELECTED_KEY = pytest.StashKey[list[str]]()  # node ids named from the installed suite
COLLECTED_KEY = pytest.StashKey[int]()  # items collected, before -m/-k deselect
API_FIXTURES = {"spark_api", "spark_api_state"}
NODE_FIXTURES = {"spark_node", "spark_node_unchecked", "_spark_node", "host"}
CLUSTER_FIXTURES = NODE_FIXTURES | {
    "spark_cluster",
    "spark_head",
    "spark_workers",
    "spark_twin",
    "spark_serving",
    "spark_serving_state",
}
# The fixtures the plugin provides (testinfra's ``host`` is not ours when inactive).
SPARK_FIXTURES = (CLUSTER_FIXTURES - {"host"}) | API_FIXTURES | {"spark_settings", "spark_check"}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _active(config: pytest.Config) -> bool:
    return SETTINGS_KEY in config.stash


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    refuse_spaced_paths(config)  # before anything is collected or contacted
    # The suite's markers are declared even when inactive, so that collecting the suite
    # without a cluster ends in the usage error below, not in unknown-marker errors.
    for name, meaning in MARKERS.items():  # the report's CATEGORIES (a test holds them equal)
        config.addinivalue_line("markers", f"{name}: {meaning}")
    config.addinivalue_line(
        "markers",
        "spark_serving_verdict: this check fails when the cluster is not serving; while it "
        "runs, the checks that need the server skip naming the root cause",
    )
    config.addinivalue_line(
        "markers",
        "spark_reachability_verdict: this check fails when a node cannot be reached; while "
        "it runs, the checks that need that node skip naming it",
    )
    if asked_for(config) is None:  # installed, not asked for: a good neighbour
        config.pluginmanager.register(InactiveGuard(), "spark.inactive")
        return
    _installed_suite(config)
    _configure_active(config)


def _installed_suite(config: pytest.Config) -> None:
    """Collect from the suite that came with the package: all of it when there are no
    paths, no testpaths and no test files here; the checks named by node id (as the
    checkout and the report print them) when those paths do not exist here."""
    suite = suite_paths(config.rootpath)
    if not suite:
        return
    if config.args_source == pytest.Config.ArgsSource.INVOCATION_DIR:
        here = config.invocation_params.dir
        if not holds_tests(here, config.getini("python_files"), config.getini("norecursedirs")):
            config.args[:] = [str(path) for path in suite]
            config.stash[SUITE_KEY] = suite
        return
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return
    base = suite_base(suite)
    kept, selectors = installed_selection(config.args, config.invocation_params.dir, base)
    if selectors:
        config.args[:] = [*kept, *(str(path) for path in suite)]
        config.stash[SUITE_KEY] = suite
        config.stash[SELECTED_KEY] = selectors
        config.pluginmanager.register(SuiteSelection(base, selectors), "spark.selection")


class SuiteSelection:
    """Node ids of the installed suite named on the command line: pytest collects the
    suite from where it is installed (so node ids stay ``tests_infra/...``), only the
    files they name, and keeps only the checks they name; a name that matches no check is
    a usage error, as pytest's own "not found"."""

    def __init__(self, base: Path, selectors: list[str]) -> None:
        self.base = base
        self.selectors = selectors

    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        try:
            rel = collection_path.relative_to(self.base).as_posix()
        except ValueError:
            return None  # the user's own paths
        return None if needed(rel, self.selectors) else True

    @pytest.hookimpl(tryfirst=True)  # before -m/-k deselect, so "not found" means not found
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        ours = [item for item in items if item.path.is_relative_to(self.base)]
        missing = [s for s in self.selectors if not any(selected(i.nodeid, [s]) for i in ours)]
        if missing:
            raise pytest.UsageError(
                *(
                    f"not found: {name} (no such check in the installed suite at {self.base}; "
                    "pytest --co -q with no paths lists its node ids)"
                    for name in missing
                )
            )
        dropped = [item for item in ours if not selected(item.nodeid, self.selectors)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        suite_ids = set(map(id, ours))
        kept = [item for item in ours if id(item) not in gone]
        # In the order of the command line, as pytest runs named paths (stable within one).
        kept.sort(key=lambda item: self._first_match(item.nodeid))
        items[:] = [item for item in items if id(item) not in suite_ids] + kept

    def _first_match(self, nodeid: str) -> int:
        return next(i for i, s in enumerate(self.selectors) if selected(nodeid, [s]))


def _configure_active(config: pytest.Config) -> None:
    """Asked for: fixtures, settings, the sim, the run directory, measurements, results
    and reports (imported here, not at the plugin's import)."""
    from pytest_spark import fixtures
    from pytest_spark.access.simcontrol import sim_attach, sim_up
    from pytest_spark.gathering.measure import MEASURE_KEY, Measurements
    from pytest_spark.readiness.reachability import LostNodes, VerdictFirst
    from pytest_spark.report import register as register_reports
    from pytest_spark.report.results import RESULTS_KEY, ResultsRecorder
    from pytest_spark.settings.resolve import resolve

    config.addinivalue_line("filterwarnings", "default::pytest_spark.verdict.SparkCheckWarning")
    config.pluginmanager.register(fixtures, "spark.fixtures")
    # NodeUnreachable out of a check: one failure per lost node, later checks skip citing it
    config.pluginmanager.register(
        LostNodes(lambda: config.stash.get(CLUSTER_KEY, None)), "spark.lost"
    )
    # test_node_reachable runs first and whatever the selection (-m link, -k, -x)
    config.pluginmanager.register(
        VerdictFirst(lambda item: bool(set(getattr(item, "fixturenames", ())) & CLUSTER_FIXTURES)),
        "spark.reachability",
    )
    settings = resolve(config)
    if settings.sim:
        if _is_worker(config):
            sim = sim_attach(Path(config.workerinput[SIM_INFO]))  # type: ignore[attr-defined]
        else:
            engine = settings.sim_engine
            sim = sim_up(settings.sim_nodes, () if engine == "emulator" else ("--engine", engine))
        config.stash[SIM_KEY] = sim
        settings = settings.replace(
            head=sim.head, workers=sim.workers, ssh_config=sim.ssh_config, user="root"
        )
        launch = sim.info.get("launch")
        if launch:  # how the sim says it is served; the user's own settings win
            hints = {
                "launch": True,
                "launch_script": launch["script"],
                "image": launch["image"],
                "container": launch["container"],
                "port": launch["port"],
                "serve_args": launch["serve_args"],
                "model_dir": launch.get("model_dir"),
                "ray": {"ray": "on", "no-ray": "off"}.get(launch.get("mode", "")),
            }
            settings = settings.replace(
                **{
                    k: v
                    for k, v in hints.items()
                    if v is not None and settings.source(k) == "default"
                }
            )
    config.stash[SETTINGS_KEY] = settings
    if _is_worker(config):
        config.stash[RUN_DIR_KEY] = Path(config.workerinput[RUN_DIR])  # type: ignore[attr-defined]
    else:
        config.stash[RUN_DIR_KEY] = Path(tempfile.mkdtemp(prefix="pytest-spark-run-"))
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(), "spark.xdist")
    # Measurements once per session; in an xdist worker also shared and in isolation.
    worker = config.workerinput["workerid"] if _is_worker(config) else None  # type: ignore[attr-defined]
    measurements = Measurements(
        config.stash[RUN_DIR_KEY], worker or "main", shared=worker is not None
    )
    config.stash[MEASURE_KEY] = measurements
    if worker is not None:
        config.pluginmanager.register(measurements, "spark.measure")
    if not _is_worker(config):
        recorder = ResultsRecorder(
            config, settings.results, cluster_info(settings), config.stash[RUN_DIR_KEY]
        )
        config.stash[RESULTS_KEY] = recorder
        config.pluginmanager.register(recorder, "spark.results")
    register_reports(config)  # HTML, history, terminal summary, redaction (pytest_spark/report)
    if not _is_worker(config) and threading.current_thread() is threading.main_thread():
        config.stash[SIGTERM_KEY] = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (CI cancelling a job) ends the session like Ctrl-C: teardown runs, the
    launched cluster is stopped, the report and JSON are written, exit code 2."""
    raise KeyboardInterrupt(f"signal {signum}")


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
            e.to_json() for e in server_expectations(settings.profile, settings.source("threshold"))
        ],
    }


class XdistHooks:
    """Only registered when pytest-xdist is present."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[RUN_DIR] = str(node.config.stash[RUN_DIR_KEY])
        sim = node.config.stash.get(SIM_KEY, None)
        if sim is not None:
            node.workerinput[SIM_INFO] = str(sim.state_dir / "cluster.json")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Controller only: stop what --spark-launch started, once, whatever happened."""
    config = session.config
    if _is_worker(config) or RUN_DIR_KEY not in config.stash:
        return
    settings = config.stash[SETTINGS_KEY]
    if not settings.head:
        return
    from pytest_spark.access.cluster import Cluster
    from pytest_spark.readiness.session import stop_if_launched

    try:
        cluster = config.stash.get(CLUSTER_KEY, None) or Cluster(settings)
        problem = stop_if_launched(cluster, config.stash[RUN_DIR_KEY], settings.keep)
    except Exception as exc:  # teardown must never cost the report and the JSON
        problem = f"could not stop the launched cluster: {type(exc).__name__}: {exc}"
    if problem:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"pytest-dgx-spark teardown: {problem}", red=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    previous = config.stash.get(SIGTERM_KEY, None)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
    cluster = config.stash.get(CLUSTER_KEY, None)
    if cluster is not None:
        cluster.close()
    if SETTINGS_KEY in config.stash:  # active: the measurements exist (not imported inert)
        from pytest_spark.gathering.measure import MEASURE_KEY

        measurements = config.stash.get(MEASURE_KEY, None)
        if measurements is not None:
            measurements.close()
    sim = config.stash.get(SIM_KEY, None)
    if sim is not None:
        sim.down()
    run_dir = config.stash.get(RUN_DIR_KEY, None)
    if run_dir is not None and not _is_worker(config):
        shutil.rmtree(run_dir, ignore_errors=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = set(metafunc.fixturenames)
    if not names & CLUSTER_FIXTURES or not _active(metafunc.config):
        return
    settings = metafunc.config.stash[SETTINGS_KEY]
    if not settings.head:
        return  # reported once, at collection end
    from pytest_spark.access.cluster import node_names

    if names & NODE_FIXTURES:
        ids = [name for name, _, _ in node_names(settings)]
        metafunc.parametrize("_spark_node", ids, ids=ids, indirect=True, scope="session")
    if "spark_twin" in names:
        ifs = settings.fabric_ifs
        count = len(ifs) or settings.profile.link.fabric_twins
        twin_ids = list(ifs) if ifs else [f"twin{i}" for i in range(count)]
        metafunc.parametrize("spark_twin", list(range(count)), ids=twin_ids, scope="session")


def pytest_itemcollected(item: pytest.Item) -> None:
    """The check's category is its closest category marker (a test's own mark wins over
    its module's)."""
    if not _active(item.config):
        return
    from pytest_spark.report.results import CATEGORIES, CATEGORY_PROP

    item.config.stash[COLLECTED_KEY] = item.config.stash.get(COLLECTED_KEY, 0) + 1
    for mark in item.iter_markers():
        if mark.name in CATEGORIES:
            item.user_properties.append((CATEGORY_PROP, mark.name))
            return


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if not _active(config):
        return
    from pytest_spark.readiness.reachability import REACHABILITY_VERDICT_KEY
    from pytest_spark.readiness.serving import SERVING_VERDICT_KEY

    config.stash[SERVING_VERDICT_KEY] = any(
        item.get_closest_marker("spark_serving_verdict") for item in session.items
    )
    config.stash[REACHABILITY_VERDICT_KEY] = any(
        item.get_closest_marker("spark_reachability_verdict") for item in session.items
    )
    if config.stash.get(COLLECTED_KEY, 0) == 0 and not session.testsfailed:
        raise pytest.UsageError(_nothing_collected(config))


def _nothing_collected(config: pytest.Config) -> str:
    """Asked to check a cluster, pytest found no checks: say where it looked, and how to
    point it at the suite (never a silent "no tests ran")."""
    looked = ", ".join(config.args) or str(config.invocation_params.dir)
    suite = config.stash.get(SUITE_KEY, None)
    if suite is not None:
        where = f"the installed suite at {', '.join(map(str, suite))} holds no tests"
        fix = "reinstall pytest-dgx-spark (its wheel carries tests_infra/ and tests_e2e/)"
    elif not suite_paths(config.rootpath):
        where = f"no tests in {looked}, and this pytest-dgx-spark install carries no suite"
        fix = (
            "install pytest-dgx-spark from its wheel or checkout (pip install PATH; an "
            "editable install runs the suite only inside its checkout), or name the files "
            "that hold your checks"
        )
    else:
        where = f"no tests in {looked}"
        fix = (
            "run pytest with no paths to run the installed suite (tests_infra/, tests_e2e/), "
            "or name the files or directories that hold your checks"
        )
    return f"pytest-dgx-spark: a cluster was asked for but no checks were collected: {where}. {fix}"


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    if _active(config):
        from pytest_spark.settings.expectations import expectations_lines

        settings = config.stash[SETTINGS_KEY]
        lines += expectations_lines(settings.profile, settings.source("threshold"))
    suite = config.stash.get(SUITE_KEY, None)
    if suite is None:
        return lines
    picked = config.stash.get(SELECTED_KEY, None)
    if picked:
        lines.append(
            f"pytest-dgx-spark: {', '.join(picked)}: not in {config.invocation_params.dir}, "
            f"selected from the installed suite ({', '.join(map(str, suite))})"
        )
    else:
        lines.append(
            f"pytest-dgx-spark: no paths given: running the installed suite "
            f"({', '.join(map(str, suite))}); name paths to run other checks"
        )
    return lines


def _cluster_usage_error(needy: list[pytest.Item]) -> pytest.UsageError:
    return pytest.UsageError(
        "these tests check a cluster: give --spark-head=HOST (the head node's management "
        "address or ssh_config alias), --spark-api-url=URL for the serving checks alone, "
        "or --spark-sim to run them against the embedded simulated cluster "
        f"({len(needy)} tests need it, e.g. {needy[0].nodeid})"
    )


class InactiveGuard:
    """Registered instead of everything else when the plugin is not asked for: tests that
    use the plugin's fixtures get a usage error saying how to ask for it; every other
    test runs exactly as without the plugin."""

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        needy = [i for i in items if set(getattr(i, "fixturenames", ())) & SPARK_FIXTURES]
        if needy:
            raise _cluster_usage_error(needy)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _active(config):
        return
    settings = config.stash[SETTINGS_KEY]
    if settings.head:
        return
    cluster_tests = [i for i in items if set(getattr(i, "fixturenames", ())) & CLUSTER_FIXTURES]
    if settings.api_url:
        skip = pytest.mark.skip(
            reason="needs the cluster's nodes (--spark-head): only the "
            "API was given (--spark-api-url)"
        )
        for item in cluster_tests:
            item.add_marker(skip)
        return
    needy = cluster_tests + [i for i in items if set(getattr(i, "fixturenames", ())) & API_FIXTURES]
    if needy:
        raise _cluster_usage_error(needy)
