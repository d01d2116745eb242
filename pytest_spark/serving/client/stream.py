"""HTTP for the serving checks: server-sent events read exactly, and every way a request
can fail turned into one clear ``ServingError`` (message + raw evidence), never a hang.

SSE framing (WHATWG): lines end in LF, CRLF or CR; ``data:`` lines (one optional space
after the colon) accumulate, a blank line dispatches the event; ``:`` lines are comments.
vLLM sends ``data: {json}\\n\\n`` per chunk and ends with ``data: [DONE]``; a mid-stream
failure is ``data: {"error": {...}}``.

Two clocks bound every request: ``timeout`` for the whole request and ``idle_timeout``
between two reads of the body (a stalled stream fails with "no data for N s after M
chunks"). Synchronous streams check the whole-request deadline between reads and use
``min(idle_timeout, timeout)`` as the read timeout, so a stall can never outlast either.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from pytest_spark.access.body import MAX_BODY_BYTES, size_text
from pytest_spark.access.body import request as capped_request
from pytest_spark.infra.finding import Finding
from pytest_spark.measure.codec import dump, load, load_as
from pytest_spark.serving.client.evidence import Exchange, redact_headers, short
from pytest_spark.serving.client.wire import ErrorBody, parse_error_body

DONE = "[DONE]"
MAX_ERROR_BODY = 64 * 1024
ChunkCallback = Callable[[float, dict[str, Any]], None]


class ServingError(Exception):
    """A request that gave no usable answer. ``kind`` names the failure; ``exchange`` holds
    the request and whatever came back (stream text so far), for the report."""

    def __init__(
        self,
        kind: str,
        message: str,
        exchange: Exchange,
        error: ErrorBody | None = None,
        chunks: int = 0,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.exchange = exchange
        self.error = error
        self.chunks = chunks

    @property
    def status(self) -> int | None:
        return self.exchange.status

    def to_json(self) -> dict[str, Any]:
        """JSON data to rebuild this error in another process (credentials redacted)."""
        exchange = replace(
            self.exchange, request_headers=redact_headers(self.exchange.request_headers)
        )
        return {
            "kind": self.kind,
            "message": self.message,
            "exchange": dump(exchange),
            "error": dump(self.error),
            "chunks": self.chunks,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServingError:
        return cls(
            data["kind"],
            data["message"],
            load_as(Exchange, data["exchange"]),
            load(ErrorBody | None, data["error"]),
            int(data["chunks"]),
        )

    def finding(self, behaviour: str = "", expected: Any = "a usable answer") -> Finding:
        """The failure as a ``Finding``: behaviour that broke, message, evidence."""
        prefix = f"{behaviour}: " if behaviour else ""
        return Finding.failed(
            self.kind,
            expected,
            message=prefix + self.message,
            evidence=self.exchange.evidence(failure=self.kind),
        )


class SSEDecoder:
    """Incremental SSE parser: feed bytes, get complete events' ``data`` strings."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._data: list[str] = []
        self._skip_lf = False
        self.comments = 0

    def feed(self, chunk: bytes) -> list[str]:
        text = self._text.decode(chunk)
        if self._skip_lf and text.startswith("\n"):
            text = text[1:]
        self._skip_lf = False
        self._buf += text
        events: list[str] = []
        while True:
            cut = _line_end(self._buf)
            if cut is None:
                break
            end, nxt = cut
            line = self._buf[:end]
            if nxt == len(self._buf) and self._buf[end] == "\r":
                self._skip_lf = True  # a CR at the end of this read may be half of CRLF
            self._buf = self._buf[nxt:]
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> str | None:
        if line == "":
            if not self._data:
                return None
            data = "\n".join(self._data)
            self._data = []
            return data
        if line.startswith(":"):
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if not colon:
            value = ""
        elif value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        return None  # event:, id:, retry: and unknown fields do not matter here

    @property
    def pending(self) -> str:
        """What arrived after the last complete event (an unterminated event at EOF)."""
        return "\n".join([*self._data, self._buf]).strip()


def _line_end(buf: str) -> tuple[int, int] | None:
    lf = buf.find("\n")
    cr = buf.find("\r")
    if cr < 0 and lf < 0:
        return None
    if cr < 0 or (0 <= lf < cr):
        return lf, lf + 1
    if cr + 1 < len(buf) and buf[cr + 1] == "\n":
        return cr, cr + 2
    return cr, cr + 1


@dataclass
class StreamResult:
    """A complete stream: parsed chunks with arrival times (s after the request was sent)."""

    chunks: list[dict[str, Any]]
    times: list[float]
    exchange: Exchange
    headers_s: float = 0.0
    total_s: float = 0.0
    count: int = 0


@dataclass
class _Stream:
    """What both drivers share: framing, JSON, [DONE], errors, the raw text for evidence."""

    exchange: Exchange
    keep: bool
    on_chunk: ChunkCallback | None
    t0: float
    decoder: SSEDecoder = field(default_factory=SSEDecoder)
    raw: list[str] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    count: int = 0
    done: bool = False
    after_done: int = 0
    received: int = 0
    cap: int = MAX_BODY_BYTES

    def feed(self, data: bytes, now: float) -> None:
        t = now - self.t0
        self.received += len(data)
        if self.received > self.cap:
            raise self.error(
                "oversized",
                f"the stream passed {size_text(self.cap)} after {self.count} chunks and was "
                "cut there (more than any answer the suite asks for)"
                + ("" if self.done else ": no data: [DONE] came before it"),
            )
        for event in self.decoder.feed(data):
            if self.keep or len(self.raw) < 8:
                self.raw.append(event)
            else:
                self.raw[-1] = event  # keep the head and the latest for evidence
            if self.done:
                self.after_done += 1
                continue
            if event == DONE:
                self.done = True
                continue
            try:
                chunk = json.loads(event)
            except ValueError as exc:
                raise self.error(
                    "malformed-sse",
                    f"SSE data line {self.count + 1} is not "
                    f"valid JSON ({exc}): {short('data: ' + event, 200)}",
                ) from None
            if not isinstance(chunk, dict):
                raise self.error(
                    "malformed-sse",
                    f"SSE data line {self.count + 1} is JSON "
                    f"but not an object: {short(event, 200)}",
                )
            if "error" in chunk and "choices" not in chunk:
                err = parse_error_body(event)
                raise self.error(
                    "stream-error",
                    f"the server reported an error mid-stream after "
                    f"{self.count} chunks: {short(err.message, 300)}"
                    + (f" (type {err.type}, code {err.code})" if err.type or err.code else ""),
                    err,
                )
            self.count += 1
            if self.keep:
                self.chunks.append(chunk)
                self.times.append(t)
            if self.on_chunk is not None:
                self.on_chunk(t, chunk)

    def evidence_exchange(self, elapsed: float | None = None) -> Exchange:
        body = "".join(f"data: {e}\n\n" for e in self.raw)
        if not self.keep and self.count > len(self.raw):
            body = f"({self.count} chunks; first and last kept)\n" + body
        pending = self.decoder.pending
        if pending:
            body += f"{pending}\n(unterminated at end of stream)"
        return _replace(self.exchange, body=body, elapsed_s=elapsed)

    def error(self, kind: str, message: str, err: ErrorBody | None = None) -> ServingError:
        where = f"{self.exchange.method} {self.exchange.url} (stream)"
        return ServingError(kind, f"{where}: {message}", self.evidence_exchange(), err, self.count)

    def finish(self, now: float) -> StreamResult:
        if not self.done:
            last = f"; last data: {short(self.raw[-1], 160)}" if self.raw else ""
            raise self.error(
                "truncated",
                f"connection closed after {self.count} chunks "
                f"without data: [DONE]: the stream was cut short (server crash, "
                f"worker death or a proxy timeout){last}",
            )
        total = now - self.t0
        return StreamResult(
            self.chunks, self.times, self.evidence_exchange(total), total_s=total, count=self.count
        )


def _replace(ex: Exchange, **changes: Any) -> Exchange:
    return replace(ex, **changes)


def _exchange(
    method: str, url: str, body: Any, headers: Mapping[str, str], streamed: bool
) -> Exchange:
    return Exchange(method, url, body, dict(headers), streamed=streamed)


def _sent_key(headers: Mapping[str, str]) -> bool:
    return any(k.lower() == "authorization" for k in headers)


def http_failure(
    ex: Exchange, status: int, reason: str, headers: Mapping[str, str], text: str
) -> ServingError:
    """A non-200 answer as a ServingError whose message quotes the body (never the key)."""
    ex = _replace(ex, status=status, reason=reason, response_headers=dict(headers), body=text)
    err = parse_error_body(text)
    where = f"{ex.method} {ex.url}"
    quoted = short(err.message or text, 400)
    if status == 401:
        if _sent_key(ex.request_headers):
            hint = (
                "the API key sent was refused (wrong key?); check SPARK_API_KEY or "
                "--spark-api-key-file (the key is not shown)"
            )
        else:
            hint = (
                "the server requires an API key and none was sent; set SPARK_API_KEY "
                "or --spark-api-key-file"
            )
        return ServingError("auth", f"{where}: HTTP 401: {hint}. Server said: {quoted}", ex, err)
    if status >= 500:
        hint = (
            "the engine may have died (look for EngineDeadError / RayActorError in the "
            "server log) or the server is overloaded"
        )
        return ServingError(
            "http-5xx", f"{where}: HTTP {status} {reason}: {quoted}; {hint}", ex, err
        )
    return ServingError("http-4xx", f"{where}: HTTP {status} {reason}: {quoted}", ex, err)


def _not_sse(ex: Exchange, headers: Mapping[str, str], text: str) -> ServingError:
    ctype = headers.get("content-type", "(none)")
    ex = _replace(ex, status=200, response_headers=dict(headers), body=text)
    try:
        json.loads(text)
        what = 'a JSON body (did the server ignore "stream": true?)'
    except ValueError:
        what = f"a non-JSON body {short(text, 200)}"
    return ServingError(
        "not-sse",
        f"{ex.method} {ex.url} (stream): expected an SSE stream "
        f"(text/event-stream), got content-type {ctype} and {what}",
        ex,
    )


def _timeouts(timeout: float, idle: float) -> httpx.Timeout:
    read = min(idle, timeout)
    return httpx.Timeout(connect=min(timeout, 30.0), read=read, write=read, pool=timeout)


def _transport_error(
    ex: Exchange, exc: Exception, state: _Stream | None, idle: float, timeout: float, elapsed: float
) -> ServingError:
    where = f"{ex.method} {ex.url}" + (" (stream)" if ex.streamed else "")
    chunks = state.count if state else 0
    evidence = state.evidence_exchange(elapsed) if state else ex
    if isinstance(exc, httpx.ReadTimeout | TimeoutError | asyncio.TimeoutError):
        if elapsed >= timeout - 0.05:
            return ServingError(
                "timeout",
                f"{where}: no complete answer within the "
                f"{timeout:g} s request timeout ({chunks} chunks received)",
                evidence,
                chunks=chunks,
            )
        if state is not None:
            # vLLM answers a stream's headers before the engine schedules it: silence from
            # the first chunk on may be a request still waiting for a sequence.
            queued = "a request still queued behind --max-num-seqs running ones, " * (not chunks)
            return ServingError(
                "stall",
                f"{where}: no data for {min(idle, timeout):g} s after "
                f"{chunks} chunks: the stream stalled (engine hang, {queued}or a "
                "proxy buffering SSE)",
                evidence,
                chunks=chunks,
            )
        return ServingError(
            "stall",
            f"{where}: no response data for {min(idle, timeout):g} s (server hung or overloaded)",
            evidence,
            chunks=chunks,
        )
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ServingError(
            "connect",
            f"{where}: cannot connect: {exc} (server down or still "
            "loading: vLLM refuses connections until ready)",
            evidence,
        )
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError) and state is not None:
        return state.error(
            "truncated",
            f"connection closed after {chunks} chunks without "
            f"data: [DONE] ({type(exc).__name__}: {exc}): the stream was cut "
            "short (server crash, worker death or a proxy timeout)",
        )
    return ServingError(
        "transport", f"{where}: {type(exc).__name__}: {exc}", evidence, chunks=chunks
    )


def stream_chat(
    client: httpx.Client,
    path: str,
    body: dict[str, Any],
    *,
    timeout: float,
    idle_timeout: float,
    keep: bool = True,
    on_chunk: ChunkCallback | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamResult:
    """POST ``body`` (with ``stream: true``) and read the SSE answer to ``[DONE]``."""
    url = str(client.base_url.join(path))
    headers = {**client.headers, "content-type": "application/json"}
    ex = _exchange(
        "POST",
        url,
        body,
        {k: v for k, v in headers.items() if k.lower() in ("authorization", "content-type")},
        True,
    )
    t0 = clock()
    state: _Stream | None = None
    try:
        with client.stream(
            "POST", path, json=body, timeout=_timeouts(timeout, idle_timeout)
        ) as resp:
            rheaders = dict(resp.headers)
            if resp.status_code != 200:
                text = _read_limited(resp.iter_bytes())
                raise http_failure(ex, resp.status_code, resp.reason_phrase, rheaders, text)
            ex = _replace(ex, status=200, reason=resp.reason_phrase, response_headers=rheaders)
            if "text/event-stream" not in rheaders.get("content-type", ""):
                raise _not_sse(ex, rheaders, _read_limited(resp.iter_bytes()))
            state = _Stream(ex, keep, on_chunk, t0)
            for data in resp.iter_bytes():
                now = clock()
                state.feed(data, now)
                if now - t0 > timeout:
                    raise TimeoutError
            return state.finish(clock())
    except ServingError:
        raise
    except (httpx.HTTPError, TimeoutError) as exc:
        raise _transport_error(ex, exc, state, idle_timeout, timeout, clock() - t0) from None


async def astream_chat(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    *,
    timeout: float,
    idle_timeout: float,
    keep: bool = True,
    on_chunk: ChunkCallback | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamResult:
    """The asynchronous twin of ``stream_chat`` (whole-request deadline exact)."""
    url = str(client.base_url.join(path))
    ex = _exchange(
        "POST",
        url,
        body,
        {k: v for k, v in client.headers.items() if k.lower() == "authorization"},
        True,
    )
    t0 = clock()
    holder: list[_Stream] = []
    try:
        async with asyncio.timeout(timeout):
            async with client.stream(
                "POST", path, json=body, timeout=_timeouts(timeout, idle_timeout)
            ) as resp:
                rheaders = dict(resp.headers)
                if resp.status_code != 200:
                    text = await _aread_limited(resp)
                    raise http_failure(ex, resp.status_code, resp.reason_phrase, rheaders, text)
                ex = _replace(ex, status=200, reason=resp.reason_phrase, response_headers=rheaders)
                if "text/event-stream" not in rheaders.get("content-type", ""):
                    raise _not_sse(ex, rheaders, await _aread_limited(resp))
                state = _Stream(ex, keep, on_chunk, t0)
                holder.append(state)
                async for data in resp.aiter_bytes():
                    state.feed(data, clock())
                return state.finish(clock())
    except ServingError:
        raise
    except (httpx.HTTPError, TimeoutError) as exc:
        raise _transport_error(
            ex, exc, holder[0] if holder else None, idle_timeout, timeout, clock() - t0
        ) from None


def _read_limited(parts: Any) -> str:
    buf = bytearray()
    for part in parts:
        buf += part
        if len(buf) > MAX_ERROR_BODY:
            break
    return buf.decode("utf-8", "replace")


async def _aread_limited(resp: httpx.Response) -> str:
    buf = bytearray()
    async for part in resp.aiter_bytes():
        buf += part
        if len(buf) > MAX_ERROR_BODY:
            break
    return buf.decode("utf-8", "replace")


@dataclass
class Reply:
    """A complete non-streaming JSON answer."""

    data: dict[str, Any]
    exchange: Exchange


def post_json(client: httpx.Client, path: str, body: dict[str, Any], *, timeout: float) -> Reply:
    """POST and parse a JSON answer; any other outcome is a ServingError."""
    url = str(client.base_url.join(path))
    ex = _exchange(
        "POST",
        url,
        body,
        {k: v for k, v in client.headers.items() if k.lower() == "authorization"},
        False,
    )
    t0 = time.perf_counter()
    try:
        resp = capped_request(client, "POST", path, json=body, timeout=httpx.Timeout(timeout))
    except httpx.HTTPError as exc:
        raise _transport_error(ex, exc, None, timeout, timeout, time.perf_counter() - t0) from None
    elapsed = time.perf_counter() - t0
    text = resp.text
    if resp.cut:
        raise ServingError(
            "oversized",
            f"POST {url}: HTTP {resp.status_code} with a body of more than "
            f"{size_text(resp.cap)}, cut there (more than any answer the suite asks for): "
            f"{short(text, 200)}",
            _replace(
                ex,
                status=resp.status_code,
                reason=resp.reason_phrase,
                response_headers=dict(resp.headers),
                body=text[:MAX_ERROR_BODY],
                elapsed_s=elapsed,
            ),
        )
    if resp.status_code != 200:
        raise http_failure(ex, resp.status_code, resp.reason_phrase, dict(resp.headers), text)
    ex = _replace(
        ex,
        status=200,
        reason=resp.reason_phrase,
        response_headers=dict(resp.headers),
        body=text,
        elapsed_s=elapsed,
    )
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ServingError(
            "not-json",
            f"POST {url}: HTTP 200 but the body is not JSON ({exc}): {short(text, 200)}",
            ex,
        ) from None
    if not isinstance(data, dict):
        raise ServingError(
            "not-json",
            f"POST {url}: HTTP 200 but the body is not a JSON object: {short(text, 200)}",
            ex,
        )
    return Reply(data, ex)
