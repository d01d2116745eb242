"""Where the suite (``tests_infra/``, ``tests_e2e/``) lives: inside the installed package,
or beside it in a checkout.

What it holds: the categories of its checks (markers, report rows), and which of its
checks the command line selects when the suite is the installed one.

The wheel carries the suite as ``pytest_spark/suite/tests_infra`` and ``.../tests_e2e``
(pyproject.toml maps them from the checkout's top level). pytest names a file outside its
rootdir relative to the initial path that holds it, so collecting ``pytest_spark/suite``
gives the same node ids as the checkout: ``tests_infra/test_links.py::...``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

SUITE_DIRS = ("tests_infra", "tests_e2e")
PACKAGE = Path(__file__).resolve().parent
SUITE_KEY = pytest.StashKey[list[Path]]()  # the installed suite, when collection went there
SELECTED_KEY = pytest.StashKey[list[str]]()  # node ids named from the installed suite

# The suite's categories, one table: each is a marker (declared even while the plugin is
# inert, so collecting the suite without a cluster ends in a usage error, not in unknown-
# marker errors) and a row of the report, in this order (report.results.CATEGORIES).
CATEGORY_MARKERS = {
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
    "load": "open-loop load, the soak and the depth sweep, by option (--spark-open-loop, "
    "--spark-soak, --spark-depth-sweep)",
    "context": "prefix cache and long context (max_model_len) end to end",
}
# The markers of the checks that own a root cause (their dependants skip citing them).
VERDICT_MARKERS = {
    "spark_serving_verdict": "this check fails when the cluster is not serving; while it "
    "runs, the checks that need the server skip naming the root cause",
    "spark_reachability_verdict": "this check fails when a node cannot be reached; while "
    "it runs, the checks that need that node skip naming it",
}


def suite_paths(rootpath: Path, package: Path = PACKAGE) -> list[Path]:
    """The paths to collect for the whole suite ([] when there is none to run)."""
    bundled = package / "suite"
    if all((bundled / name).is_dir() for name in SUITE_DIRS):
        return [bundled]  # the wheel: one initial path, so node ids keep tests_infra/...
    checkout = package.parent  # an editable install: the checkout, when pytest runs in it
    if rootpath == checkout and all((checkout / name).is_dir() for name in SUITE_DIRS):
        return [checkout / name for name in SUITE_DIRS]  # node ids relative to the rootdir
    return []


def holds_tests(root: Path, python_files: Sequence[str], norecursedirs: Sequence[str]) -> bool:
    """Whether pytest, collecting ``root``, would find a test file there: a file matching
    ``python_files`` outside the ``norecursedirs`` folders and virtualenvs (pytest's own
    rules, read from its ini values). Stops at the first one."""
    for dirpath, dirnames, filenames in os.walk(root):
        if any(fnmatch(name, pattern) for name in filenames for pattern in python_files):
            return True
        dirnames[:] = [
            name
            for name in dirnames
            if not any(fnmatch(name, pattern) for pattern in norecursedirs)
            and not os.path.exists(os.path.join(dirpath, name, "pyvenv.cfg"))
        ]
    return False


def suite_base(paths: Sequence[Path]) -> Path:
    """The directory the suite's node ids are relative to: ``pytest_spark/suite`` in the
    wheel, the checkout in an editable install (``paths`` from :func:`suite_paths`)."""
    return paths[0] if len(paths) == 1 else paths[0].parent


def installed_selection(args: Sequence[str], cwd: Path, base: Path) -> tuple[list[str], list[str]]:
    """Split the command line's paths into the user's own and node ids of the installed
    suite: ``tests_infra/test_links.py`` or ``tests_e2e/test_x.py::test_y[spark-head]``
    as the checkout and the report print them. An argument names the installed suite only
    when its path does not exist in ``cwd`` (a local path is the user's and wins) and does
    under ``base``. Returns (args kept as given, node ids selected from the suite)."""
    kept: list[str] = []
    selectors: list[str] = []
    for arg in args:
        path, sep, rest = arg.partition("::")
        norm = os.path.normpath(path).replace(os.sep, "/") if path else ""
        if (
            not norm
            or arg.startswith("-")
            or os.path.isabs(path)
            or (cwd / path).exists()
            or norm.split("/", 1)[0] not in SUITE_DIRS
            or not (base / norm).exists()
        ):
            kept.append(arg)
        else:
            selectors.append(norm + sep + rest)
    return kept, selectors


def selected(nodeid: str, selectors: Sequence[str]) -> bool:
    """Whether ``nodeid`` is what one of the selectors names, by pytest's rules: a file or
    directory holds every check under it, ``file::name`` every parametrization of ``name``
    (and every method of a class), ``file::name[id]`` that one check."""
    path = nodeid.partition("::")[0]
    for selector in selectors:
        if "::" in selector:
            if nodeid == selector or nodeid.startswith((selector + "::", selector + "[")):
                return True
        elif path == selector or path.startswith(selector + "/"):
            return True
    return False


def needed(rel: str, selectors: Sequence[str]) -> bool:
    """Whether pytest must collect the suite's file or directory ``rel`` (relative to the
    suite's base, ``/``-separated) for the selectors: it holds one of them, or is in one."""
    if rel in ("", ".") or rel.rsplit("/", 1)[-1] in ("__init__.py", "conftest.py"):
        return True  # the suite's root, and what its packages and folders need to load
    for selector in selectors:
        path = selector.partition("::")[0]
        if rel == path or path.startswith(rel + "/") or rel.startswith(path + "/"):
            return True
    return False


def select_installed_suite(config: pytest.Config) -> None:
    """Collect from the suite that came with the package: all of it when there are no
    paths, no testpaths and no test files here; the checks named by node id (as the
    checkout and the report print them) when those paths do not exist here."""
    suite = suite_paths(config.rootpath)
    if not suite:
        return
    shorten = SuiteRelativeSkips(suite_base(suite))
    if config.args_source == pytest.Config.ArgsSource.INVOCATION_DIR:
        here = config.invocation_params.dir
        if not holds_tests(here, config.getini("python_files"), config.getini("norecursedirs")):
            config.args[:] = [str(path) for path in suite]
            config.stash[SUITE_KEY] = suite
            config.pluginmanager.register(shorten, "spark.suite-relative-skips")
        return
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return
    base = suite_base(suite)
    kept, selectors = installed_selection(config.args, config.invocation_params.dir, base)
    if selectors:
        config.args[:] = [*kept, *(str(path) for path in suite)]
        config.stash[SUITE_KEY] = suite
        config.stash[SELECTED_KEY] = selectors
        config.pluginmanager.register(shorten, "spark.suite-relative-skips")
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


def nothing_collected(config: pytest.Config) -> str:
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


# -m's words that name no marker: and, or, not, and a marker's keyword arguments (pytest 8.3's
# -m "mark(key=value)"), dropped before the names are read.
_MARK_KWARGS = re.compile(r"\([^()]*=[^()]*\)")
_MARK_NAME = re.compile(r"[\w:+\-.\[\]\\/]+")


def unknown_markers(
    config: pytest.Config, items: Sequence[pytest.Item] | None = None
) -> str | None:
    """The usage error when ``-m`` names a marker that is not registered and that no
    collected check has (``-m linkk``: every check deselected, a silent "no tests ran"),
    with the closest categories; None when every name is known. A name under ``not`` is
    left alone (``-m "not slow"`` deselects nothing it does not have). Before collection
    (``items`` None: MarkerTypos, before the session contacts a node) only a name close to
    a category counts; a user's own unregistered marker waits for the collected items."""
    expression = config.getoption("markexpr", default="") or ""
    words = _MARK_NAME.findall(_MARK_KWARGS.sub("", expression))
    names = {w for i, w in enumerate(words) if w not in _BOOLEAN and words[i - 1 : i] != ["not"]}
    known = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    known |= {mark.name for item in items or () for mark in item.iter_markers()}
    categories = list(CATEGORY_MARKERS)
    close = {name: difflib.get_close_matches(name, categories, n=2) for name in names - known}
    unknown = sorted(name for name in close if items is not None or close[name])
    if not unknown:
        return None
    hint = dict.fromkeys(c for name in unknown for c in close[name])
    did = f"did you mean {' or '.join(hint)}? " if hint else ""
    return (
        f"-m {expression!r}: no check has the marker {', '.join(map(repr, unknown))} and none "
        f"is registered: {did}the categories are {', '.join(categories)} "
        "(pytest --markers lists every marker)"
    )


class MarkerTypos:
    """``-m`` naming a category's typo (``-m linkk``) is a usage error at session start,
    before anything is contacted (the attached layout is found there); registered by the
    active plugin, after its role, so that its tryfirst hook runs first."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        problem = unknown_markers(session.config)
        if problem:
            raise pytest.UsageError(problem)


_BOOLEAN = frozenset({"and", "or", "not"})


def suite_header(config: pytest.Config) -> list[str]:
    """The report header's line on the installed suite, when collection went there."""
    suite = config.stash.get(SUITE_KEY, None)
    if suite is None:
        return []
    lines = []
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


def suite_relative(path: str, base: Path) -> str:
    """``tests_infra/test_x.py`` for a file of the installed suite under ``base``; any
    other path as given."""
    for candidate in (Path(path), Path(path).resolve()):
        try:
            return candidate.relative_to(base).as_posix()
        except ValueError:
            continue
    return path


class SuiteRelativeSkips:
    """Registered when pytest collects the installed suite: a skip's location is said as
    the suite names it (``tests_infra/test_x.py:LINE``), not as a ``site-packages`` path
    (pytest's skip lines, the report and the JSON read it from the report's longrepr)."""

    def __init__(self, base: Path) -> None:
        self.base = base.resolve()

    def _shorten(self, report: Any) -> None:
        longrepr = report.longrepr
        if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3:
            path, line, reason = longrepr
            report.longrepr = (suite_relative(str(path), self.base), line, reason)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: Any) -> None:
        self._shorten(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: Any) -> None:
        self._shorten(report)


# Which collected checks need a cluster (or its API): the fixtures that reach it. The
# inactive plugin refuses them with a usage error; the active one parametrizes them per node.
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
# The checks that need the server: the serving verdict (test_cluster_serving) is put back
# for them whatever the selection (readiness.reachability.VerdictFirst).
SERVER_FIXTURES = API_FIXTURES | {"spark_serving", "spark_serving_state"}
# The fixtures the plugin provides (testinfra's ``host`` is not ours when inactive).
SPARK_FIXTURES = (CLUSTER_FIXTURES - {"host"}) | API_FIXTURES | {"spark_settings", "spark_check"}


def item_fixtures(item: pytest.Item) -> set[str]:
    return set(getattr(item, "fixturenames", ()))


def cluster_usage_error(needy: list[pytest.Item]) -> pytest.UsageError:
    return pytest.UsageError(
        "these tests check a cluster: give --spark-head=HOST (the head node's management "
        "address or ssh_config alias), --spark-api-url=URL for the serving checks alone, "
        "or --spark-sim to run them against the embedded simulated cluster "
        f"({len(needy)} tests need it, e.g. {needy[0].nodeid})"
    )
