"""How many samples a percentile needs, and a percentile printed with its count (issue #27
§4: no p99 from 4 requests).

The rule: a ``q``-th percentile needs at least one sample beyond it, so ``n >= 100 / (100 -
q)``: p50 2, p90 10, p99 100, p99.9 1000. With fewer, the interpolated figure is the
maximum in disguise and says nothing about the tail; it is printed as too few, with the
count needed."""

from __future__ import annotations

import math


def min_samples(q: float) -> int:
    """The fewest samples the ``q``-th percentile (0-100) rests on (the rule above)."""
    if q <= 0 or q >= 100:
        return 1
    return math.ceil(round(100 / (100 - q), 9))


def pct_of(name: str) -> float:
    """``p99`` -> 99.0, ``p99.9`` -> 99.9, ``median``/``p50`` -> 50.0."""
    return 50.0 if name == "median" else float(name.lstrip("p"))


def enough_for(name: str, count: int | None) -> bool:
    """Are ``count`` samples enough for percentile ``name``? Unknown counts (documents
    written before counts were read) pass."""
    return count is None or count >= min_samples(pct_of(name))


def percentile_text(
    name: str, value: float | None, count: int | None, unit: str = "s", fmt: str = ".3g"
) -> str:
    """``p99 1.2 s (n=120)``, or ``p99 too few (n=4, needs >= 100)``: never a
    percentile without its sample count."""
    if not enough_for(name, count):
        return f"{name} too few (n={count}, needs >= {min_samples(pct_of(name))})"
    if value is None:
        return f"{name} not measured"
    return f"{name} {value:{fmt}} {unit} (n={count if count is not None else '?'})"
