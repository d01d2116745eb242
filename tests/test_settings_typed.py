"""Typed settings: the options table and Settings' fields agree, values are checked against
the fields' types, and mypy --strict passes on the package and sees every setting's type."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from pytest_spark.settings.options import OPTIONS, OPTIONS_BY_ATTR, Option
from pytest_spark.settings.profiles import Profile, load_profile
from pytest_spark.settings.resolve import Settings, conforms, defaults

ROOT = Path(__file__).resolve().parent.parent
HINTS = typing.get_type_hints(Settings)
OPTION_FIELDS = [f for f in dataclasses.fields(Settings) if f.name != "sources"]


def test_one_field_per_option_in_table_order() -> None:
    assert [f.name for f in OPTION_FIELDS] == [o.attr for o in OPTIONS]
    assert [f.name for f in dataclasses.fields(Settings)][-1] == "sources"


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.attr)
def test_the_default_and_the_parser_fit_the_field(option: Option) -> None:
    hint = HINTS[option.attr]
    if option.attr == "profile":  # --spark-profile NAME|PATH is loaded into a Profile
        assert hint is Profile
        assert typing.get_type_hints(option.parse)["return"] is str
        return
    assert conforms(option.default, hint), (option.attr, option.default, hint)
    returned = typing.get_type_hints(option.parse)["return"]
    optional = type(None) in typing.get_args(hint)  # str | None: the parser gives a str
    assert returned == hint or (optional and returned in typing.get_args(hint)), (
        option.attr,
        returned,
        hint,
    )


def test_secret_options_stay_out_of_the_repr() -> None:
    settings = defaults(load_profile("sim")).replace(api_key="sk-very-secret-0123")
    assert "sk-very-secret-0123" not in repr(settings)
    assert all(not f.repr for f in OPTION_FIELDS if OPTIONS_BY_ATTR[f.name].secret)


def test_replace_names_the_source_and_checks_the_type() -> None:
    base = defaults(load_profile("sim"))
    changed = base.replace(head="198.18.0.11", workers=("198.18.0.12",), port=8001)
    assert (changed.head, changed.workers, changed.port) == ("198.18.0.11", ("198.18.0.12",), 8001)
    assert changed.source("port") == "sparksim" and changed.source("model") == "default"
    with pytest.raises(
        TypeError, match=r"setting port = '8001' \(from sparksim\) is a str, expected <class 'int'>"
    ):
        base.replace(port="8001")
    with pytest.raises(TypeError, match=r"expected typing\.Literal"):
        base.replace(ray="maybe")
    with pytest.raises(TypeError):
        base.replace(no_such_setting=1)


@pytest.mark.parametrize(
    ("value", "hint", "ok"),
    [
        (1, int, True),
        (True, int, False),
        (1, float, False),
        (None, str | None, True),
        (("a", "b"), tuple[str, ...], True),
        (["a"], tuple[str, ...], False),
        ((("tok_s", 10.0),), tuple[tuple[str, float], ...], True),
        ((("tok_s", "10"),), tuple[tuple[str, float], ...], False),
        ({"a": "1"}, typing.Mapping[str, str], True),
        ({"a": 1}, typing.Mapping[str, str], False),
        ("on", typing.Literal["auto", "on", "off"], True),
        ("yes", typing.Literal["auto", "on", "off"], False),
        (Path("x"), Path | None, True),
        ("x", Path | None, False),
    ],
)
def test_conforms(value: object, hint: object, ok: bool) -> None:
    assert conforms(value, hint) is ok


MISUSE = """
from pytest_spark.settings.resolve import Settings


def misuse(settings: Settings) -> None:
    timeout: str = settings.ready_timeout
    settings.ready_timeot
    floor: int = settings.profile.nccl.min_busbw_gbps
    settings.profile.nccl.min_busbw_gbp
    if settings.ray == "yes":
        pass
"""
EXPECTED = [
    (
        'snippet.py:6: error: Incompatible types in assignment (expression has type "float", '
        'variable has type "str")'
    ),
    'snippet.py:7: error: "Settings" has no attribute "ready_timeot"',
    (
        'snippet.py:8: error: Incompatible types in assignment (expression has type "float", '
        'variable has type "int")'
    ),
    'snippet.py:9: error: "NcclSection" has no attribute "min_busbw_gbp"',
    "snippet.py:10: error: Non-overlapping equality check",
]


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        cwd=ROOT,  # pyproject's [tool.mypy]: strict, packages pytest_spark and sparksim
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_mypy_strict_passes_and_sees_the_settings_types(tmp_path: Path) -> None:
    """mypy --strict over the package (pyproject's [tool.mypy]; CI runs mypy only here),
    then over a snippet that misuses settings: its misuses are all the errors there are.
    The cache in .mypy_cache makes a rerun take seconds."""
    pytest.importorskip("mypy")
    package = _mypy()
    assert package.returncode == 0, "mypy --strict fails:\n" + package.stdout + package.stderr
    snippet = tmp_path / "snippet.py"
    snippet.write_text(MISUSE)
    result = _mypy(str(snippet))  # same options as above: the cache serves the package
    assert result.returncode == 1, result.stdout + result.stderr
    found = [
        line[line.index("snippet.py:") :]
        for line in result.stdout.splitlines()
        if ": error:" in line and "snippet.py:" in line
    ]
    for expected in EXPECTED:
        assert any(line.startswith(expected) for line in found), (expected, result.stdout)
    assert len(found) == len(EXPECTED), result.stdout
