"""A setting mistake exits as one (issue #36 item 3): pytest's usage-error status 4 and one
line that says what to do, before anything is contacted (no connection, no name lookup, no
process: ``contacts``), where the plugin once contacted a node or an API first, replaced a
setting without a word, leaked int()'s words or said nothing."""

from __future__ import annotations

import nocontact
import pytest

contacts = nocontact.contacts  # the fixture: what a run attempted to reach

HEAD = "198.18.255.9"  # in the sim's range, served by no one: never reached in these tests
CHECKS = """
import pytest

@pytest.mark.link
def test_link(spark_node):
    pass

@pytest.mark.mine(x=1)
def test_mine():
    pass

def test_api(spark_api):
    pass
"""


def one_usage_error(result: pytest.RunResult) -> str:
    """The usage error's one line (pytest prints ``ERROR: ...``)."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    return errors[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--spark-api-url=http://h:8000/v1/chat/completions"],
            "*--spark-api-url: that is the chat/completions endpoint, not the API's base URL: "
            "give the base URL, http://h:8000 (or http://h:8000/v1)*",
        ),
        (
            [f"--spark-api-url=http://{HEAD}:8000/v1/models/"],
            f"*models endpoint*give the base URL, http://{HEAD}:8000 (or*",
        ),
        (
            ["--spark-sim", f"--spark-head={HEAD}"],
            "*--spark-sim (from command line --spark-sim) stands up its own cluster and would "
            "replace --spark-head (from command line --spark-head): give one of them*",
        ),
        (
            ["--spark-sim-nodes=two"],
            "*Invalid value 'two' for spark_sim_nodes from command line --spark-sim-nodes: "
            "expected a whole number of nodes, 2 or more (e.g. --spark-sim-nodes=3)",
        ),
        (
            [f"--spark-head={HEAD}", "--spark-port=http"],
            "*spark_port*expected a TCP port number between 1 and 65535 (e.g. 8000)",
        ),
        (
            [f"--spark-head={HEAD}", "-m", "linkk"],
            "ERROR: -m 'linkk': no check has the marker 'linkk' and none is registered: did "
            "you mean link? the categories are preflight, link, nccl, *",
        ),
        (
            [f"--spark-head={HEAD}", "-m", "link or tool_cals"],
            "*no check has the marker 'tool_cals'*did you mean tool_calls?*",
        ),
        (
            ["--spark-api-url=http://127.0.0.1:9", "-m", "nosuch"],
            "*-m 'nosuch': no check has the marker 'nosuch' and none is registered: the "
            "categories are preflight, *",
        ),
        (
            [f"--spark-head={HEAD}", "--spark-threshold=throughput.concurrency=1,x"],
            "*threshold throughput.concurrency='1,x': expected a list of positive integers*"
            "KEY=1,4 or KEY=1;4 or KEY=?1,4?*",
        ),
    ],
    ids=[
        "endpoint-url",
        "models-endpoint",
        "sim-and-head",
        "sim-nodes-word",
        "port-word",
        "marker-typo",
        "marker-typo-in-expression",
        "marker-nobody-has",
        "list-threshold",
    ],
)
def test_a_mistake_is_one_usage_error_before_any_contact(
    pytester: pytest.Pytester, contacts: list[str], args: list[str], words: str
) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    line = one_usage_error(
        pytester.runpytest(*args, "-W", "ignore::pytest.PytestUnknownMarkWarning")
    )
    pytest.LineMatcher([line]).fnmatch_lines([words])
    assert "invalid literal" not in line
    assert contacts == []


def test_sim_with_workers_from_the_environment_names_them(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, contacts: list[str]
) -> None:
    monkeypatch.setenv("SPARK_WORKERS", "198.18.255.10")
    line = one_usage_error(pytester.runpytest("--spark-sim"))
    assert "--spark-workers (from environment SPARK_WORKERS)" in line
    assert contacts == []


def test_an_empty_spark_head_says_there_is_nothing_to_check(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, contacts: list[str]
) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    monkeypatch.setenv("SPARK_HEAD", "")
    line = one_usage_error(pytester.runpytest())
    assert line == (
        "ERROR: SPARK_HEAD is set but empty: pytest-dgx-spark has nothing to check. Give it a "
        "value (SPARK_HEAD=HOST, the head's address or ssh_config alias), or unset it to run "
        "without the plugin"
    )
    assert contacts == []


def test_an_empty_spark_head_beside_a_given_head_is_no_mistake(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, contacts: list[str]
) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    monkeypatch.setenv("SPARK_HEAD", "")
    pytester.runpytest("--spark-api-url=http://127.0.0.1:9").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "expression", ["not suite", "mine", "not linkk", "link and not mine", "mine(x=1)"]
)
def test_markers_that_exist_or_are_negated_select_as_before(
    pytester: pytest.Pytester, contacts: list[str], expression: str
) -> None:
    """Registered markers (suite), a user's own marker on a collected check (mine), and a
    name under ``not`` are not mistakes: the run goes on to select as pytest does."""
    pytester.makeini("[pytest]\nmarkers =\n    suite: the project's own tier\n")
    pytester.makepyfile(test_checks=CHECKS.replace("def test_link(spark_node)", "def test_link()"))
    result = pytester.runpytest(
        "--spark-api-url=http://127.0.0.1:9",
        *("-m", expression, "-k", "not api", "-W", "ignore::pytest.PytestUnknownMarkWarning"),
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert contacts == []


def test_the_contact_guard_sees_a_contact(pytester: pytest.Pytester, contacts: list[str]) -> None:
    """The control: a run that does reach for the API is seen (the guard can fail)."""
    pytester.makepyfile(test_checks="def test_api(spark_api):\n    pass\n")
    pytester.runpytest("--spark-api-url=http://127.0.0.1:9")
    assert contacts, "the guard saw nothing of a run that asks the API"


def test_under_xdist_a_typo_is_the_usage_error_and_no_other_name_an_internal_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """xdist's workers collect, the controller does not: the category's typo is caught in
    the controller at session start; another unknown name deselects as pytest does (a
    worker's usage error would be an INTERNALERROR)."""
    for name in nocontact.CLEARED:
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_checks="import pytest\n\n@pytest.mark.link\ndef test_x():\n    pass\n")
    api = "--spark-api-url=http://127.0.0.1:9"
    line = one_usage_error(pytester.runpytest("-n", "2", api, "-m", "linkk"))
    assert "did you mean link?" in line
    result = pytester.runpytest("-n", "2", api, "-m", "nosuch")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
