"""Summary statistics the serving benchmarks report: mean, median, p90, p99 (JSON-ready)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated between closest ranks: numpy's default
    (``method='linear'``), which is ``statistics.quantiles(method='inclusive')``."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1 or q <= 0:
        return data[0]
    if q >= 100:
        return data[-1]
    if float(q).is_integer():
        return statistics.quantiles(data, n=100, method="inclusive")[int(q) - 1]
    # a fractional percentile (p99.9): cut into thousandths, the same interpolation
    return statistics.quantiles(data, n=1000, method="inclusive")[round(q * 10) - 1]


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
