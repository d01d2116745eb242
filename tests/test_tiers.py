"""The self-test tiers (tests/conftest.py): which tier a test file is in, and which modules
are one xdist work unit in the suite tier (their tests read one module-scoped run)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent


def tiers() -> ModuleType:
    """tests/conftest.py under a name of its own (``conftest`` is several modules here)."""
    spec = importlib.util.spec_from_file_location("self_test_tiers", TESTS / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tier_of_follows_the_path_and_the_sim_marker() -> None:
    t = tiers()
    assert t.tier_of(TESTS / "test_options.py", needs_sim=False) == "unit"
    assert t.tier_of(TESTS / "sim" / "test_nodes.py", needs_sim=True) == "sim"
    assert t.tier_of(TESTS / "suite" / "test_xdist.py", needs_sim=True) == "suite"
    assert t.tier_of(TESTS / "test_serving_suite.py", needs_sim=False) == "suite"


def test_shared_run_modules_are_one_work_unit_each() -> None:
    """Under xdist (``--dist loadgroup``) a shared-run module's tests are one unit, every
    other test a unit of its own."""
    t = tiers()
    for relative in t.SHARED_RUN_MODULES:
        path = TESTS / relative
        assert path.exists(), f"{relative} in SHARED_RUN_MODULES is not there"
        assert t.tier_of(path, needs_sim=True) == "suite", relative
        module = f"tests/{relative}"
        assert t.work_unit(f"{module}::test_a[x-y]") == module
        assert t.work_unit(f"{module}::test_b") == module
    for relative in t.ORDERED_MODULES:
        assert (TESTS / relative).exists(), f"{relative} in ORDERED_MODULES is not there"
        module = f"tests/{relative}"
        assert t.work_unit(f"{module}::test_a[healthy]") == module
        assert t.work_unit(f"{module}::test_a[fault]") == module
    matrix = "tests/suite/test_fault_matrix.py"
    assert t.work_unit(f"{matrix}::test_fault[healthy-launch]") == matrix
    other = "tests/suite/test_link_suite.py::test_spark_sim_option_stands_up_and_tears_down"
    assert t.work_unit(other) == other
    assert (
        t.work_unit("tests_infra/test_links.py::test_link_up")
        == "tests_infra/test_links.py::test_link_up"
    )


# A module-scoped fixture that runs what the module's tests select (one run for them all).
SHARED_RUN = re.compile(r'@pytest\.fixture\(scope="module"\)[^@]*?request\.session\.items', re.S)


def test_every_suite_module_with_one_run_for_its_tests_is_one_unit() -> None:
    """Under xdist a module whose tests read one module-scoped run must stay on one worker;
    split, each worker would run it again (the matrix's rows, the emulator scenarios)."""
    t = tiers()
    candidates = sorted(TESTS.glob("suite/test_*.py")) + [TESTS / f for f in t.SUITE_FILES]
    shared = {
        p.relative_to(TESTS).as_posix() for p in candidates if SHARED_RUN.search(p.read_text())
    }
    assert shared, "no module-scoped run found: the pattern no longer matches"
    assert shared == set(t.SHARED_RUN_MODULES), shared


def test_a_test_that_brings_up_a_sim_is_a_sim_test_marked_or_not() -> None:
    t = tiers()
    assert t.needs_sim(False, ["healthy_sim", "tmp_path"])
    assert t.needs_sim(False, ("sim",)) and t.needs_sim(True, [])
    assert not t.needs_sim(False, ["tmp_path", "monkeypatch"])
