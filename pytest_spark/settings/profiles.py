"""Threshold profiles: TOML files of named figures, built in or given by path.

A profile is one typed section per TOML table (``profile.nccl.min_busbw_gbps: float``).
Each file is validated when it is read: an unknown table or key, or a value of the wrong
type, is a ProfileError naming the file, the key, the value and the type expected; a key
that neither the file nor the profile it ``extends`` sets, and that has no default here, is
one too. ``--spark-threshold KEY=VALUE`` overrides one figure by its dotted key
(``nccl.max_bytes=4194304``), the raw text coerced to that figure's type.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_spark.settings.sections import (
    SECTIONS,
    ProfileSections,
    VersionRule,
    known_keys,
    section_hints,
)
from pytest_spark.settings.values import describe, from_text, from_toml, out_of_range, shown

BUILTIN_PROFILES = (
    "dgx-spark-2node",
    "dgx-spark-switch",
    "sim",
    "sim-switch",
    "sim-vllm-cpu",
    "generic",
    "spark-arena-v2",
)


class ProfileError(ValueError):
    """A profile that cannot be found or read, or a bad threshold override."""


@dataclass(frozen=True, kw_only=True)
class Profile(ProfileSections):
    """A threshold profile: one typed section per table (ProfileSections: the declaration),
    its name and where it came from."""

    name: str
    origin: str
    overridden: frozenset[str] = field(default_factory=frozenset)
    # {dotted key: the file that set it}: "built-in profile sim" or a path; a key no file
    # sets is at its default here (--spark-show-profile says which)
    set_by: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def value(self, key: str) -> object:
        """One figure by its dotted key (``nccl.max_bytes``), for --spark-threshold and
        the options that default to a figure. Code that knows the figure reads the
        attribute (``profile.nccl.max_bytes``)."""
        section, name = _split(key, self.name)
        return getattr(getattr(self, section), name)

    def with_overrides(self, overrides: Mapping[str, str]) -> Profile:
        """Override single figures; each raw string is coerced to the figure's type."""
        changed: dict[str, dict[str, object]] = {}
        for key, raw in overrides.items():
            section, name = _split(key, self.name)
            hint = section_hints(section)[name]
            try:
                value = from_text(raw, hint)
            except ValueError:
                raise ProfileError(f"threshold {key}={raw!r}: expected {describe(hint)}") from None
            wrong = out_of_range(key, value)
            if wrong:
                raise ProfileError(f"threshold {key}={raw!r}: {wrong}")
            changed.setdefault(section, {})[name] = value
        sections: dict[str, Any] = {
            s: replace(getattr(self, s), **values) for s, values in changed.items()
        }
        return replace(self, **sections, overridden=self.overridden | set(overrides))


_HEADER = ("name", "description", "extends")


def _split(key: str, profile: str) -> tuple[str, str]:
    section, _, name = key.partition(".")
    if section in SECTIONS and name in section_hints(section):
        return section, name
    if section in SECTIONS:  # a known table: its own keys, a handful
        close = difflib.get_close_matches(name, list(section_hints(section)), n=1)
        hint = f" (did you mean {section}.{close[0]}?)" if close else ""
        raise ProfileError(
            f"unknown threshold {key!r}{hint}; [{section}] has: {', '.join(section_hints(section))}"
        )
    close = difflib.get_close_matches(key, known_keys(), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ProfileError(
        f"unknown threshold {key!r}: {hint}a key is TABLE.KEY, the tables are "
        f"{', '.join(SECTIONS)} (profile {profile!r}; with a table's name right, its keys "
        "are listed)"
    )


def _validate(data: Mapping[str, object], origin: str) -> dict[str, dict[str, object]]:
    """One file's tables, each value converted to its key's type; errors name the file."""
    tables: dict[str, dict[str, object]] = {}
    for section, table in data.items():
        if section in _HEADER:
            continue
        if section not in SECTIONS:
            close = difflib.get_close_matches(section, list(SECTIONS), n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ProfileError(
                f"{origin}: unknown key {section!r}{hint}; a profile has the tables "
                f"{', '.join(f'[{s}]' for s in SECTIONS)} and name, description, extends"
            )
        if not isinstance(table, Mapping):
            raise ProfileError(
                f"{origin}: {section} = {shown(table)}: expected a table [{section}]"
            )
        hints = section_hints(section)
        converted: dict[str, object] = {}
        for key, value in table.items():
            if key not in hints:
                close = difflib.get_close_matches(key, list(hints), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ProfileError(
                    f"{origin}: unknown key [{section}] {key}{hint}; [{section}] has: "
                    f"{', '.join(hints)}"
                )
            try:
                converted[key] = from_toml(value, hints[key])
            except ValueError:
                raise ProfileError(
                    f"{origin}: [{section}] {key} = {shown(value)}: expected {describe(hints[key])}"
                ) from None
            wrong = out_of_range(f"{section}.{key}", converted[key])
            if wrong:
                raise ProfileError(f"{origin}: [{section}] {key} = {value!r}: {wrong}")
        tables[section] = converted
    for key in _HEADER:
        if key in data and not isinstance(data[key], str):
            raise ProfileError(f"{origin}: {key} = {shown(data[key])}: expected a string")
    return tables


@cache
def builtin_profiles() -> dict[str, str]:
    """``{name: description}`` of every built-in profile, read from the files in
    ``pytest_spark/settings/profiles/`` (the folder is the list): the real clusters' first,
    then sparksim's."""
    folder = resources.files("pytest_spark").joinpath("settings/profiles")
    names = [e.name.removesuffix(".toml") for e in folder.iterdir() if e.name.endswith(".toml")]
    found: dict[str, str] = {}
    for name in sorted(names, key=lambda n: (n.startswith("sim"), n)):
        data = tomllib.loads(folder.joinpath(f"{name}.toml").read_text())
        found[name] = str(data.get("description", ""))
    return found


def _read(
    ref: str, seen: tuple[str, ...] = ()
) -> tuple[str, str, dict[str, dict[str, object]], dict[str, str]]:
    """The profile's name, its origin, its tables (``extends`` merged) and which file
    set each key (``{"link.min_rate_gbps": "built-in profile dgx-spark-2node"}``)."""
    if ref in seen:
        raise ProfileError(f"profile {ref!r} extends itself (via {' -> '.join(seen)})")
    if ref in builtin_profiles():
        text = resources.files("pytest_spark").joinpath(f"settings/profiles/{ref}.toml").read_text()
        origin = f"built-in profile {ref}"
    else:
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ProfileError(
                f"no profile {ref!r}: not a built-in ({', '.join(builtin_profiles())}) "
                "and no such file"
            )
        origin = str(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            line = path.read_bytes()[: exc.start].count(b"\n") + 1
            raise ProfileError(
                f"{origin}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line "
                f"{line}): TOML files are UTF-8; save it as UTF-8"
            ) from None
        except OSError as exc:
            raise ProfileError(f"{origin}: cannot read it: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{origin}: invalid TOML: {exc}") from None
    own = _validate(data, origin)
    name = str(data.get("name", Path(ref).stem))
    tables: dict[str, dict[str, object]] = {}
    set_by: dict[str, str] = {}
    if "extends" in data:
        parent = str(data["extends"])
        try:
            tables, set_by = _read(parent, (*seen, ref))[2:]
        except ProfileError as exc:
            if not str(exc).startswith(f"no profile {parent!r}"):
                raise  # a mistake inside that profile: its message names its own file
            raise ProfileError(f"{origin}: extends = {parent!r}: {exc}") from None
    for section, values in own.items():
        table = tables.setdefault(section, {})
        for key, value in values.items():
            # rule lists ([[known_bad.deny]]) add to the parent's; other figures replace
            adds = section_hints(section)[key] == tuple[VersionRule, ...]
            table[key] = (*table.get(key, ()), *value) if adds else value  # type: ignore[misc]
            dotted = f"{section}.{key}"  # moved last: the setters' order is the chain's
            before = set_by.pop(dotted, None)
            set_by[dotted] = f"{before} + {origin}" if adds and before else origin
    return name, origin, tables, set_by


def load_profile(ref: str) -> Profile:
    """Load a built-in profile by name or a TOML file by path (``extends`` honoured)."""
    name, origin, tables, set_by = _read(ref)

    def given(section: str) -> dict[str, Any]:
        values = tables.get(section, {})
        for f in fields(SECTIONS[section]):
            if f.name not in values and f.default is MISSING and f.default_factory is MISSING:
                expected = describe(section_hints(section)[f.name])
                raise ProfileError(
                    f"{origin}: [{section}] {f.name} is not set ({expected}); set it, or "
                    'extend a built-in profile (extends = "dgx-spark-2node")'
                )
        return values

    sections: dict[str, Any] = {s: cls(**given(s)) for s, cls in SECTIONS.items()}
    return Profile(name=name, origin=origin, set_by=set_by, **sections)
