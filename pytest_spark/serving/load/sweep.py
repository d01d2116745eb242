"""Load client: closed-loop concurrency sweep over streaming chat completions (httpx async).

Definitions (REFERENCE section 5):

- output tokens come from the server's ``usage`` (``stream_options.include_usage``);
  reasoning tokens are output tokens. Without usage, token-carrying deltas are counted and
  the result says ``token_source: "deltas"``.
- TTFT: request sent -> first token delta (reasoning, content or tool call); TTFC: -> first
  content delta. E2E: request sent -> end of stream. TPOT = (E2E - TTFT) / (n - 1).
  ITL: gaps between token-carrying chunks. Decode tok/s per request = 1 / TPOT.
- output tok/s of a level = sum of output tokens / wall time of the level.

Each level runs ``concurrency`` workers that send requests back to back (closed loop) until
the level's request count is reached or its time budget is spent; warm-up requests go
first and are not counted. Prompt and output lengths are fixed (``max_completion_tokens``
and ``max_tokens`` for older servers, ``ignore_eos``); a server that refuses a vLLM
extension gets the request without it, and the result says which were dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.access.body import arequest as capped_arequest
from pytest_spark.serving.client.stream import ServingError, astream_chat
from pytest_spark.serving.client.wire import kv_cache_metric, parse_metrics
from pytest_spark.serving.load.metricsnap import level_metrics, metrics_text, scrape
from pytest_spark.serving.load.stats import Summary

CHAT_PATH = "/v1/chat/completions"
GEN_TOKENS = "vllm:generation_tokens_total"
OPTIONAL_PARAMS = ("ignore_eos", "max_completion_tokens", "stream_options")
_WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
)


@dataclass(frozen=True)
class LoadSpec:
    """What to send and how much of it (every bound explicit)."""

    concurrency: tuple[int, ...] = (1, 4, 16)
    prompt_tokens: int = 256  # approximate: one word ~ one token; usage reports the truth
    output_tokens: int = 128
    requests_per_stream: int = 2  # closed loop: requests per worker at each level
    min_requests: int = 4  # at least this many per level (for percentiles at c=1)
    warmup_requests: int = 2
    level_budget_s: float = 120.0  # no new request starts after this much time in a level
    request_timeout_s: float = 300.0
    idle_timeout_s: float = 30.0
    temperature: float = 0.0
    ignore_eos: bool = True

    def requests_at(self, concurrency: int) -> int:
        return max(self.min_requests, concurrency * self.requests_per_stream)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["concurrency"] = list(self.concurrency)
        return data


def prompt_text(n_words: int, serial: int) -> str:
    """A fixed-length prompt that differs from the others at its start (no prefix-cache
    shortcut between requests)."""
    words = [_WORDS[(serial * 7 + i * 3) % len(_WORDS)] for i in range(max(1, n_words))]
    return f"Request {serial}. Continue this list of words for as long as you can: " + " ".join(
        words
    )


def request_body(
    model: str,
    spec: LoadSpec,
    serial: int,
    *,
    output_tokens: int | None = None,
    dropped: Sequence[str] = (),
) -> dict[str, Any]:
    n = output_tokens or spec.output_tokens
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt_text(spec.prompt_tokens - 16, serial)}],
        "max_tokens": n,
        "max_completion_tokens": n,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    for name in dropped:
        body.pop(name, None)
    return body


@dataclass
class RequestRecord:
    """Timings of one request, seconds from the moment it was sent."""

    start: float  # since the level started
    ttft: float | None = None
    ttfc: float | None = None
    # time to first response: the first chunk with a choice, empty or not (llama-benchy's
    # ttfr, which its est_ppt and per-request prefill t/s are taken from)
    ttfr: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    token_source: str = "usage"
    deltas: int = 0
    gaps: list[float] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None
    evidence: dict[str, str] | None = None  # request and stream excerpt of a failure
    _last: float | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def on_chunk(self, t: float, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if usage:
            self.output_tokens = int(usage.get("completion_tokens") or 0)
            self.prompt_tokens = usage.get("prompt_tokens")
        if self.ttfr is None and chunk.get("choices"):
            self.ttfr = t
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if (
                content
                or delta.get("reasoning")
                or delta.get("reasoning_content")
                or delta.get("tool_calls")
            ):
                self.deltas += 1
                if self.ttft is None:
                    self.ttft = t
                elif self._last is not None:
                    self.gaps.append(t - self._last)
                self._last = t
                if content and self.ttfc is None:
                    self.ttfc = t


@dataclass
class LevelResult:
    concurrency: int  # closed loop: the streams; 0 for an open-loop level
    records: list[RequestRecord]
    wall_s: float
    cpu_s: float
    rate: float | None = None  # open loop: the offered request rate (req/s)
    metrics: dict[str, Any] | None = None  # /metrics around the level (metricsnap.level_metrics)

    @property
    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is None]

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.records if r.error is not None]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def decode_rates(self) -> list[float]:
        return [1.0 / r.tpot for r in self.ok if r.tpot]

    def to_dict(self) -> dict[str, Any]:
        ok = self.ok
        tokens = self.output_tokens
        return {
            "concurrency": self.concurrency,
            **({"rate": self.rate} if self.rate is not None else {}),
            "requests": len(ok),
            "failed": len(self.failed),
            "errors": sorted({r.error for r in self.failed if r.error})[:5],
            "wall_s": round(self.wall_s, 4),
            "output_tokens": tokens,
            "prompt_tokens_mean": _mean([r.prompt_tokens for r in ok if r.prompt_tokens]),
            "output_tok_s": round(self.output_tok_s, 3),
            "request_per_s": round(len(ok) / self.wall_s, 4) if self.wall_s > 0 else 0.0,
            "token_source": sorted({r.token_source for r in ok}) or None,
            "client_cpu_s": round(self.cpu_s, 4),
            "client_cpu_s_per_1k_tokens": round(1000 * self.cpu_s / tokens, 5) if tokens else None,
            "ttft_s": Summary.of([r.ttft for r in ok if r.ttft is not None]).to_dict(),
            "ttfc_s": Summary.of([r.ttfc for r in ok if r.ttfc is not None]).to_dict(),
            "tpot_s": Summary.of([t for r in ok if (t := r.tpot) is not None]).to_dict(),
            "itl_s": Summary.of([g for r in ok for g in r.gaps]).to_dict(),
            "e2e_s": Summary.of([r.e2e for r in ok if r.e2e is not None]).to_dict(),
            "decode_tok_s": Summary.of(self.decode_rates(), 3).to_dict(),
            "server_metrics": self.metrics,
        }


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


@dataclass
class SweepResult:
    spec: LoadSpec
    levels: list[LevelResult]
    dropped_params: list[str]
    warmup_s: float
    server: str
    server_metrics: dict[str, Any] | None = None

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "spec": self.spec.to_dict(),
            "dropped_params": self.dropped_params,
            "warmup_s": round(self.warmup_s, 3),
            "server_metrics": self.server_metrics,
            "levels": [lv.to_dict() for lv in self.levels],
        }


Progress = Callable[[str], None]


def progress_text(what: str, records: Sequence[RequestRecord], total: int, now: float) -> str:
    """The live line of a long wait: ``throughput 4 streams: 5/8 requests 62% 123.4 tok/s``
    (output tokens of the finished requests over the time since the level began; the
    writer ends the line in place at `` 100% ``)."""
    done = len(records)
    tokens = sum(r.output_tokens for r in records if r.error is None)
    failed = sum(r.error is not None for r in records)
    pct = 100 * done // total if total else 100
    tail = f", {failed} failed" if failed else ""
    rate = tokens / now if now > 0 else 0.0
    return f"{what}: {done}/{total} requests {pct}% {rate:.1f} tok/s so far{tail}"


async def send_recorded(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    level_t0: float,
    *,
    timeout: float,
    idle_timeout: float,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestRecord:
    """One streamed chat request, timed into a ``RequestRecord`` (its start: seconds since
    ``level_t0``); a failure is recorded, not raised."""
    t0 = clock()
    record = RequestRecord(start=t0 - level_t0)
    try:
        result = await astream_chat(
            client,
            CHAT_PATH,
            body,
            timeout=timeout,
            idle_timeout=idle_timeout,
            keep=False,
            on_chunk=record.on_chunk,
            clock=clock,
        )
    except ServingError as exc:
        record.error, record.error_kind = exc.message, exc.kind
        record.evidence = exc.exchange.evidence(failure=exc.kind)
        record.e2e = clock() - t0
        return record
    record.e2e = result.total_s
    if record.output_tokens == 0 and record.deltas:
        record.output_tokens, record.token_source = record.deltas, "deltas"
    return record


class LoadClient:
    """Runs sweeps against one endpoint; one connection pool, sized for the top level.
    ``progress`` gets a live line as each request of a level finishes."""

    def __init__(
        self,
        api: ApiEndpoint,
        spec: LoadSpec,
        clock: Callable[[], float] = time.perf_counter,
        progress: Progress | None = None,
    ) -> None:
        self.api = api
        self.spec = spec
        self.clock = clock
        self.progress = progress
        self.dropped: list[str] = []
        self._serial = 0

    async def send(self, client: httpx.AsyncClient, level_t0: float) -> RequestRecord:
        """One request of a level that began at ``level_t0`` (the open loop and the soak)."""
        return await self._one(client, level_t0)

    def progress_text(self, what: str, records: Sequence[RequestRecord], total: int) -> str:
        ends = [r.start + (r.e2e or 0.0) for r in records]
        return progress_text(what, records, total, max(ends, default=0.0))

    def _client(self) -> httpx.AsyncClient:
        """One connection per concurrent request (``LaneTransport``): httpcore's shared
        pool does O(connections^2) bookkeeping per request, which at 64 streams held the
        first round's requests in the client (benchmarks/load_client_accuracy.py)."""
        return self.api.async_client(transport=LaneTransport())

    async def _one(
        self, client: httpx.AsyncClient, level_t0: float, output_tokens: int | None = None
    ) -> RequestRecord:
        self._serial += 1
        body = request_body(
            self.api.model,
            self.spec,
            self._serial,
            output_tokens=output_tokens,
            dropped=self.dropped,
        )
        return await send_recorded(
            client,
            body,
            level_t0,
            timeout=self.spec.request_timeout_s,
            idle_timeout=self.spec.idle_timeout_s,
            clock=self.clock,
        )

    async def warmup(self, client: httpx.AsyncClient) -> float:
        """Warm-up requests (not counted); drops vLLM extensions the server refuses."""
        t0 = self.clock()
        n = min(16, self.spec.output_tokens)
        for _ in range(max(1, self.spec.warmup_requests)):
            while True:
                self._serial += 1
                body = request_body(
                    self.api.model, self.spec, self._serial, output_tokens=n, dropped=self.dropped
                )
                try:
                    await astream_chat(
                        client,
                        CHAT_PATH,
                        body,
                        timeout=self.spec.request_timeout_s,
                        idle_timeout=self.spec.idle_timeout_s,
                        keep=False,
                    )
                except ServingError as exc:
                    refused = _refused_param(exc, body, self.dropped)
                    if refused is None:
                        raise
                    self.dropped.append(refused)
                    continue
                break
        return self.clock() - t0

    async def level(self, client: httpx.AsyncClient, concurrency: int) -> LevelResult:
        total = self.spec.requests_at(concurrency)
        records: list[RequestRecord] = []
        started = 0
        await _open_connections(client, concurrency)
        before = await scrape(client)
        t0 = self.clock()
        cpu0 = time.process_time()

        async def worker() -> None:
            nonlocal started
            while started < total and self.clock() - t0 < self.spec.level_budget_s:
                started += 1
                records.append(await self._one(client, t0))
                if self.progress is not None:
                    what = f"throughput {concurrency} stream{'s' * (concurrency > 1)}"
                    self.progress(self.progress_text(what, records, total))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        ends = [r.start + (r.e2e or 0.0) for r in records]
        wall = max(ends, default=self.clock() - t0)
        cpu = time.process_time() - cpu0
        metrics = await level_metrics(client, before, self.spec.idle_timeout_s)
        return LevelResult(concurrency, records, wall, cpu, metrics=metrics)

    async def sweep(self) -> SweepResult:
        async with self._client() as client:
            before = await fetch_metrics(client)
            warm = await self.warmup(client)
            levels = [await self.level(client, c) for c in self.spec.concurrency]
            after = await fetch_metrics(client)
        counted = sum(lv.output_tokens for lv in levels)
        return SweepResult(
            self.spec,
            levels,
            list(self.dropped),
            warm,
            self.api.base_url,
            server_view(before, after, counted),
        )


class LaneTransport(httpx.AsyncBaseTransport):
    """Each request in flight gets a lane of its own: an httpx transport holding one
    keep-alive connection, taken from the free lanes (the most recently freed first, its
    connection warm) and given back when the response closes; a new lane when none is free.

    httpcore's pool scans every connection, and for each idle one every connection again,
    whenever a request starts or ends: at 64 idle connections (a level's start) that is
    ~4,000 checks per request, ~270,000 for the first round, all before the requests go
    out, on the client's one event loop. A lane's pool holds one connection. The lanes share
    one TLS context (httpx loads the CA bundle per transport, ~0.2 s each)."""

    def __init__(self) -> None:
        self._free: list[httpx.AsyncHTTPTransport] = []
        self._all: list[httpx.AsyncHTTPTransport] = []
        self._ssl: Any = None

    def _lane(self) -> httpx.AsyncHTTPTransport:
        if self._free:
            return self._free.pop()
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        lane = httpx.AsyncHTTPTransport(
            verify=self._ssl, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)
        )
        self._all.append(lane)
        return lane

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        lane = self._lane()
        try:
            response = await lane.handle_async_request(request)
        except BaseException:
            self._free.append(lane)
            raise
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_LaneStream(stream, lambda: self._free.append(lane)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        lanes, self._all, self._free = self._all, [], []
        for lane in lanes:
            await lane.aclose()


class _LaneStream(httpx.AsyncByteStream):
    """A response body that gives its lane back once, when closed."""

    def __init__(self, stream: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


async def _open_connections(client: httpx.AsyncClient, n: int) -> None:
    """Open ``n`` pooled connections before the clock starts (``GET /v1/models`` n at a
    time), so a level measures serving, not a burst of TCP connects: at 64 streams a cold
    pool put ~1 s on the first round's TTFT against the emulator."""

    async def get() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the level's own requests will say
            await capped_arequest(client, "GET", "/v1/models", timeout=30.0)

    await asyncio.gather(*(get() for _ in range(n)))


async def fetch_metrics(client: httpx.AsyncClient) -> dict[str, float] | None:
    """The server's Prometheus counters (vLLM ``/metrics``), or None where there are none."""
    text = await metrics_text(client)
    return None if text is None else parse_metrics(text)


def server_view(
    before: dict[str, float] | None, after: dict[str, float] | None, counted: int
) -> dict[str, Any] | None:
    """What the server counted over the sweep (warm-up included), next to the client's own
    count of the levels' output tokens; the KV-cache metric name tells the version."""
    if before is None or after is None:
        return None
    generated = after.get(GEN_TOKENS, 0.0) - before.get(GEN_TOKENS, 0.0)
    kv = kv_cache_metric(after)
    return {
        "generation_tokens": int(generated),
        "client_output_tokens": counted,
        "kv_cache_metric": kv,
        "kv_cache_usage": after.get(kv) if kv else None,
    }


def _refused_param(exc: ServingError, body: dict[str, Any], dropped: list[str]) -> str | None:
    """The optional parameter a 400/422 names (e.g. ``ignore_eos``), if any."""
    if exc.status not in (400, 422):
        return None
    text = (exc.error.message if exc.error else "") + " " + exc.exchange.body
    for name in OPTIONAL_PARAMS:
        if name in body and name not in dropped and name in text:
            return name
    return None


def run_sweep(api: ApiEndpoint, spec: LoadSpec, progress: Progress | None = None) -> SweepResult:
    """Synchronous entry point (for tests and scripts): warm-up, then every level."""
    return asyncio.run(LoadClient(api, spec, progress=progress).sweep())
