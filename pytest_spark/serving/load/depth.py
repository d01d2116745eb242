"""Depth x concurrency (``--spark-depth-sweep``), in the shape of the Spark community's
benchmark: eugr/llama-benchy run with spark-arena/recipe-registry's
``benchmarking/spark-arena-v2.yaml`` (context depth 0..100000, pp 2048, tg 128,
concurrency 1/2/5/10).

- Each request is ``depth`` tokens of context, then ``pp`` tokens of prompt, asking for
  exactly ``tg`` tokens (``ignore_eos``). Tokens as the server counts them: three short
  requests first (:func:`calibrate`, as llama-benchy's warm-up measures the chat template's
  tokens) give the server's tokens per word and the request's own overhead (chat template,
  nonce, instruction), so the words sent make the tokens asked for; the server's usage is
  recorded (``prompt_tokens``).
- Prefix-cache busting: every request starts with a nonce of its own (the run, the cell and
  its serial), so no request finds another's context in the prefix cache and every depth
  is prefilled in full. With ``prefix_caching`` (llama-benchy's --enable-prefix-caching, the
  Arena's setting), at a depth above 0 each run first sends every request's context alone
  (its nonce, its context, a ".": the ``ctx_pp`` / ``ctx_tg`` figures, its own cell with
  ``is_context_prefill_phase``), then the same context with the prompt: that prefill finds
  its own context cached, and its pp figures are the prompt's ``pp`` tokens over it.
- Heat-aware order (:func:`heat_order`): the cells are ranked by the work they give the GPU
  (``(depth + pp + tg) x concurrency`` tokens in flight) and run hottest, coolest, next
  hottest, next coolest...: a hot cell is always followed by a cool one, so a GPU that
  heats up (and clocks down) does not bias the later, heavier levels the way an ascending
  sweep would. ``cooldown_s`` adds a pause after each cell on top. The Arena's own schedule
  is a seeded bucketed shuffle; this one is deterministic and says why.
- Runs: each cell is ``runs`` batches (llama-benchy's ``--runs``, 3 in the Arena), one
  after the other, each ``concurrency`` requests sent at once.
- Results: llama-benchy's report schema (``schemas/benchmark_report_schema.json``): a
  ``benchmarks`` list of ``{concurrency, context_size, prompt_size, response_size,
  pp_throughput, pp_req_throughput, tg_throughput, tg_req_throughput, peak_throughput,
  peak_req_throughput, ttfr, est_ppt, e2e_ttft}``, each metric ``{mean, std, values}`` in
  tok/s or ms, computed as llama-benchy 0.4.0's ``results.py`` computes them (read, not
  copied; :func:`run_metrics`), so a run sits beside a published Spark Arena result field
  by field and ``--spark-arena`` writes its CSV from them (report/arena.py).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.load.sweep import _WORDS, LaneTransport, RequestRecord, send_recorded
from pytest_spark.settings.parsers import DepthSweep

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


@dataclass(frozen=True)
class Fit:
    """Words per token as the server counts them (:func:`calibrate`): ``per_word`` tokens
    a context or prompt word, ``overhead`` tokens of a request beyond its prompt words
    (chat template, nonce, instruction), ``header`` tokens the context adds beyond its
    words. The default: one token a word, 12 of overhead."""

    per_word: float = 1.0
    overhead: float = 12.0
    header: float = 0.0

    def context_words(self, depth: int) -> int:
        return max(1, round((depth - self.header) / self.per_word)) if depth > 0 else 0

    def ask_words(self, pp: int) -> int:
        return max(1, round((pp - self.overhead) / self.per_word))


def prompt(
    nonce: str, depth: int, pp: int, fit: Fit | None = None, context_only: bool = False
) -> str:
    """The nonce first (prefix-cache busting), ``depth`` tokens of context, ``pp`` tokens of
    prompt (words, by ``fit``); ``context_only``: the context and a "." (llama-benchy's
    context-load request), the same text up to the prompt."""
    fit = fit or Fit()
    n = len(_WORDS)
    context = " ".join(_WORDS[(i * 7 + len(nonce)) % n] for i in range(fit.context_words(depth)))
    ask = " ".join(_WORDS[(i * 3 + 1) % n] for i in range(fit.ask_words(pp)))
    head = f"[{nonce}] " + (f"Context: {context}\n" if depth else "")
    if context_only:
        return head + "."
    return head + "Continue this list of words for as long as you can: " + ask


def request_body(
    model: str,
    spec: DepthSweep,
    nonce: str,
    depth: int,
    fit: Fit | None = None,
    context_only: bool = False,
) -> dict[str, Any]:
    text = prompt(nonce, depth, spec.pp, fit, context_only)
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
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


def token_times(r: RequestRecord) -> list[float]:
    """When each output token arrived, seconds since the request was sent, as llama-benchy
    dates them: a chunk's time for its one token; where the server's count (usage) differs
    from the chunks seen, that count spread evenly from the first chunk to the last. A
    record that kept no chunk times (``deltas`` 0) spreads them from TTFT to its end."""
    n = r.output_tokens
    if r.ttft is None or n <= 0:
        return []
    chunks = list(itertools.accumulate([r.ttft, *r.gaps]))
    if len(chunks) == n:
        return chunks
    first, last = chunks[0], chunks[-1]
    if r.deltas == 0 and r.e2e is not None:
        last = r.e2e
    if n == 1 or last <= first:
        return [first] * n
    step = (last - first) / (n - 1)
    return [first + step * i for i in range(n)]


def peak_rate(times: Sequence[float], window: float = 1.0) -> float:
    """llama-benchy's peak t/s: the most tokens in any ``window`` seconds, per second; a
    burst shorter than the window is its tokens over its own span."""
    if not times:
        return 0.0
    ts = sorted(times)
    span = ts[-1] - ts[0]
    if 0 < span < window:
        return len(ts) / span
    most, lo = 0, 0
    for hi, t in enumerate(ts):
        while lo < hi and ts[lo] <= t - window:
            lo += 1
        most = max(most, hi - lo + 1)
    return most / window


def prompt_count(r: RequestRecord, expected: int) -> int:
    """The prompt's tokens: the server's usage when within 20 % of what was asked for,
    else what was asked for (llama-benchy's rule)."""
    if r.prompt_tokens and abs(r.prompt_tokens - expected) < expected * 0.2:
        return int(r.prompt_tokens)
    return expected


@dataclass
class RunMetrics:
    """One cell's figures in llama-benchy's terms, seconds and tok/s: per request (pp and
    tg speed, peak, ttfr, est_ppt, e2e TTFT) and per batch (total pp and tg t/s, peak)."""

    pp_req: list[float] = field(default_factory=list)
    tg_req: list[float] = field(default_factory=list)
    peak_req: list[float] = field(default_factory=list)
    ttfr: list[float] = field(default_factory=list)
    est_ppt: list[float] = field(default_factory=list)
    e2e_ttft: list[float] = field(default_factory=list)
    pp_batch: list[float] = field(default_factory=list)
    tg_batch: list[float] = field(default_factory=list)
    peak_batch: list[float] = field(default_factory=list)


def run_metrics(
    batches: Sequence[Sequence[RequestRecord]], expected_prompt: int, latency_s: float = 0.0
) -> RunMetrics:
    """llama-benchy 0.4.0's ``BenchmarkResults._process_batch`` definitions over our records,
    batch by batch: ``est_ppt`` = TTFR - latency (latency 0: no network latency subtracted,
    its ``--latency-mode none``), per-request pp t/s = prompt tokens / est_ppt, per-request
    tg t/s = tokens after the first / their span, total pp t/s = the batch's prompt tokens
    from the first send to the last first token, total tg t/s = the tokens after each first
    from the first first token to the last token; peaks over 1 s windows."""
    out = RunMetrics()
    for batch in batches:
        ok = [r for r in batch if r.error is None and r.ttft is not None]
        if not ok:
            continue
        prompt_total = 0
        firsts: list[float] = []
        lasts: list[float] = []
        every: list[float] = []
        decoded = 0
        for r in ok:
            assert r.ttft is not None
            prompt = prompt_count(r, expected_prompt)
            prompt_total += prompt
            times = token_times(r)
            if times:
                out.peak_req.append(peak_rate(times))
                every.extend(r.start + t for t in times)
            lasts.append(r.start + (times[-1] if times else (r.e2e or r.ttft)))
            firsts.append(r.start + r.ttft)
            ttfr = r.ttfr if r.ttfr is not None else r.ttft
            est_ppt = max(0.0, ttfr - latency_s)
            out.ttfr.append(ttfr)
            out.e2e_ttft.append(r.ttft)
            out.est_ppt.append(est_ppt)
            if est_ppt > 0:
                out.pp_req.append(prompt / est_ppt)
            after = sum(1 for t in times if t > times[0]) if len(times) > 1 else 0
            decoded += after
            if after and times[-1] > times[0]:
                out.tg_req.append(after / (times[-1] - times[0]))
        pp_span = max(firsts) - min(r.start for r in ok)
        if pp_span > 0:
            out.pp_batch.append(prompt_total / pp_span)
        tg_span = max(lasts) - min(firsts)
        if tg_span > 0 and decoded:
            out.tg_batch.append(decoded / tg_span)
        if every:
            out.peak_batch.append(peak_rate(every))
    return out


@dataclass
class CellResult:
    depth: int
    concurrency: int
    records: list[RequestRecord]
    order: int  # its place in the run (0: first)
    wall_s: float
    run_of: list[int] = field(default_factory=list)  # each record's run (empty: all run 0)
    context_phase: bool = False  # prefix caching: the context-load requests (ctx_pp, ctx_tg)

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is None and r.ttft is not None]

    def batches(self) -> list[list[RequestRecord]]:
        """The records run by run (each run ``concurrency`` requests sent at once)."""
        runs = self.run_of or [0] * len(self.records)
        out: dict[int, list[RequestRecord]] = {}
        for run, record in zip(runs, self.records, strict=True):
            out.setdefault(run, []).append(record)
        return [out[k] for k in sorted(out)]

    def expected_prompt(self, spec: DepthSweep) -> int:
        """The prompt tokens its prefill figures count, as llama-benchy: the context in a
        context-load cell, the prompt alone over a cached context, else both."""
        if self.context_phase:
            return self.depth
        if spec.prefix_caching and self.depth > 0:
            return spec.pp
        return self.depth + spec.pp

    def to_benchy(self, spec: DepthSweep) -> dict[str, Any]:
        """One llama-benchy ``BenchmarkRun``: prefill and decode tok/s (total and per
        request), peak decode tok/s (total and per request), TTFR, est_ppt and e2e TTFT in ms.
        As llama-benchy: at concurrency 1 the totals are the per-request figures."""
        expected = self.expected_prompt(spec)
        m = run_metrics(self.batches(), expected)
        one = self.concurrency == 1
        prompt_tokens = [float(r.prompt_tokens or expected) for r in self.ok]
        pp = metric(m.pp_req if one else m.pp_batch)
        tg = metric(m.tg_req if one else m.tg_batch)
        return {
            "concurrency": self.concurrency,
            "context_size": self.depth,
            "prompt_size": spec.pp,
            "response_size": spec.tg,
            "is_context_prefill_phase": self.context_phase,
            "pp_throughput": pp,
            "pp_req_throughput": pp if one else metric(m.pp_req),
            "tg_throughput": tg,
            "tg_req_throughput": tg if one else metric(m.tg_req),
            "peak_throughput": metric(m.peak_batch),
            "peak_req_throughput": metric(m.peak_req),
            "ttfr": metric([v * 1000 for v in m.ttfr]),
            "est_ppt": metric([v * 1000 for v in m.est_ppt]),
            "e2e_ttft": metric([v * 1000 for v in m.e2e_ttft]),
            # ours, beside the schema's fields
            "prompt_tokens": metric(prompt_tokens, 1),  # as the server counted them
            "runs": len(self.batches()),
            "requests": len(self.records),
            "failed": len(self.records) - len(self.ok),
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
    fit: Fit = field(default_factory=Fit)

    def to_benchy(self) -> dict[str, Any]:
        """The whole run as a llama-benchy report (its required fields, then ours)."""
        # llama-benchy's order: depth, concurrency, the context-load phase first
        cells = sorted(self.cells, key=lambda c: (c.depth, c.concurrency, not c.context_phase))
        return {
            "version": "pytest-dgx-spark depth sweep (llama-benchy report fields)",
            "timestamp": self.started,
            "latency_mode": "none",  # TTFT as measured: no network latency subtracted
            "latency_ms": 0.0,
            "model": self.model,
            "prefix_caching_enabled": bool(self.prefix_caching or self.spec.prefix_caching),
            "max_concurrency": max(self.spec.concurrency),
            "benchmarks": [c.to_benchy(self.spec) for c in cells],
            "runs": self.spec.runs,
            "schema": SCHEMA,
            "prefix_cache_busting": "a unique nonce starts every request",
            "heat_order": [
                [c.depth, c.concurrency]
                for c in sorted(self.cells, key=lambda c: c.order)
                if not c.context_phase
            ],
            "cooldown_s": self.spec.cooldown_s,
            "tokens_per_word": round(self.fit.per_word, 4),
            "request_overhead_tokens": round(self.fit.overhead, 1),
        }


Progress = Callable[[str], None]
CALIBRATION_WORDS = 256  # the calibration's context, and twice it


async def calibrate(client: Any, model: str, spec: DepthSweep, run: str) -> Fit:
    """Three one-token requests (no context, ``CALIBRATION_WORDS`` and twice as many words of
    it) read the server's prompt_tokens: tokens per context word, the context's header and
    the request's overhead. A server that gives no usage keeps the default fit."""
    one = DepthSweep(pp=spec.pp, tg=1)
    counts = []
    for k, words in enumerate((0, CALIBRATION_WORDS, 2 * CALIBRATION_WORDS)):
        record = await send_recorded(
            client,
            # a nonce of the cells' shape (as many tokens), never one of theirs
            request_body(model, one, f"{run}-{k}-c-0", words),
            time.perf_counter(),
            timeout=600.0,
            idle_timeout=120.0,
        )
        if record.error is not None or not record.prompt_tokens:
            return Fit()
        counts.append(int(record.prompt_tokens))
    per_word = (counts[2] - counts[1]) / CALIBRATION_WORDS
    if per_word <= 0:
        return Fit()
    default = Fit()
    return Fit(
        per_word=per_word,
        overhead=counts[0] - per_word * default.ask_words(spec.pp),
        header=counts[1] - counts[0] - per_word * CALIBRATION_WORDS,
    )


async def _run(api: ApiEndpoint, spec: DepthSweep, progress: Progress | None) -> DepthResult:
    run = f"{time.time_ns():x}"
    out = DepthResult(spec, api.model, started=datetime.now(UTC).isoformat(timespec="seconds"))
    async with api.async_client(transport=LaneTransport()) as client:
        fit = await calibrate(client, api.model, spec, run)
        out.fit = fit
        for i, (depth, c) in enumerate(heat_order(spec)):
            cell = CellResult(depth, c, [], i, 0.0)
            ctx = CellResult(depth, c, [], i, 0.0, context_phase=True)
            phases = [ctx, cell] if spec.prefix_caching and depth > 0 else [cell]
            for n in range(spec.runs):
                if progress is not None:
                    progress(
                        f"depth sweep: depth {depth}, {c} concurrent (cell {i + 1}, "
                        f"run {n + 1}/{spec.runs})"
                    )
                for phase in phases:
                    t0 = time.perf_counter()
                    records = await asyncio.gather(
                        *(
                            send_recorded(
                                client,
                                request_body(
                                    api.model,
                                    spec,
                                    f"{run}-{i}-{n}-{k}",
                                    depth,
                                    fit,
                                    context_only=phase.context_phase,
                                ),
                                t0,
                                timeout=600.0,
                                idle_timeout=120.0,
                            )
                            for k in range(c)
                        )
                    )
                    phase.wall_s += time.perf_counter() - t0
                    phase.records.extend(records)
                    phase.run_of.extend([n] * len(records))
            out.cells.extend(phases)
            if spec.cooldown_s > 0:
                await asyncio.sleep(spec.cooldown_s)
    return out


def run_depth_sweep(
    api: ApiEndpoint, spec: DepthSweep, progress: Progress | None = None
) -> DepthResult:
    """Every cell in the heat-aware order, ``runs`` batches of ``concurrency`` requests
    sent at once in each."""
    return asyncio.run(_run(api, spec, progress))
