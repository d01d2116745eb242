"""Threshold profiles: TOML files of named figures, built in or given by path."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

BUILTIN_PROFILES = ("dgx-spark-2node", "sim", "sim-vllm-cpu")


class ProfileError(ValueError):
    """A profile that cannot be found or read, or a bad threshold override."""


@dataclass(frozen=True)
class Profile:
    """Flat, dotted-key view of a threshold profile (``link.min_rate_gbps``)."""

    name: str
    origin: str
    values: Mapping[str, Any]
    overridden: frozenset[str] = field(default_factory=frozenset)

    def __getitem__(self, key: str) -> Any:
        try:
            return self.values[key]
        except KeyError:
            raise KeyError(f"threshold {key!r} is not set by profile {self.name!r}") from None

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def with_overrides(self, overrides: Mapping[str, str]) -> Profile:
        """Override single thresholds; each raw string is coerced to the profile's type."""
        values = dict(self.values)
        for key, raw in overrides.items():
            if key not in values:
                known = ", ".join(sorted(values))
                raise ProfileError(f"unknown threshold {key!r}; profile {self.name!r} has: {known}")
            values[key] = _coerce(key, raw, values[key])
            if isinstance(values[key], list) and not values[key]:
                raise ProfileError(f"threshold {key}={raw!r}: expected a list (e.g. 1;4;16)")
        return Profile(self.name, self.origin, values, self.overridden | set(overrides))


def _coerce(key: str, raw: str, current: Any) -> Any:
    try:
        if isinstance(current, bool):
            low = raw.strip().lower()
            if low not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError
            return low in {"true", "1", "yes"}
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
        if isinstance(current, list):
            items = [item.strip() for item in raw.replace(";", ",").split(",") if item.strip()]
            item_type = type(current[0]) if current else str
            return [item_type(item) for item in items]
    except ValueError:
        kind = type(current).__name__
        raise ProfileError(f"threshold {key}={raw!r}: expected a {kind}") from None
    return raw


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _read(ref: str, seen: tuple[str, ...] = ()) -> tuple[str, str, dict[str, Any]]:
    if ref in seen:
        raise ProfileError(f"profile {ref!r} extends itself (via {' -> '.join(seen)})")
    if ref in BUILTIN_PROFILES:
        text = resources.files("pytest_spark").joinpath(f"settings/profiles/{ref}.toml").read_text()
        origin = f"built-in profile {ref}"
    else:
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ProfileError(
                f"no profile {ref!r}: not a built-in ({', '.join(BUILTIN_PROFILES)}) "
                "and no such file"
            )
        text = path.read_text()
        origin = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{origin}: invalid TOML: {exc}") from None
    name = str(data.pop("name", Path(ref).stem))
    data.pop("description", None)
    parent = data.pop("extends", None)
    values: dict[str, Any] = {}
    if parent is not None:
        values.update(_read(str(parent), (*seen, ref))[2])
    values.update(_flatten(data))
    return name, origin, values


def load_profile(ref: str) -> Profile:
    """Load a built-in profile by name or a TOML file by path (``extends`` honoured)."""
    name, origin, values = _read(ref)
    return Profile(name, origin, values)
