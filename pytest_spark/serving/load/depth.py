"""Depth x concurrency (``--spark-depth-sweep``), in the shape of the Spark community's
benchmark: eugr/llama-benchy run with spark-arena/recipe-registry's
``benchmarking/spark-arena-v2.yaml`` (context depth 0..100000, pp 2048, tg 128,
concurrency 1/2/5/10).

- Each request is ``depth`` words of context, then ``pp`` words of prompt, asking for
  exactly ``tg`` tokens (``ignore_eos``); one word is about one token, the server's usage
  gives the truth (``prompt_tokens`` is recorded).
- Prefix-cache busting: every request starts with a nonce of its own (the run, the cell and
  its serial), so no request finds another's context in the prefix cache and every depth
  is prefilled in full, as llama-benchy measures it with caching on.
- Heat-aware order (:func:`heat_order`): the cells are ranked by the work they give the GPU
  (``(depth + pp + tg) x concurrency`` tokens in flight) and run hottest, coolest, next
  hottest, next coolest...: a hot cell is always followed by a cool one, so a GPU that
  heats up (and clocks down) does not bias the later, heavier levels the way an ascending
  sweep would. ``cooldown_s`` adds a pause after each cell on top. The Arena's own schedule
  is a seeded bucketed shuffle; this one is deterministic and says why.
- Results: llama-benchy's report schema (``schemas/benchmark_report_schema.json``): a
  ``benchmarks`` list of ``{concurrency, context_size, prompt_size, response_size,
  pp_throughput, pp_req_throughput, tg_throughput, tg_req_throughput, e2e_ttft}``, each
  metric ``{mean, std, values}`` in tok/s or ms, so a run sits beside a published Spark
  Arena result field by field.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.load.sweep import _WORDS, LaneTransport, RequestRecord, send_recorded
from pytest_spark.settings.options import DepthSweep

Cell = tuple[int, int]  # (context depth in tokens, concurrency)
SCHEMA = "llama-benchy benchmark_report_schema.json (eugr/llama-benchy)"


def heat(spec: DepthSweep, cell: Cell) -> int:
    """Tokens a cell keeps in flight: ``(depth + pp + tg) x concurrency``."""
    depth, c = cell
    return (depth + spec.pp + spec.tg) * c


def heat_order(spec: DepthSweep) -> list[Cell]:
    """Every (depth, concurrency) cell, hottest and coolest alternating (module doc)."""
    cells = sorted(
        ((d, c) for d in spec.depths for c in spec.concurrency),
        key=lambda cell: (heat(spec, cell), cell),
    )
    order = []
    lo, hi = 0, len(cells) - 1
    while lo <= hi:
        order.append(cells[hi])
        hi -= 1
        if lo <= hi:
            order.append(cells[lo])
            lo += 1
    return order


def prompt(nonce: str, depth: int, pp: int) -> str:
    """The nonce first (prefix-cache busting), ``depth`` words of context, ``pp`` words
    of prompt."""
    n = len(_WORDS)
    context = " ".join(_WORDS[(i * 7 + len(nonce)) % n] for i in range(depth))
    ask = " ".join(_WORDS[(i * 3 + 1) % n] for i in range(max(1, pp - 12)))
    head = f"[{nonce}] " + (f"Context: {context}\n" if depth else "")
    return head + "Continue this list of words for as long as you can: " + ask


def request_body(model: str, spec: DepthSweep, nonce: str, depth: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt(nonce, depth, spec.pp)}],
        "max_tokens": spec.tg,
        "max_completion_tokens": spec.tg,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def metric(values: Sequence[float], digits: int = 3) -> dict[str, Any] | None:
    """llama-benchy's BenchmarkMetric: ``{mean, std, values}`` (population std)."""
    if not values:
        return None
    return {
        "mean": round(statistics.fmean(values), digits),
        "std": round(statistics.pstdev(values), digits) if len(values) > 1 else 0.0,
        "values": [round(v, digits) for v in values],
    }


@dataclass
class CellResult:
    depth: int
    concurrency: int
    records: list[RequestRecord]
    order: int  # its place in the run (0: first)
    wall_s: float

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is None and r.ttft is not None]

    def to_benchy(self, spec: DepthSweep) -> dict[str, Any]:
        """One llama-benchy ``BenchmarkRun``: prefill tok/s (total and per request), decode
        tok/s (total and per request), TTFT in ms."""
        ok = self.ok
        prompt_tokens = [float(r.prompt_tokens or self.depth + spec.pp) for r in ok]
        pp_req = [p / r.ttft for p, r in zip(prompt_tokens, ok, strict=True) if r.ttft]
        tg_req = [
            (r.output_tokens - 1) / (r.e2e - r.ttft)
            for r in ok
            if r.e2e is not None and r.ttft is not None and r.e2e > r.ttft and r.output_tokens > 1
        ]
        # totals: all the cell's tokens over the span they took (prefill: send to the last
        # first token; decode: the first first token to the last end)
        first = [r.start + (r.ttft or 0.0) for r in ok]
        ends = [r.start + (r.e2e or 0.0) for r in ok]
        pp_span = max(first, default=0.0) - min((r.start for r in ok), default=0.0)
        tg_span = max(ends, default=0.0) - min(first, default=0.0)
        tg_tokens = sum(max(0, r.output_tokens - 1) for r in ok)
        return {
            "concurrency": self.concurrency,
            "context_size": self.depth,
            "prompt_size": spec.pp,
            "response_size": spec.tg,
            "is_context_prefill_phase": False,
            "pp_throughput": metric([sum(prompt_tokens) / pp_span] if pp_span > 0 else []),
            "pp_req_throughput": metric(pp_req),
            "tg_throughput": metric([tg_tokens / tg_span] if tg_span > 0 and tg_tokens else []),
            "tg_req_throughput": metric(tg_req),
            "e2e_ttft": metric([r.ttft * 1000 for r in ok if r.ttft is not None]),
            # ours, beside the schema's fields
            "prompt_tokens": metric(prompt_tokens, 1),  # as the server counted them
            "requests": len(self.records),
            "failed": len(self.records) - len(ok),
            "errors": sorted({r.error for r in self.records if r.error})[:3],
            "run_order": self.order,
            "wall_s": round(self.wall_s, 3),
        }


@dataclass
class DepthResult:
    spec: DepthSweep
    model: str
    cells: list[CellResult] = field(default_factory=list)
    started: str = ""
    prefix_caching: bool | None = None

    def to_benchy(self) -> dict[str, Any]:
        """The whole run as a llama-benchy report (its required fields, then ours)."""
        cells = sorted(self.cells, key=lambda c: (c.depth, c.concurrency))
        return {
            "version": "pytest-dgx-spark depth sweep (llama-benchy report fields)",
            "timestamp": self.started,
            "latency_mode": "none",  # TTFT as measured: no network latency subtracted
            "latency_ms": 0.0,
            "model": self.model,
            "prefix_caching_enabled": bool(self.prefix_caching),
            "max_concurrency": max(self.spec.concurrency),
            "benchmarks": [c.to_benchy(self.spec) for c in cells],
            "schema": SCHEMA,
            "prefix_cache_busting": "a unique nonce starts every request",
            "heat_order": [
                [c.depth, c.concurrency] for c in sorted(self.cells, key=lambda c: c.order)
            ],
            "cooldown_s": self.spec.cooldown_s,
        }


Progress = Callable[[str], None]


async def _run(api: ApiEndpoint, spec: DepthSweep, progress: Progress | None) -> DepthResult:
    run = f"{time.time_ns():x}"
    out = DepthResult(spec, api.model, started=datetime.now(UTC).isoformat(timespec="seconds"))
    async with api.async_client(transport=LaneTransport()) as client:
        for i, (depth, c) in enumerate(heat_order(spec)):
            if progress is not None:
                progress(f"depth sweep: depth {depth}, {c} concurrent (cell {i + 1})")
            t0 = time.perf_counter()
            records = await asyncio.gather(
                *(
                    send_recorded(
                        client,
                        request_body(api.model, spec, f"{run}-{i}-{k}", depth),
                        t0,
                        timeout=600.0,
                        idle_timeout=120.0,
                    )
                    for k in range(c)
                )
            )
            out.cells.append(CellResult(depth, c, list(records), i, time.perf_counter() - t0))
            if spec.cooldown_s > 0:
                await asyncio.sleep(spec.cooldown_s)
    return out


def run_depth_sweep(
    api: ApiEndpoint, spec: DepthSweep, progress: Progress | None = None
) -> DepthResult:
    """Every cell in the heat-aware order, ``concurrency`` requests at once in each."""
    return asyncio.run(_run(api, spec, progress))
