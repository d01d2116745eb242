"""--spark-show-profile (issue #36 item 2): every threshold in effect with its value, unit
and source, at 80 columns, and nothing contacted; --help lists the built-in profiles from
their folder and says how thresholds and lists are written."""

from __future__ import annotations

import re
from pathlib import Path

import nocontact
import pytest

from pytest_spark.settings.options import OPTIONS_BY_ATTR
from pytest_spark.settings.parsers import thresholds
from pytest_spark.settings.profiles import (
    BUILTIN_PROFILES,
    ProfileError,
    builtin_profiles,
    load_profile,
)
from pytest_spark.settings.sections import known_keys
from pytest_spark.settings.show import shown_value, unit_of

contacts = nocontact.contacts  # the fixture: what a run attempted to reach
PROFILE_DIR = Path(__file__).resolve().parent.parent / "pytest_spark" / "settings" / "profiles"


def rows(text: str) -> dict[str, list[str]]:
    """{key: [value, unit, source]} of the table (a long key's fields on the next line)."""
    found: dict[str, list[str]] = {}
    lines = text.splitlines()
    keys = set(known_keys())
    for i, line in enumerate(lines):
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if first not in keys:
            continue
        rest = line[len(first) :].split(maxsplit=2)
        if not rest:  # a key longer than its column: its fields follow
            rest = lines[i + 1].split(maxsplit=2)
        found[first] = rest
    return found


def show(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, list[str]]]:
    result = pytester.runpytest("--spark-show-profile", *args)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    return result, rows(result.stdout.str())


def test_every_key_has_a_unit_or_says_it_has_none() -> None:
    missing = [key for key in known_keys() if unit_of(key) is None]
    assert not missing, f"name their units in settings/sections.py UNITS: {missing}"
    assert unit_of("link.min_rate_gbps") == "Gb/s"  # a link's rate: bits
    assert unit_of("nccl.min_busbw_gbps") == "GB/s"  # nccl-tests' busbw: bytes
    assert unit_of("readiness.ready_timeout_s") == "s"
    assert unit_of("tool_calls.expected") == "-"


def test_values_are_shown_as_the_command_line_writes_them() -> None:
    assert shown_value((1, 4, 16)) == "1,4,16"
    assert shown_value(200.0) == "200" and shown_value(0.09) == "0.09"
    assert shown_value(None) == "none" and shown_value(True) == "true"
    assert shown_value(()) == "[]"


def test_default_profile_with_no_head_contacts_nothing(
    pytester: pytest.Pytester, contacts: list[str]
) -> None:
    pytester.makepyfile("def test_never_run():\n    raise AssertionError('collected and run')\n")
    result, table = show(pytester)
    out = result.stdout.str()
    assert out.startswith("pytest-dgx-spark thresholds: profile dgx-spark-2node")
    assert "Qwen3.5-122B-A10B-FP8" in out  # what the built-in is for
    assert set(table) == set(known_keys())  # every key, once
    assert table["link.min_rate_gbps"] == ["200", "Gb/s", "built-in dgx-spark-2node"]
    assert table["throughput.concurrency"] == ["1,4,16", "reqs", "built-in dgx-spark-2node"]
    assert table["structured_output.expected"] == ["true", "-", "default"]  # no file sets it
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "collected and run" not in out and "test session starts" not in out
    assert contacts == []


def test_an_unreachable_head_is_not_contacted(
    pytester: pytest.Pytester, contacts: list[str]
) -> None:
    _, table = show(pytester, "--spark-head=198.18.255.9", "--spark-workers=198.18.255.10")
    assert table["link.fabric_twins"][0] == "2"
    assert contacts == []


def test_sim_shows_the_sim_profile_without_bringing_it_up(
    pytester: pytest.Pytester, contacts: list[str]
) -> None:
    result, table = show(pytester, "--spark-sim")
    result.stdout.fnmatch_lines(["*profile sim", "*chosen by: default for --spark-sim"])
    assert table["nccl.min_busbw_gbps"][2] == "built-in sim"
    assert table["link.min_rate_gbps"][2] == "built-in dgx-spark-2node"  # sim extends it
    assert contacts == []  # no spark-sim process, no SSH


def test_a_file_with_extends_names_the_file_that_set_each_key(
    pytester: pytest.Pytester, contacts: list[str]
) -> None:
    path = pytester.path / "lab.toml"
    path.write_text(
        'name = "lab"\nextends = "sim"\n[link]\nmin_rate_gbps = 100\n'
        '[accuracy]\ncanaries = ["add", "count"]\n'
    )
    result, table = show(pytester, f"--spark-profile={path}")
    result.stdout.fnmatch_lines(
        [
            "pytest-dgx-spark thresholds: profile lab",
            "*chosen by: command line --spark-profile",
            "*files, later ones win: built-in profile dgx-spark-2node, built-in profile sim,*",
        ]
    )
    assert str(path) in result.stdout.str()  # the header names the file's path
    assert table["link.min_rate_gbps"] == ["100", "Gb/s", "file lab.toml"]
    assert table["accuracy.canaries"] == ["add,count", "-", "file lab.toml"]
    assert table["nccl.min_busbw_gbps"] == ["0.09", "GB/s", "built-in sim"]
    assert table["link.min_mtu"] == ["4200", "bytes", "built-in dgx-spark-2node"]
    assert table["long_context.fill"] == ["0.9", "ratio", "default"]
    assert contacts == []


def test_ini_env_and_command_line_are_named(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, contacts: list[str]
) -> None:
    pytester.makeini("[pytest]\nspark_threshold = nccl.iters=7\n  throughput.concurrency=2,8\n")
    result, table = show(pytester)
    assert table["nccl.iters"] == ["7", "iters", "ini spark_threshold"]
    assert table["throughput.concurrency"] == ["2,8", "reqs", "ini spark_threshold"]
    result.stdout.fnmatch_lines(["*given: spark_threshold in tox.ini"])

    monkeypatch.setenv("SPARK_THRESHOLD", "nccl.iters=9")
    monkeypatch.setenv("SPARK_READY_TIMEOUT", "10m")
    result, table = show(pytester)
    assert table["nccl.iters"] == ["9", "iters", "SPARK_THRESHOLD"]
    assert table["throughput.concurrency"][2] == "built-in dgx-spark-2node"  # env wins whole
    assert table["readiness.ready_timeout_s"] == ["600", "s", "SPARK_READY_TIMEOUT"]

    result, table = show(
        pytester,
        "--spark-threshold=throughput.concurrency=1,4,slo.ttft_s=2",
        "--spark-hang-timeout=90",
    )
    assert table["throughput.concurrency"] == ["1,4", "reqs", "--spark-threshold"]
    assert table["slo.ttft_s"] == ["2", "s", "--spark-threshold"]
    assert table["nccl.iters"][2] == "built-in dgx-spark-2node"
    assert table["readiness.hang_timeout_s"] == ["90", "s", "--spark-hang-timeout"]
    assert table["readiness.ready_timeout_s"] == ["600", "s", "SPARK_READY_TIMEOUT"]
    assert contacts == []


def test_a_setting_mistake_is_still_a_usage_error(
    pytester: pytest.Pytester, contacts: list[str]
) -> None:
    result = pytester.runpytest("--spark-show-profile", "--spark-threshold=link.min_rat=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown threshold 'link.min_rat'*"])
    assert contacts == []


@pytest.mark.parametrize("written", ["1,4", "1;4", "[1,4]", "[1, 4]"])
def test_a_list_threshold_is_written_as_it_reads(written: str) -> None:
    overrides = thresholds(f"throughput.concurrency={written},link.min_rate_gbps=100")
    profile = load_profile("sim").with_overrides(overrides)
    assert profile.throughput.concurrency == (1, 4)
    assert profile.link.min_rate_gbps == 100.0


def test_how_lists_are_written_is_said_when_one_is_not() -> None:
    with pytest.raises(ValueError, match=r"a list: throughput\.concurrency=1,4,16 \(or 1;4;16"):
        thresholds("4,throughput.concurrency=1")
    with pytest.raises(ProfileError, match=r"command line KEY=1,4 or KEY=1;4 or KEY=\[1,4\]"):
        load_profile("sim").with_overrides({"throughput.concurrency": "1,x"})


def test_the_builtin_profiles_are_the_folder() -> None:
    files = {path.stem for path in PROFILE_DIR.glob("*.toml")}
    assert set(builtin_profiles()) == files
    assert set(BUILTIN_PROFILES) == files, "BUILTIN_PROFILES is stale: read builtin_profiles()"
    assert next(iter(builtin_profiles())) == "dgx-spark-2node"  # the real cluster's first


def test_help_lists_every_profile_and_says_how_thresholds_are_written(
    pytester: pytest.Pytester,
) -> None:
    out = re.sub(r"\s+", " ", pytester.runpytest("--help").stdout.str())
    profile_help = out[out.index("--spark-profile=NAME|PATH") : out.index("--spark-threshold=")]
    for name, description in builtin_profiles().items():
        assert f"{name}: {description}" in profile_help, name
    for path in PROFILE_DIR.glob("*.toml"):
        assert path.stem in profile_help
    threshold_help = out[out.index("--spark-threshold=") : out.index("--spark-fabric-ifs=")]
    assert "link.min_rate_gbps=100" in threshold_help
    assert "throughput.concurrency=1,4,16 (or 1;4;16 or [1,4,16])" in threshold_help
    assert "--spark-show-profile" in threshold_help
    compare_help = out[out.index("--spark-compare-fail=") :]
    compare_help = compare_help[: compare_help.index("--spark-soak=")]
    assert "startup" in compare_help and "load" not in compare_help.replace("load time", "")
    assert "--spark-show-profile print every threshold" in out
    assert OPTIONS_BY_ATTR["compare_fail"].parse("load:10%") == (("load", 10.0),)  # still read


def test_a_recipe_names_the_keys_it_sets(pytester: pytest.Pytester, contacts: list[str]) -> None:
    source = Path(__file__).resolve().parent.parent / "fixtures/sparkrun/recipes"
    # a checkout's path may be long (CI's is): the header wraps at spaces, never in the path
    path = pytester.path / ("deep-" * 12) / "sim-qwen3.5-2node.yaml"
    path.parent.mkdir()
    path.write_text((source / path.name).read_text())
    result, table = show(pytester, f"--spark-recipe={path}")
    header = " ".join(result.stdout.str().split())
    assert f"given: recipe {path} " in header, result.stdout.str()
    assert any(line.strip() == str(path) for line in result.stdout.lines), result.stdout.str()
    assert table["reasoning.expected"][2] == "recipe sim-qwen3.5-2node.yaml"
    assert table["link.min_rate_gbps"][2] == "built-in dgx-spark-2node"
    assert contacts == []
