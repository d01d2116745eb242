"""Open-loop load: requests sent at a request rate with Poisson arrivals, whatever the
server's answers, and a sweep of rising rates that stops where the SLOs break; the knee is
the highest rate that met them.

Arrivals as ``vllm bench serve --request-rate R --burstiness B`` draws them
(vllm/benchmarks/serve.py, ``get_request``): inter-arrival times from a gamma distribution
of shape ``B`` and scale ``1 / (R * B)``; ``B = 1`` is a Poisson process (exponential gaps,
mean ``1 / R``). Seeded, so two runs send the same schedule.

Unlike the closed loop, a slow server does not slow the sender: the queue grows on the
server, TTFT with it, and goodput falls; that is the knee.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_spark.serving.load.slo import Goodput, Slo, goodput
from pytest_spark.serving.load.sweep import LevelResult, LoadClient, RequestRecord

Progress = Callable[[str], None]


def poisson_schedule(rate: float, n: int, seed: int, burstiness: float = 1.0) -> list[float]:
    """Send times (seconds from the level's start) of ``n`` requests at ``rate`` per second:
    the first at 0, then gamma(shape=burstiness, scale=1/(rate*burstiness)) gaps."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate {rate} and burstiness {burstiness} must be positive")
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.gammavariate(burstiness, theta)
        out.append(t)
    return out


def rising_rates(start: float, factor: float, count: int) -> list[float]:
    """``start, start*factor, ...``: ``count`` rates (req/s), rounded to 4 digits."""
    if start <= 0 or factor <= 1 or count < 1:
        raise ValueError("open_loop: start_rate > 0, rate_factor > 1 and max_levels >= 1")
    return [round(start * factor**i, 4) for i in range(count)]


def knee(levels: Sequence[tuple[float, bool]]) -> float | None:
    """The highest rate that met the SLOs below the first rate that broke them (a rate that
    passes again above a break is noise, not capacity); None when the lowest broke."""
    best = None
    for rate, met in sorted(levels):
        if not met:
            break
        best = rate
    return best


@dataclass(frozen=True)
class OpenLoopSpec:
    start_rate: float = 0.5  # req/s
    rate_factor: float = 2.0
    max_levels: int = 5
    requests_per_level: int = 16
    seed: int = 1
    burstiness: float = 1.0
    max_in_flight: int = 256  # a bound on the client, far above any server's batch


@dataclass
class RateLevel:
    rate: float
    level: LevelResult
    goodput: Goodput
    met: bool
    late_s: float  # the most a send ran behind its schedule (a busy client skews the rate)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "met": self.met,
            "late_s": round(self.late_s, 4),
            **self.goodput.to_dict(),
            "level": self.level.to_dict(),
        }


@dataclass
class RateSweep:
    spec: OpenLoopSpec
    slo: Slo
    levels: list[RateLevel] = field(default_factory=list)

    @property
    def knee(self) -> float | None:
        return knee([(lv.rate, lv.met) for lv in self.levels])

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": vars(self.spec).copy(),
            "slo": self.slo.text(),
            "min_goodput_pct": self.slo.min_goodput_pct,
            "knee_req_s": self.knee,
            "levels": [lv.to_dict() for lv in self.levels],
        }


async def rate_level(
    lc: LoadClient,
    client: httpx.AsyncClient,
    rate: float,
    spec: OpenLoopSpec,
    progress: Progress | None = None,
) -> tuple[LevelResult, float]:
    """One level at ``rate``: each request sent at its scheduled time (no new one after the
    load spec's level budget), all awaited. Returns the level and the worst send lateness."""
    schedule = poisson_schedule(rate, spec.requests_per_level, spec.seed, spec.burstiness)
    gate = asyncio.Semaphore(spec.max_in_flight)
    records: list[RequestRecord] = []
    late = 0.0
    t0 = lc.clock()

    async def send() -> None:
        async with gate:
            record = await lc.send(client, t0)
        records.append(record)
        if progress is not None:
            progress(lc.progress_text(f"open loop {rate:g} req/s", records, len(schedule)))

    tasks = []
    for at in schedule:
        now = lc.clock() - t0
        if at > lc.spec.level_budget_s:
            break
        if at > now:
            await asyncio.sleep(at - now)
        late = max(late, lc.clock() - t0 - at)
        tasks.append(asyncio.create_task(send()))
    await asyncio.gather(*tasks)
    ends = [r.start + (r.e2e or 0.0) for r in records]
    level = LevelResult(0, records, max(ends, default=lc.clock() - t0), 0.0, rate=rate)
    return level, late


async def rate_sweep(
    lc: LoadClient, spec: OpenLoopSpec, slo: Slo, progress: Progress | None = None
) -> RateSweep:
    """Warm-up, then rising rates until a level's goodput falls below the SLO share."""
    sweep = RateSweep(spec, slo)
    limits = httpx.Limits(max_connections=spec.max_in_flight, max_keepalive_connections=64)
    async with lc.api.async_client(limits=limits) as client:
        await lc.warmup(client)
        for rate in rising_rates(spec.start_rate, spec.rate_factor, spec.max_levels):
            level, late = await rate_level(lc, client, rate, spec, progress)
            g = goodput(level.records, slo, level.wall_s)
            met = g.meets(slo.min_goodput_pct)
            sweep.levels.append(RateLevel(rate, level, g, met, late))
            if not met:
                break
    return sweep


def run_rate_sweep(
    lc: LoadClient, spec: OpenLoopSpec, slo: Slo, progress: Progress | None = None
) -> RateSweep:
    return asyncio.run(rate_sweep(lc, spec, slo, progress))
