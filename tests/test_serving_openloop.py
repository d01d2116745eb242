"""Open-loop load: the seeded Poisson schedule (vllm bench serve's arrivals), the rising
rates and the knee (the sweep against a paced server: tests/test_serving_load.py)."""

from __future__ import annotations

import itertools
import statistics

import pytest

from pytest_spark.serving.load.openloop import knee, poisson_schedule, rising_rates


def test_poisson_schedule_is_seeded_exponential() -> None:
    times = poisson_schedule(4.0, 4000, seed=7)
    assert times[0] == 0.0 and times == sorted(times)
    assert times == poisson_schedule(4.0, 4000, seed=7)
    assert times != poisson_schedule(4.0, 4000, seed=8)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # exponential: mean = stdev = 1 / rate (within sampling error at n = 4000)
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.08)
    gamma = poisson_schedule(4.0, 4000, 7, burstiness=0.25)
    gg = [b - a for a, b in itertools.pairwise(gamma)]
    assert statistics.fmean(gg) == pytest.approx(0.25, rel=0.1)  # same mean rate
    assert statistics.stdev(gg) > 1.5 * statistics.stdev(gaps)  # burstier: cv = 1/sqrt(B)
    with pytest.raises(ValueError):
        poisson_schedule(0.0, 3, 1)


def test_rising_rates_and_knee() -> None:
    assert rising_rates(0.5, 2.0, 4) == [0.5, 1.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="rate_factor > 1"):
        rising_rates(1.0, 1.0, 3)
    assert knee([(1.0, True), (2.0, True), (4.0, False)]) == 2.0
    assert knee([(4.0, False), (1.0, True), (2.0, True)]) == 2.0  # order of the levels
    assert knee([(1.0, True), (2.0, False), (4.0, True)]) == 1.0  # above a break: noise
    assert knee([(1.0, False)]) is None and knee([]) is None
