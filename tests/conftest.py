"""The self-test tiers, assigned by where a test lives and what it needs (no file moves):

- ``unit``: no root, no sim: parsers, checks, settings, the report, the emulator in
  process, the sim's parts as plain code. Minutes on 2 cores.
- ``sim``: needs root and a sparksim (the ``sim`` marker), outside ``tests/suite``.
- ``suite``: whole-suite runs: against sparksim (``sim``-marked tests under
  ``tests/suite``: the fault matrix, xdist, the node audit, the blackhole...) and
  tests_e2e against emulators (tests/test_serving_suite.py, no root needed).

The ``sim`` marker keeps its meaning (needs root), so it also holds the suite tier:
``-m unit``, ``-m "sim and not suite"``, ``-m suite`` select the tiers, and
``scripts/run-tests --tier unit|sim|suite`` runs one of them (all three without it).

The suite tier runs on xdist workers (``--dist loadgroup``), each with a sim of its own
(the session ``sim`` fixture is per process). A module whose tests share one module-scoped
run (the fault matrix's lanes, the emulator scenarios) is one work unit: one worker runs
all of it, once; every other test is a unit of its own, taken by whichever worker is free.
The units are made here (``pytest_xdist_make_scheduler``), not by ``xdist_group`` marks:
xdist 3.8 carries a mark's group in the node id it rewrites, which pytest 9.2's node ids
no longer take (pytest-dev/pytest-xdist#1386), so marked tests would be split silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
# Whole-suite runs that need no root: tests_e2e in subprocesses against emulators.
SUITE_FILES = ("test_serving_suite.py",)
# Modules whose tests read one module-scoped run: under xdist, all on one worker.
SHARED_RUN_MODULES = (
    "suite/test_fault_matrix.py",
    "suite/test_switch_suite.py",
    "test_serving_suite.py",
)
# Modules whose later tests read an earlier one's result (the sparkrun jobs table: the
# healthy row's skips are the other rows' baseline) or attach to the serving stack an
# earlier one kept up (the NCCL suite: one launch, not three): one unit too; split, they
# would skip, or launch again on each worker.
ORDERED_MODULES = ("suite/test_sparkrun_faults.py", "suite/test_nccl_suite.py")


def tier_of(path: Path, needs_sim: bool) -> str:
    """``suite`` for a sim test under tests/suite and for SUITE_FILES, ``sim`` for any other
    sim test, else ``unit``."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        parts = ()
    if parts in {(name,) for name in SUITE_FILES}:
        return "suite"
    if not needs_sim:
        return "unit"
    return "suite" if parts[:1] == ("suite",) else "sim"


# Fixtures that bring up a sparksim (tests/sim, tests/sim_serving, tests/suite): a test
# requesting one needs root and is a sim test, marked or not (four such modules once ran
# their sims in the unit tier).
SIM_FIXTURES = frozenset({"sim", "healthy_sim", "slow_sim"})


def needs_sim(marked: bool, fixturenames: list[str] | tuple[str, ...]) -> bool:
    return marked or bool(SIM_FIXTURES & set(fixturenames))


# The unit tier's longest tests, run first so that the other worker fills the time: mypy
# over the package is ~50 s in a fresh clone (no .mypy_cache) and came last, alphabetically.
LONGEST_FIRST = (
    "test_settings_typed.py::test_mypy_strict_passes_and_sees_the_settings_types",
    "test_packaging.py::test_checkout_collects_the_suite_once_and_selects_as_before",
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marked = item.get_closest_marker("sim") is not None
        if needs_sim(marked, getattr(item, "fixturenames", ())) and not marked:
            item.add_marker(pytest.mark.sim)
        tier = tier_of(Path(str(item.path)), item.get_closest_marker("sim") is not None)
        if tier != "sim":  # the sim tier is the sim marker itself
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda item: not item.nodeid.endswith(LONGEST_FIRST))  # stable


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its module for SHARED_RUN_MODULES and
    ORDERED_MODULES, else the test."""
    module = nodeid.split("::", 1)[0]
    shared = {f"{TESTS.name}/{r}" for r in (*SHARED_RUN_MODULES, *ORDERED_MODULES)}
    return module if module in shared else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: LoadScopeScheduling over :func:`work_unit` (the biggest unit,
    the fault matrix, is handed out first). Other modes: xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedRunScheduling(config, log)
