"""Summary statistics the serving benchmarks report: mean, median, p90, p99 (JSON-ready)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, ``method='linear'``)."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return data[lo]
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None
    min: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float], digits: int = 6) -> Summary:
        vals = [v for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return cls(0, None, None, None, None, None, None)

        def r(x: float) -> float:
            return round(x, digits)

        return cls(
            len(vals),
            r(sum(vals) / len(vals)),
            r(percentile(vals, 50)),
            r(percentile(vals, 90)),
            r(percentile(vals, 99)),
            r(min(vals)),
            r(max(vals)),
        )

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)
