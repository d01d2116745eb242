"""A ``--spark-*`` value written with a space that names an existing path: pytest takes it
for a test path while it picks its rootdir (before the plugin's options exist), so the
run would use another rootdir, lose the project's ini and testpaths and collect the wrong
tests. It fails at start-up with the ``--opt=value`` fix, before anything is collected."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.settings.resolve import spaced_path_values


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """The working directory is a project (``proj/``) whose testpaths hold one check; the
    ssh_config lies outside it (as sparksim's does), beside a test that only a wrong
    rootdir would collect."""
    for name in ("SPARK_HEAD", "SPARK_API_URL", "SPARK_SIM", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    proj = pytester.mkdir("proj")
    (proj / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["checks"]\n')
    (proj / "checks").mkdir()
    (proj / "checks" / "test_mine.py").write_text("def test_mine():\n    pass\n")
    elsewhere = pytester.mkdir("elsewhere")
    (elsewhere / "ssh_config").write_text("Host *\n")
    (elsewhere / "test_wrong.py").write_text("def test_wrong():\n    raise AssertionError\n")
    monkeypatch.chdir(proj)
    return pytester


def test_spaced_path_value_fails_with_the_fix(project: pytest.Pytester) -> None:
    config = project.path / "elsewhere" / "ssh_config"
    result = project.runpytest("--spark-head", "198.18.250.1", "--spark-ssh-config", str(config))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*--spark-ssh-config {config}: pytest took the value for a test path*"
            f"rootdir {project.path}, ini file none*Write the value with '=': "
            f"--spark-ssh-config={config}"
        ]
    )
    assert "collected" not in result.stdout.str()
    assert "test_wrong" not in result.stdout.str()


def test_equals_form_keeps_the_projects_rootdir(project: pytest.Pytester) -> None:
    config = project.path / "elsewhere" / "ssh_config"
    result = project.runpytest(
        "--collect-only", "-q", "--spark-head=198.18.250.1", f"--spark-ssh-config={config}"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["checks/test_mine.py::test_mine"])
    assert "test_wrong" not in result.stdout.str()


def test_spaced_value_that_is_no_path_is_harmless(project: pytest.Pytester) -> None:
    result = project.runpytest("--collect-only", "-q", "--spark-head", "198.18.250.1")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["checks/test_mine.py::test_mine"])


def test_spaced_path_in_pytest_addopts_fails_too(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_ADDOPTS", "--spark-ssh-config ../elsewhere/ssh_config")
    result = project.runpytest("--spark-head=198.18.250.1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--spark-ssh-config=../elsewhere/ssh_config"])


def test_the_rule(tmp_path: Path) -> None:
    (tmp_path / "ssh_config").write_text("")
    (tmp_path / "models").mkdir()
    args = [
        "--spark-ssh-config",
        "ssh_config",  # an existing file: refused
        "--spark-results",
        "out.json",  # does not exist: pytest ignores it for the rootdir
        "--spark-head",
        "--spark-sim",  # not a value
        "--spark-model-dir",
        str(tmp_path / "models"),  # an existing directory, absolute
        "--spark-sim",
        "ssh_config",  # a flag takes no value: a real test path
        "--",
        "--spark-profile",
        "ssh_config",
    ]
    assert spaced_path_values(args, tmp_path) == [
        ("--spark-ssh-config", "ssh_config"),
        ("--spark-model-dir", str(tmp_path / "models")),
    ]
