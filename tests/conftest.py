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
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Whole-suite runs that need no root: tests_e2e in subprocesses against emulators.
SUITE_FILES = ("test_serving_suite.py",)


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


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(Path(str(item.path)), item.get_closest_marker("sim") is not None)
        if tier != "sim":  # the sim tier is the sim marker itself
            item.add_marker(getattr(pytest.mark, tier))
