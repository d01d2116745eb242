"""A figure's value from its text: a TOML value (a profile file) or a ``--spark-threshold``
string, converted to the type its section declares (settings/sections.py), or ValueError;
``describe`` says that type in words for the error, ``out_of_range`` why a value can never
be right. Pure: no files, no profile."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import TypeGuard

from pytest_spark.settings.sections import RULE_COMPONENTS, RULE_KEYS, Depths, VersionRule


def out_of_range(key: str, value: object) -> str | None:
    """Why a figure's value can never be right, or None: no figure is negative (a floor, a
    ceiling, a count, a duration), and a timeout of 0 s would fail every request."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, tuple):
            return next((out_of_range(key, v) for v in value if out_of_range(key, v)), None)
        return None
    if value != value:  # NaN
        return "not a number"
    if value < 0:
        return f"{value:g} is negative: expected 0 or more"
    if value == 0 and "timeout" in key.rpartition(".")[2]:
        return "a timeout of 0 s fails every request: expected a positive number of seconds"
    return None


def _inner(hint: object) -> object:
    """``float | None`` -> ``float`` (TOML has no null: a value given is the type itself)."""
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0]
    return hint


def describe(hint: object) -> str:
    hint = _inner(hint)
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint == tuple[VersionRule, ...]:
        return (
            "a list of tables ([[TABLE.KEY]] entries, set in a profile file), each with "
            f"component (one of {', '.join(RULE_COMPONENTS)}), match (a list of strings) and "
            "the strings reason, source, scope, fix"
        )
    if hint is Depths:
        return (
            "a list of integers, 0 or more (in a profile [0, 4096]; on the command line "
            f"{LIST_FORMS.format(0, 4096)})"
        )
    if hint == tuple[str, ...]:
        return (
            'a list of names (in a profile ["add", "count"]; on the command line '
            f"{LIST_FORMS.format('add', 'count')})"
        )
    if typing.get_origin(hint) is tuple:
        return (
            "a list of positive integers (in a profile [1, 4, 16]; on the command line "
            f"{LIST_FORMS.format(1, 4)})"
        )
    return str(hint)


def _positive_ints(value: object) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )


def _names(value: object) -> TypeGuard[list[str]]:
    """A list of names (possibly empty: "none of them")."""
    return isinstance(value, list) and all(
        isinstance(v, str) and v.strip() and v == v.strip() for v in value
    )


def from_toml(value: object, hint: object) -> object:
    """A TOML value as the type ``hint`` says, or ValueError (a boolean is no number)."""
    hint = _inner(hint)
    if isinstance(value, bool):
        if hint is bool:
            return value
    elif hint is int and isinstance(value, int):
        return value
    elif hint is float and isinstance(value, int | float):
        return float(value)
    elif hint == tuple[VersionRule, ...]:
        if isinstance(value, list):
            return tuple(_rule(v) for v in value)
    elif hint == tuple[str, ...]:
        if _names(value):
            return tuple(value)
    elif hint is Depths:
        if isinstance(value, list) and _positive_ints(  # 0 or more each
            [v + 1 if type(v) is int else v for v in value]
        ):
            return Depths(value)
    elif typing.get_origin(hint) is tuple and _positive_ints(value):
        return tuple(value)
    raise ValueError(hint)


def _rule(value: object) -> VersionRule:
    """One known-bad entry from its TOML table, or ValueError."""
    if not isinstance(value, Mapping) or not set(value) <= RULE_KEYS:
        raise ValueError(value)
    if value.get("component") not in RULE_COMPONENTS or not _names(value.get("match")):
        raise ValueError(value)
    if not all(isinstance(v, str) for k, v in value.items() if k != "match"):
        raise ValueError(value)
    return VersionRule(**{**value, "match": tuple(value["match"])})


# How a list is written in --spark-threshold (and its ini and env twins): the items
# separated by commas or semicolons, optionally in brackets.
LIST_FORMS = "KEY={0},{1} or KEY={0};{1} or KEY=[{0},{1}]"


def from_text(raw: str, hint: object) -> object:
    """A ``--spark-threshold`` value as the type ``hint`` says, or ValueError. A list is
    ``1,4``, ``1;4`` or ``[1,4]`` (names may be quoted: ``["add","count"]``)."""
    hint = _inner(hint)
    text = raw.strip()
    listed = typing.get_origin(hint) is tuple or (
        isinstance(hint, type) and issubclass(hint, tuple)
    )
    if listed and text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if hint is bool:
        low = text.lower()
        if low not in {"true", "false", "1", "0", "yes", "no"}:
            raise ValueError(raw)
        return low in {"true", "1", "yes"}
    if hint is int:
        return int(text)
    if hint is float:
        return float(text)
    if hint == tuple[str, ...]:
        names = [
            item.strip().strip("'\"")
            for item in text.replace(";", ",").split(",")
            if item.strip().strip("'\"")
        ]
        return from_toml(names, hint)
    if typing.get_origin(hint) is tuple or hint is Depths:
        items = [int(item) for item in text.replace(";", ",").split(",") if item.strip()]
        return from_toml(items, hint)
    raise ValueError(raw)


def shown(value: object) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    what = kind.get(type(value), "a list" if isinstance(value, list) else "a table")
    return f"{value!r} ({what})"
