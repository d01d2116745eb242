"""Where the suite (``tests_infra/``, ``tests_e2e/``) lives: inside the installed package,
or beside it in a checkout.

The wheel carries the suite as ``pytest_spark/suite/tests_infra`` and ``.../tests_e2e``
(pyproject.toml maps them from the checkout's top level). pytest names a file outside its
rootdir relative to the initial path that holds it, so collecting ``pytest_spark/suite``
gives the same node ids as the checkout: ``tests_infra/test_link.py::...``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

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
