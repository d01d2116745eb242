"""Node ids of the installed suite named from a directory that does not hold them
(``pytest --spark-sim tests_infra/test_links.py::test_x[spark-head]`` from an empty
directory): which arguments name the suite, which checks they select, which files pytest
must collect. The installed run itself: tests/suite/test_wheel_suite.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.suitedir import installed_selection, needed, selected, suite_base

pytestmark = pytest.mark.unit

LINK = "tests_infra/test_links.py"
IDS = [
    f"{LINK}::test_link_up[spark-head-twin0]",
    f"{LINK}::test_link_up[spark-worker-1-twin0]",
    f"{LINK}::test_link_rate[spark-head-twin0]",
    f"{LINK}::TestRoce::test_gid[spark-head]",
    "tests_infra/test_preflight.py::test_docker[spark-head]",
    "tests_e2e/test_readiness.py::test_cluster_serving",
]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    suite = tmp_path / "site" / "pytest_spark" / "suite"
    for name in ("tests_infra/test_links.py", "tests_infra/test_preflight.py"):
        (suite / name).parent.mkdir(parents=True, exist_ok=True)
        (suite / name).write_text("")
    (suite / "tests_e2e").mkdir()
    return suite


def test_paths_missing_here_name_the_installed_suite(base: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [LINK, f"./{LINK}::test_link_up[spark-head-twin0]", "tests_e2e", "mine/test_x.py"]
    kept, selectors = installed_selection(args, empty, base)
    assert selectors == [LINK, f"{LINK}::test_link_up[spark-head-twin0]", "tests_e2e"]
    assert kept == ["mine/test_x.py"]  # not in the suite: pytest says "not found" as usual


def test_a_local_path_is_the_users_and_wins(base: Path, tmp_path: Path) -> None:
    here = tmp_path / "project"
    (here / "tests_infra").mkdir(parents=True)
    (here / LINK).write_text("def test_mine(): pass\n")
    kept, selectors = installed_selection([LINK, "tests_infra/test_preflight.py"], here, base)
    assert kept == [LINK] and selectors == ["tests_infra/test_preflight.py"]


def test_only_the_suites_folders_are_looked_up(base: Path, tmp_path: Path) -> None:
    (base / "tests_infra" / "__init__.py").write_text("")
    (base.parent / "plugin.py").write_text("")
    args = ["../plugin.py", "/abs/tests_infra", "-k", "x", "tests_infra/nope.py"]
    kept, selectors = installed_selection(args, tmp_path, base)
    assert selectors == [] and kept == args


def test_selection_follows_pytests_node_id_rules() -> None:
    def pick(*selectors: str) -> list[str]:
        return [nodeid for nodeid in IDS if selected(nodeid, selectors)]

    assert pick(f"{LINK}::test_link_up[spark-head-twin0]") == IDS[:1]
    assert pick(f"{LINK}::test_link_up") == IDS[:2]  # every parametrization
    assert pick(f"{LINK}::TestRoce") == IDS[3:4]  # a class's methods
    assert pick(f"{LINK}::test_link") == []  # a name, not a prefix
    assert pick(LINK) == IDS[:4]
    assert pick("tests_infra") == IDS[:5]
    assert pick("tests_e2e", f"{LINK}::test_link_rate") == [IDS[2], IDS[5]]


def test_only_the_named_files_are_collected() -> None:
    selectors = [f"{LINK}::test_link_up[spark-head-twin0]", "tests_e2e"]
    assert needed(".", selectors) and needed("tests_infra", selectors)
    assert needed(LINK, selectors) and needed("tests_e2e/test_readiness.py", selectors)
    assert needed("tests_infra/conftest.py", selectors)
    assert not needed("tests_infra/test_preflight.py", selectors)
    assert not needed("tests_infra_extra", ["tests_infra"])


def test_node_ids_are_relative_to_the_wheels_suite_or_the_checkout(tmp_path: Path) -> None:
    assert suite_base([tmp_path / "suite"]) == tmp_path / "suite"
    assert suite_base([tmp_path / "tests_infra", tmp_path / "tests_e2e"]) == tmp_path


def test_skip_lines_name_the_suites_path_not_site_packages(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed-suite mode from an empty directory: the skip line says
    ``tests_infra/test_x.py:LINE``, not the long site-packages path it was collected from."""
    import pytest_spark.suitedir

    suite = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "pytest_spark" / "suite"
    (suite / "tests_infra").mkdir(parents=True)
    (suite / "tests_e2e").mkdir()
    (suite / "tests_infra" / "test_x.py").write_text(
        "import pytest\n\ndef test_s():\n    pytest.skip('needs x')\n"
    )
    monkeypatch.setattr(pytest_spark.suitedir, "suite_paths", lambda rootpath: [suite])
    result = pytester.runpytest(
        "-rs", "-p", "no:cacheprovider", "--spark-api-url=http://127.0.0.1:1/v1"
    )
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] tests_infra/test_x.py:4: needs x"])
    assert "site-packages" not in result.stdout.str().split("short test summary info")[-1]
