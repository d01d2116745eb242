"""The wheel carries the suite (tests_infra/, tests_e2e/) inside the package, and no
top-level tests_* package; every module of the product (setup.py computes the packages)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from pytest_spark.suitedir import SUITE_DIRS, holds_tests, suite_paths

REPO = Path(__file__).resolve().parents[1]


def build_wheel(out: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the working tree (tracked and untracked, not
    ignored), so the checkout's build/ and egg-info stay untouched; offline."""
    src = out / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)  # with its mode: the sim image's tools
    dist = out / "dist"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("-w", str(dist), str(src)),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = dist.glob("pytest_dgx_spark-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_package_list_is_computed_and_the_suite_mapped() -> None:
    """setup.py computes the packages (a new folder needs no line); pyproject maps the
    suite folders into the package and lists none by hand."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in config
    assert config["package-dir"] == {
        "pytest_spark.suite.tests_infra": "tests_infra",
        "pytest_spark.suite.tests_e2e": "tests_e2e",
    }


@pytest.mark.slow
def test_wheel_carries_every_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {
        str(p.relative_to(REPO))
        for package in ("pytest_spark", "sparksim")
        for p in (REPO / package).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules - names == set(), "modules the wheel leaves out (setup.py's packages)"
    assert "pytest_spark/infra/pcie/check.py" in names  # a topic no file lists by name


@pytest.mark.slow
def test_wheel_carries_the_suite_and_no_top_level_tests(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for folder in ("tests_infra", "tests_e2e"):
        shipped = {
            n.split("/", 3)[3] for n in names if n.startswith(f"pytest_spark/suite/{folder}/")
        }
        in_checkout = {
            str(p.relative_to(REPO / folder))
            for p in (REPO / folder).rglob("*.py")
            if "__pycache__" not in p.parts
        }
        assert shipped == in_checkout, folder
    assert not [n for n in names if n.split("/")[0].startswith("tests")]
    for data in (
        "sparksim/launcher/launch-cluster.sh",
        "sparksim/launcher/image/vllm",
        "pytest_spark/settings/profiles/sim.toml",
        "pytest_spark/report/templates/summary.html",
        "pytest_spark/report/templates/style.css",
    ):
        assert data in names


def test_suite_paths_wheel_and_checkout_layouts(tmp_path: Path) -> None:
    wheel_pkg = tmp_path / "site" / "pytest_spark"
    for name in SUITE_DIRS:
        (wheel_pkg / "suite" / name).mkdir(parents=True)
    assert suite_paths(tmp_path / "anywhere", wheel_pkg) == [wheel_pkg / "suite"]
    checkout = tmp_path / "checkout"
    (checkout / "pytest_spark").mkdir(parents=True)
    for name in SUITE_DIRS:
        (checkout / name).mkdir()
    package = checkout / "pytest_spark"
    assert suite_paths(checkout, package) == [checkout / name for name in SUITE_DIRS]
    # An editable install run outside its checkout: the checkout's own conftest.py and
    # self-tests are not the suite, so there is none to run.
    assert suite_paths(tmp_path / "elsewhere", package) == []


def test_holds_tests_follows_pytests_rules(tmp_path: Path) -> None:
    files, norecurse = ["test_*.py", "*_test.py"], ["build", ".*", "node_modules"]
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "test_x.py").write_text("")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "test_y.py").write_text("")
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "pyvenv.cfg").write_text("")
    (tmp_path / "env" / "test_z.py").write_text("")
    (tmp_path / "notes.py").write_text("")
    assert not holds_tests(tmp_path, files, norecurse)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "cluster_test.py").write_text("")
    assert holds_tests(tmp_path, files, norecurse)


def test_nothing_collected_with_a_cluster_asked_for_says_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SPARK_HEAD", "SPARK_API_URL", "SPARK_SIM", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    result = pytester.runpytest("--spark-api-url=http://127.0.0.1:9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*a cluster was asked for but no checks were collected: no tests in {pytester.path}*"]
    )


def _collected(*args: str) -> list[str]:
    """Node ids ``pytest --collect-only`` lists in the checkout (nothing is contacted)."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"),
            *("--spark-head=198.18.250.1", *args),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if "::" in line]


@pytest.mark.slow
def test_checkout_collects_the_suite_once_and_selects_as_before() -> None:
    ids = _collected()
    assert len(ids) == len(set(ids))
    assert {i.split("/")[0] for i in ids} == set(SUITE_DIRS)
    link = _collected("tests_infra/test_links.py")
    assert link and all(i.startswith("tests_infra/test_links.py::") for i in link)
    # -m link: the reachability verdicts come back and run first (issue #25 part 3)
    verdicts = [f"tests_infra/test_preflight.py::test_node_reachable[{n}]" for n in ("spark-head",)]
    marked = _collected("-m", "link")
    assert marked[: len(verdicts)] == verdicts
    # every link check, the link file's in its order; other topics' link checks beside it
    assert [i for i in marked if i.startswith("tests_infra/test_links.py::")] == link
    assert set(marked) <= set(ids) | set(verdicts)


@pytest.mark.slow
def test_infra_checks_come_before_the_serving_checks_and_accuracy_leads_those() -> None:
    """The serving checks are reordered among themselves only: the accuracy checks lead
    them and the soak ends them, while every infra check that needs no served model (links,
    GPU health and load, kernel, open files, nodes alike) keeps its place before the first
    serving check. With --spark-launch the first serving check starts the model's load:
    ranking the accuracy checks before everything put the link verdicts behind the load."""
    ids = _collected("--spark-workers=198.18.250.2")
    files = [i.split("::")[0] for i in ids]
    e2e = [n for n, f in enumerate(files) if f.startswith("tests_e2e/")]
    accuracy = [n for n, f in enumerate(files) if f == "tests_e2e/test_accuracy.py"]
    soak = [n for n, f in enumerate(files) if f == "tests_e2e/test_soak.py"]
    assert accuracy and soak and e2e[: len(accuracy)] == accuracy and e2e[-len(soak) :] == soak
    needs_no_model = {
        f"tests_infra/test_{m}.py" for m in ("links", "gpuhealth", "gpuload", "kernel", "fdlimit")
    } | {"tests_infra/test_alike.py"}
    before = [f for f in files[: e2e[0]] if f in needs_no_model]
    assert set(before) == needs_no_model
    assert all(files.index(f) < e2e[0] for f in needs_no_model)
