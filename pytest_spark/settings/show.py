"""``--spark-show-profile``: every threshold in effect, one line each: its key (as
``--spark-threshold`` writes it), its value, its unit and where the value came from (the
built-in profile or the file that set it, following ``extends``; the plugin's default where
no file sets it; ``--spark-threshold`` or an option such as ``--spark-ready-timeout``
through the command line, the environment or the ini file). Reads settings only: nothing
is contacted.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_spark.settings.options import OPTIONS
from pytest_spark.settings.profiles import builtin_profiles
from pytest_spark.settings.resolve import Settings, resolve
from pytest_spark.settings.sections import SECTIONS, VersionRule, known_keys, section_hints

# A figure's unit, read from its name's ending (``_s``, ``_gib``, ``_pct`` ...), or named
# by its section's UNITS (settings/sections.py) where the name does not say it. ``-``: no
# unit (a boolean, a list of names, a seed, a shape parameter). Every key resolves
# (tests/test_show_profile.py): a new key ends in one of SUFFIXES or is in its UNITS.
SUFFIXES = (
    ("_busbw_gbps", "GB/s"),  # nccl-tests' bus bandwidth: gigabytes per second
    ("_rate_gbps", "Gb/s"),  # a link's rate: gigabits per second (ethtool's 200000Mb/s)
    ("_gbs", "GB/s"),
    ("_tok_s_1", "tok/s"),
    ("_tok_s_4", "tok/s"),
    ("_tok_s", "tok/s"),
    ("_req_s", "req/s"),
    ("_p90_s_1", "s"),
    ("_ms", "ms"),
    ("_us", "us"),
    ("_s", "s"),
    ("_gib", "GiB"),
    ("_mhz", "MHz"),
    ("_temp_c", "degC"),
    ("_bytes", "bytes"),
    ("_tokens", "tokens"),
    ("_ratio", "ratio"),
    ("_share", "ratio"),
    ("_pct", "%"),
)


def unit_of(key: str) -> str | None:
    """The unit of a dotted key (``-`` for none), or None when nothing says it."""
    section, _, name = key.partition(".")
    if name in SECTIONS[section].UNITS:
        return SECTIONS[section].UNITS[name]
    if section_hints(section).get(name) is bool:
        return "-"
    return next((unit for suffix, unit in SUFFIXES if name.endswith(suffix)), None)


@dataclass(frozen=True)
class Row:
    key: str
    value: str
    unit: str
    source: str  # as the row shows it (short_source)
    given: str | None = None  # the full source of a value given by an option (no file)


def shown_value(value: object) -> str:
    """A value as ``--spark-threshold`` takes it (a list as ``1,4,16``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"
    if isinstance(value, tuple):
        if not value:
            return "[]"
        if all(isinstance(v, VersionRule) for v in value):
            return f"{len(value)} ({','.join(sorted({v.component for v in value}))})"
        return ",".join(shown_value(v) for v in value)
    return str(value)


def short_source(source: str, files: Mapping[str, str] | None = None) -> str:
    """A source as a row shows it: ``command line --spark-threshold`` -> ``--spark-threshold``,
    ``environment SPARK_THRESHOLD`` -> ``SPARK_THRESHOLD``, ``spark_threshold in tox.ini``
    -> ``ini spark_threshold``, ``built-in profile sim`` -> ``built-in sim``, a profile
    file's path -> ``file NAME`` (the header names its path; ``files``: path -> NAME)."""
    for prefix in ("command line ", "environment "):
        if source.startswith(prefix):
            return source.removeprefix(prefix)
    if source.startswith("built-in profile "):
        return "built-in " + source.removeprefix("built-in profile ")
    if " + " in source:  # a rule list added to by several files
        return " + ".join(short_source(part, files) for part in source.split(" + "))
    ini, sep, _ = source.partition(" in ")
    if sep and ini.startswith("spark_") and " " not in ini:
        return f"ini {ini}"
    if files and source in files:
        return f"file {files[source]}"
    return source


def threshold_rows(settings: Settings, files: Mapping[str, str] | None = None) -> list[Row]:
    """Every key of the profile in effect, in the profile's order."""
    profile = settings.profile
    by_option = {o.profile_key: o for o in OPTIONS if o.profile_key}
    overrides = settings.threshold
    recipe = settings.recipe  # --spark-recipe or the running sparkrun job's: what it expects
    from_recipe = set(recipe.profile_keys) if recipe is not None else set()
    rows: list[Row] = []
    for key in known_keys():
        value: object = profile.value(key)
        option = by_option.get(key)
        given: str | None = None
        if option is not None and not settings.source(option.attr).startswith("profile "):
            # the option is the figure in effect: given, or its default where no file sets it
            value = getattr(settings, option.attr)
            given = settings.source(option.attr)
            source = f"{option.cli} default" if given == "default" else short_source(given)
            given = None if given == "default" else given
        elif key in overrides:
            given = settings.source("threshold")
            source = short_source(given)
        elif key in from_recipe and recipe is not None:
            given = recipe.origin  # "recipe PATH" or "sparkrun job PATH"
            source = f"recipe {recipe.path.name}" if recipe.path else "sparkrun job"
        elif key in profile.set_by:
            source = short_source(profile.set_by[key], files)
        else:
            source = "default"
        rows.append(Row(key, shown_value(value), unit_of(key) or "?", source, given))
    return rows


def profile_files(settings: Settings) -> dict[str, str]:
    """``{path: name shown in the rows}`` of the profile files that set a key (built-ins
    keep their own label): the file's name, or its path where two share a name."""
    paths = [
        part
        for source in settings.profile.set_by.values()
        for part in source.split(" + ")
        if not part.startswith("built-in profile ")
    ]
    paths = list(dict.fromkeys(paths))
    names = [Path(p).name for p in paths]
    return {p: n if names.count(n) == 1 else p for p, n in zip(paths, names, strict=True)}


def _wrapped(text: str, width: int, indent: str = "  ") -> list[str]:
    """Wrapped at spaces only: a path or a key stays whole (and copyable)."""
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


KW, VW, UW = 30, 10, 8  # the key, value and unit columns; FROM takes the rest


def render(settings: Settings, width: int = 80) -> list[str]:
    """The header, then one line per key in columns: a key past its column pushes the rest
    of its line along while it fits; a value wider than its column goes on the next line."""
    profile = settings.profile
    described = builtin_profiles().get(profile.name, "")
    files = profile_files(settings)
    chain = list(dict.fromkeys(s for v in profile.set_by.values() for s in v.split(" + ")))
    chosen = settings.source("profile")
    rows = threshold_rows(settings, files)
    lines = [f"pytest-dgx-spark thresholds: profile {profile.name}"]
    lines += _wrapped(f"chosen by: {'the default' if chosen == 'default' else chosen}", width)
    if described and profile.origin == f"built-in profile {profile.name}":
        lines += _wrapped(described, width)
    lines += _wrapped("files, later ones win: " + ", ".join(chain), width)
    given = list(dict.fromkeys(row.given for row in rows if row.given))
    if given:
        lines += _wrapped("given: " + ", ".join(given), width)
    lines += _wrapped(
        "default: no profile file sets it, the plugin's own value. Override one: "
        "--spark-threshold=KEY=VALUE (a list: KEY=1,4,16)",
        width,
    )
    lines += ["", f"{'KEY':<{KW}}  {'VALUE':<{VW}}  {'UNIT':<{UW}}  FROM"]
    section = ""
    for row in rows:
        if row.key.partition(".")[0] != section:
            section = row.key.partition(".")[0]
            lines.append(f"[{section}]")
        value = row.value if len(row.value) <= VW else "(below)"
        key = row.key
        if len(key) > KW:  # a long key on a line of its own, the columns stay
            lines.append(key)
            key = ""
        lines.append(f"{key:<{KW}}  {value:<{VW}}  {row.unit:<{UW}}  {row.source}".rstrip())
        if value != row.value:
            lines += _wrapped(row.value.replace(",", ", "), width, "    ")
    return lines


def show_profile(config: pytest.Config) -> int:
    """Print the thresholds in effect and return pytest's exit status 0. A setting mistake
    is the usage error it is in a run (resolve raises it)."""
    for line in render(resolve(config)):
        print(line)
    return 0
