"""Installed but not asked for, the plugin changes nothing: testinfra's ``host``,
``--hosts=...`` and other suites behave as without it. Asked for (a ``--spark-*`` option,
or ``--spark-head`` / ``--spark-api-url`` / ``--spark-sim`` through an env or ini twin),
it is active."""

from __future__ import annotations

import pytest

PLAIN_TESTINFRA = """
def test_local(host):
    assert type(host.backend).__module__ == "testinfra.backend.local"
    assert host.run("echo neighbour").stdout.strip() == "neighbour"
"""

PLAIN = """
import signal

def test_untouched(pytestconfig):
    from pytest_spark.state import SETTINGS_KEY
    assert SETTINGS_KEY not in pytestconfig.stash
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert not pytestconfig.pluginmanager.has_plugin("spark.fixtures")
"""

ACTIVE = """
def test_x(spark_node):
    pass
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("SPARK_HEAD", "SPARK_API_URL", "SPARK_SIM", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_plain_testinfra_suite_with_hosts(pytester: pytest.Pytester, clean_env: object) -> None:
    pytester.makepyfile(PLAIN_TESTINFRA)
    result = pytester.runpytest_subprocess("--hosts=local://")
    result.assert_outcomes(passed=1)
    assert "pytest-dgx-spark" not in result.stdout.str()


def test_plain_suite_untouched_even_with_stray_spark_env(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    # Another option's variable (even a bad value) does not ask for the plugin.
    clean_env.setenv("SPARK_CONNECT_TIMEOUT", "12x")
    pytester.makepyfile(PLAIN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "pytest-dgx-spark" not in result.stdout.str()


def test_suite_fixtures_without_a_cluster_say_how_to_ask(
    pytester: pytest.Pytester, clean_env: object
) -> None:
    pytester.makepyfile(ACTIVE)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*give --spark-head=HOST*--spark-api-url=URL*--spark-sim*"])


@pytest.mark.parametrize(
    ("how", "args"),
    [
        ("option", ["--spark-head=198.18.250.1"]),
        ("env", []),
        ("ini", []),
    ],
)
def test_asked_for_the_plugin_is_active(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch, how: str, args: list[str]
) -> None:
    if how == "env":
        clean_env.setenv("SPARK_HEAD", "198.18.250.1")
    if how == "ini":
        pytester.makeini("[pytest]\nspark_head = 198.18.250.1\n")
    pytester.makepyfile(ACTIVE)
    result = pytester.runpytest("--collect-only", "-q", *args)  # nothing is contacted
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_x[[]spark-head[]]"])


def test_spark_option_replaces_testinfra_host(pytester: pytest.Pytester, clean_env: object) -> None:
    """Asked for, ``host`` is each cluster node (the suite's own SSH connection)."""
    pytester.makepyfile(PLAIN_TESTINFRA)
    result = pytester.runpytest("--collect-only", "-q", "--spark-head=198.18.250.1")
    result.stdout.fnmatch_lines(["*test_local[[]spark-head[]]"])


def test_bad_sim_env_twin_names_the_variable(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("SPARK_SIM", "maybe")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*Invalid value 'maybe' for spark_sim from environment SPARK_SIM*"]
    )
