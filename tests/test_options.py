"""Options, their ini twins and env variables: precedence and error messages."""

from __future__ import annotations

import pytest

SHOW = """
import pytest

def test_show(pytestconfig):
    from pytest_spark.state import SETTINGS_KEY
    s = pytestconfig.stash[SETTINGS_KEY]
    print("VALUE", repr(s.connect_timeout), "FROM", s.source("connect_timeout"))
    print("PROFILE", s.profile.name, s.profile.link.min_rate_gbps, "FROM", s.source("profile"))
"""


@pytest.fixture
def show(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # Settings are resolved only when the plugin is asked for; the API URL asks for it
    # without naming nodes, and test_show contacts nothing.
    monkeypatch.setenv("SPARK_API_URL", "http://127.0.0.1:9")
    pytester.makepyfile(test_show=SHOW)
    return pytester


def test_default_is_used_and_named(show: pytest.Pytester) -> None:
    result = show.runpytest("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*VALUE 10.0 FROM default", "PROFILE dgx-spark-2node 200.0 FROM default"]
    )


def test_precedence_cli_over_env_over_ini(
    show: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    show.makeini("[pytest]\nspark_connect_timeout = 3\n")
    result = show.runpytest("-s")
    result.stdout.fnmatch_lines(["*VALUE 3.0 FROM spark_connect_timeout in tox.ini"])

    monkeypatch.setenv("SPARK_CONNECT_TIMEOUT", "4s")
    result = show.runpytest("-s")
    result.stdout.fnmatch_lines(["*VALUE 4.0 FROM environment SPARK_CONNECT_TIMEOUT"])

    result = show.runpytest("-s", "--spark-connect-timeout=500ms")
    result.stdout.fnmatch_lines(["*VALUE 0.5 FROM command line --spark-connect-timeout"])


def test_pyproject_ini_is_read(show: pytest.Pytester) -> None:
    show.makepyprojecttoml('[tool.pytest.ini_options]\nspark_connect_timeout = "7"\n')
    result = show.runpytest("-s")
    result.stdout.fnmatch_lines(["*VALUE 7.0 FROM spark_connect_timeout in pyproject.toml"])


def test_bad_value_names_its_source(show: pytest.Pytester) -> None:
    show.makepyprojecttoml('[tool.pytest.ini_options]\nspark_connect_timeout = "12x"\n')
    result = show.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*Invalid value '12x' for spark_connect_timeout from spark_connect_timeout in "
            "pyproject.toml*"
        ]
    )


def test_bad_env_value_names_the_variable(
    show: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_CONNECT_TIMEOUT", "-1")
    result = show.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*Invalid value '-1'*environment SPARK_CONNECT_TIMEOUT*positive*"])


def test_profile_by_name_and_threshold_override(show: pytest.Pytester) -> None:
    result = show.runpytest("-s", "--spark-threshold", "link.min_rate_gbps=100")
    result.stdout.fnmatch_lines(["PROFILE dgx-spark-2node 100.0 FROM default"])


def test_threshold_option_repeats(pytester: pytest.Pytester) -> None:
    """Given twice, both overrides hold (not only the last one)."""
    pytester.makepyfile(
        test_show="""
from pytest_spark.state import SETTINGS_KEY

def test_show(pytestconfig):
    p = pytestconfig.stash[SETTINGS_KEY].profile
    print("T", p.link.min_rate_gbps, p.nccl.max_bytes, p.throughput.concurrency)
"""
    )
    result = pytester.runpytest(
        "-s",
        "--spark-threshold=link.min_rate_gbps=100",
        "--spark-threshold",
        "nccl.max_bytes=4194304,throughput.concurrency=1;4",
    )
    result.stdout.fnmatch_lines(["*T 100.0 4194304 (1, 4)"])


def test_profile_from_file_extends_builtin(show: pytest.Pytester) -> None:
    path = show.path / "lab.toml"
    path.write_text('name = "lab"\nextends = "dgx-spark-2node"\n[link]\nmin_rate_gbps = 100\n')
    result = show.runpytest("-s", f"--spark-profile={path}")
    result.stdout.fnmatch_lines(["PROFILE lab 100.0 FROM command line --spark-profile"])


def test_unknown_threshold_lists_the_known_ones(show: pytest.Pytester) -> None:
    result = show.runpytest("--spark-threshold", "link.min_rate=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*unknown threshold 'link.min_rate'*link.min_rate_gbps*command line --spark-threshold*"]
    )


def test_missing_profile_is_a_usage_error(show: pytest.Pytester) -> None:
    result = show.runpytest("--spark-profile", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no profile 'nope'*dgx-spark-2node, dgx-spark-switch, *sim*"])


def test_cluster_tests_without_head_are_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(spark_node):\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*give --spark-head=HOST*--spark-sim*"])


def test_unrelated_tests_run_without_head(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.runpytest().assert_outcomes(passed=1)


def test_help_lists_every_option_with_ini_and_env(pytester: pytest.Pytester) -> None:
    from pytest_spark.settings.options import OPTIONS

    result = pytester.runpytest("--help")
    out = result.stdout.str()
    for option in OPTIONS:
        assert option.cli in out
        assert option.env in out.replace("\n", " ").replace("  ", " ") or option.env in out


# Bad input refused where it enters, in the suite's words (issue #25 section 5).
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--spark-threshold=link.min_rate_gbps=-5"],
            "*threshold link.min_rate_gbps='-5': -5 is negative: expected 0 or more*",
        ),
        (
            ["--spark-head=10.0.0.1", "--spark-workers=10.0.0.2,10.0.0.1"],
            "*the head '10.0.0.1' (from command line --spark-head) is also given as a worker*",
        ),
        (
            ["--spark-workers=,, ,"],
            "*Invalid value ',, ,' for spark_workers*names no host (only commas and spaces)*",
        ),
        (
            ["--spark-soak=forever"],
            "*Invalid value 'forever' for spark_soak*expected a duration such as 90s or 30m*",
        ),
        (
            ["--spark-container=vllm node;rm"],
            "*Invalid value 'vllm node;rm' for spark_container*not a container name docker "
            "accepts*",
        ),
        (
            ["--spark-fabric-ifs=enp1s0f1np1,enp1s0f1np1:0/x"],
            "*Invalid value * for spark_fabric_ifs*'enp1s0f1np1:0/x' is not a network "
            "interface name*",
        ),
        (
            ["--spark-ssh-key=/nonexistent/id_ed25519"],
            "*Invalid value '/nonexistent/id_ed25519' for spark_ssh_key*"
            "/nonexistent/id_ed25519: no such file*",
        ),
    ],
    ids=[
        "negative-figure",
        "worker-is-head",
        "empty-workers",
        "soak-forever",
        "container-grammar",
        "interface-grammar",
        "missing-key",
    ],
)
def test_bad_input_is_refused_at_start_up(
    show: pytest.Pytester, args: list[str], words: str
) -> None:
    result = show.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([words])
    assert "could not convert" not in result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_unknown_threshold_does_not_list_every_key(show: pytest.Pytester) -> None:
    result = show.runpytest("--spark-threshold=lnk.min_rate_gbps=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown threshold 'lnk.min_rate_gbps': did you mean *"])
    text = result.stderr.str()
    assert "link.min_rate_gbps" in text  # the closest key
    assert "metrics_health.max_drain_s" not in text  # not all ~120 of them
    assert len(text) < 1000, text


def test_profile_not_utf8_is_one_line(show: pytest.Pytester) -> None:
    path = show.path / "latin1.toml"
    path.write_bytes('# caf\u00e9 profile\nextends = "dgx-spark-2node"\n'.encode("latin-1"))
    result = show.runpytest(f"--spark-profile={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{path}: not UTF-8 text (byte 0xe9 on line 1)*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_bad_extends_names_the_file_that_holds_it(show: pytest.Pytester) -> None:
    path = show.path / "lab.toml"
    path.write_text('name = "lab"\nextends = "dgx-spark-2nod"\n')
    result = show.runpytest(f"--spark-profile={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{path}: extends = 'dgx-spark-2nod': no profile*"])
