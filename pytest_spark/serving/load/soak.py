"""The soak: a steady closed-loop load held for a duration (``--spark-soak``), with the
server's ``/metrics`` sampled once per window. What it judges, as pure functions:

- request errors (any);
- output tok/s drift between the first and the last full window (each request's tokens
  spread over its decode span, first token to end, so a window counts the tokens decoded
  in it, not the requests that happened to end in it);
- KV-cache preemptions (``vllm:num_preemptions``, a counter) that grew during the soak;
- a growing waiting queue (``vllm:num_requests_waiting``, a gauge): a closed loop of N
  streams keeps at most N requests on the server, so a queue that grows from the first
  window to the last says the server drains slower than it did at the start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_spark.serving.load.sweep import LoadClient, RequestRecord, fetch_metrics

PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
WAITING = "vllm:num_requests_waiting"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class SoakSpec:
    duration_s: float
    concurrency: int = 4
    window_s: float = 60.0
    max_drift_pct: float = 10.0
    max_waiting_growth: float = 1.0  # requests: last window's mean minus the first's


@dataclass(frozen=True)
class Sample:
    t: float  # since the soak began
    preemptions: float | None
    waiting: float | None


def sample_of(t: float, metrics: dict[str, float] | None) -> Sample:
    if metrics is None:
        return Sample(t, None, None)
    pre = next((metrics[n] for n in PREEMPTIONS if n in metrics), None)
    return Sample(t, pre, metrics.get(WAITING))


def window_tok_s(records: Sequence[RequestRecord], window_s: float, end_s: float) -> list[float]:
    """Output tok/s of each full window ``[k*w, (k+1)*w)`` up to ``end_s``: each successful
    request's tokens spread evenly over its first-token-to-end span."""
    n = int(end_s // window_s)
    tokens = [0.0] * n
    for r in records:
        if r.error is not None or r.ttft is None or r.e2e is None or not r.output_tokens:
            continue
        a, b = r.start + r.ttft, r.start + r.e2e
        span = b - a
        for k in range(n):
            lo, hi = k * window_s, (k + 1) * window_s
            if span <= 0:
                tokens[k] += r.output_tokens if lo <= a < hi else 0.0
                continue
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                tokens[k] += r.output_tokens * overlap / span
    return [t / window_s for t in tokens]


def drift_pct(windows: Sequence[float]) -> float | None:
    """(last - first) / first in percent; None with fewer than two windows."""
    if len(windows) < 2 or windows[0] <= 0:
        return None
    return 100.0 * (windows[-1] - windows[0]) / windows[0]


def preemptions_during(samples: Sequence[Sample]) -> float | None:
    values = [s.preemptions for s in samples if s.preemptions is not None]
    return values[-1] - values[0] if len(values) >= 2 else None


def waiting_growth(samples: Sequence[Sample], window_s: float) -> float | None:
    """Mean waiting queue of the last window minus that of the first (None: not exported
    or too few samples)."""
    timed = [(s.t, s.waiting) for s in samples if s.waiting is not None]
    if len(timed) < 2:
        return None
    end = timed[-1][0]
    first = [w for t, w in timed if t <= window_s]
    last = [w for t, w in timed if t >= end - window_s]
    return sum(last) / len(last) - sum(first) / len(first)


@dataclass
class SoakResult:
    spec: SoakSpec
    records: list[RequestRecord]
    samples: list[Sample]
    wall_s: float
    windows: list[float] = field(default_factory=list)

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is not None]

    def to_dict(self) -> dict[str, Any]:
        drift = drift_pct(self.windows)
        return {
            "duration_s": self.spec.duration_s,
            "concurrency": self.spec.concurrency,
            "window_s": self.spec.window_s,
            "wall_s": round(self.wall_s, 3),
            "requests": len(self.records),
            "failed": len(self.failed),
            "errors": sorted({r.error for r in self.failed if r.error})[:5],
            "window_tok_s": [round(w, 3) for w in self.windows],
            "drift_pct": round(drift, 2) if drift is not None else None,
            "preemptions": preemptions_during(self.samples),
            "waiting_growth": waiting_growth(self.samples, self.spec.window_s),
            "samples": [vars(s) for s in self.samples],
        }


async def soak(lc: LoadClient, spec: SoakSpec, progress: Progress | None = None) -> SoakResult:
    """Warm-up, then ``spec.concurrency`` closed-loop streams until ``duration_s`` is up
    (no new request after it; the ones in flight finish), sampling ``/metrics`` every
    quarter window."""
    records: list[RequestRecord] = []
    samples: list[Sample] = []
    top = spec.concurrency + 2
    limits = httpx.Limits(max_connections=top, max_keepalive_connections=top)
    async with lc.api.async_client(limits=limits) as client:
        await lc.warmup(client)
        t0 = lc.clock()
        done = asyncio.Event()

        async def worker() -> None:
            while lc.clock() - t0 < spec.duration_s:
                records.append(await lc.send(client, t0))
                if progress is not None:
                    elapsed = lc.clock() - t0
                    pct = min(99, int(100 * elapsed / spec.duration_s))
                    progress(soak_line(records, elapsed, spec.duration_s, pct))

        async def sampler() -> None:
            while not done.is_set():
                samples.append(sample_of(lc.clock() - t0, await fetch_metrics(client)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), spec.window_s / 4)

        watch = asyncio.create_task(sampler())
        await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
        done.set()
        await watch
        samples.append(sample_of(lc.clock() - t0, await fetch_metrics(client)))
    wall = max((r.start + (r.e2e or 0.0) for r in records), default=lc.clock() - t0)
    if progress is not None:
        progress(soak_line(records, wall, spec.duration_s, 100))
    result = SoakResult(spec, records, samples, wall)
    result.windows = window_tok_s(records, spec.window_s, min(wall, spec.duration_s))
    return result


def soak_line(records: Sequence[RequestRecord], elapsed: float, duration: float, pct: int) -> str:
    tokens = sum(r.output_tokens for r in records if r.error is None)
    failed = sum(r.error is not None for r in records)
    tail = f", {failed} failed" if failed else ""
    rate = tokens / elapsed if elapsed > 0 else 0.0
    return (
        f"soak {elapsed:.0f}/{duration:.0f} s: {len(records)} requests {pct}% "
        f"{rate:.1f} tok/s so far{tail}"
    )


def run_soak(lc: LoadClient, spec: SoakSpec, progress: Progress | None = None) -> SoakResult:
    return asyncio.run(soak(lc, spec, progress))
