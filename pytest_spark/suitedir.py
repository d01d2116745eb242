"""Where the suite (``tests_infra/``, ``tests_e2e/``) lives: inside the installed package,
or beside it in a checkout.

The wheel carries the suite as ``pytest_spark/suite/tests_infra`` and ``.../tests_e2e``
(pyproject.toml maps them from the checkout's top level). pytest names a file outside its
rootdir relative to the initial path that holds it, so collecting ``pytest_spark/suite``
gives the same node ids as the checkout: ``tests_infra/test_links.py::...``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

SUITE_DIRS = ("tests_infra", "tests_e2e")
PACKAGE = Path(__file__).resolve().parent


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
