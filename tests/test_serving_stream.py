"""The SSE client against a local server that misbehaves on purpose: stall, truncation,
bad JSON, mid-stream error, 500, 401, non-SSE and non-JSON bodies; and the decoder's
framing rules. Every failure must be clear, bounded in time, and never show the key."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving import (
    ServingClient,
    ServingError,
    SSEDecoder,
    TurnCache,
    astream_chat,
    post_json,
    stream_chat,
)

KEY = "sk-very-secret-key"
CHUNK = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
}
USAGE = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def sse(obj: Any) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client hung up on purpose (stall, timeout tests)


class Hold:
    """A stream the server keeps open until the test lets it go: the test then knows
    whether the client gave up first, with no wall-clock bound (a loaded machine can take
    seconds to schedule either side)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.ended = threading.Event()  # the server finished the stream itself

    def reset(self) -> None:
        self.release.clear()
        self.ended.clear()


HOLD = Hold()
HOLD_MAX_S = 60.0  # a client that never gives up is failed by the server ending first
CHAT_SEEN: list[str] = []
CHAT_REPLY = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _head(
        self, status: int = 200, ctype: str = "text/event-stream", chunked: bool = True
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("connection", "close")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self, status: int, text: str, ctype: str = "application/json") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        request = self.rfile.read(int(self.headers.get("content-length", 0)))
        path = self.path
        if path == "/ok":
            self._head()
            self._chunk(sse(CHUNK)[:10])  # a chunk boundary inside an event
            self._chunk(sse(CHUNK)[10:] + sse(CHUNK).replace(b"\n", b"\r\n"))
            self._chunk(b": keep-alive comment\n\n" + sse(USAGE) + sse("[DONE]"))
            self._end()
        elif path == "/stall":
            self._head()
            self._chunk(sse(CHUNK) + sse(CHUNK))
            HOLD.release.wait(HOLD_MAX_S)
            HOLD.ended.set()
            self._end()
        elif path == "/drip":
            self._head()
            deadline = time.monotonic() + HOLD_MAX_S
            while not HOLD.release.is_set() and time.monotonic() < deadline:
                self._chunk(sse(CHUNK))
                time.sleep(0.05)
            HOLD.ended.set()
            self._end()
        elif path == "/truncated-chunked":
            self._head()
            self._chunk(sse(CHUNK) + sse(CHUNK))
            self.wfile.write(b'ff\r\ndata: {"id"')  # a chunk cut short, then close
            self.wfile.flush()
            self.close_connection = True
        elif path == "/truncated-close":
            self._head(chunked=False)
            self.wfile.write(sse(CHUNK) + sse(CHUNK))
            self.close_connection = True
        elif path == "/badjson":
            self._head()
            self._chunk(sse(CHUNK) + b'data: {"id": "c1", "choices": [\n\n' + sse("[DONE]"))
            self._end()
        elif path == "/error":
            self._head()
            err = {
                "error": {"message": "EngineCore died", "type": "InternalServerError", "code": 500}
            }
            self._chunk(sse(CHUNK) + sse(err) + sse("[DONE]"))
            self._end()
        elif path == "/500":
            self._body(
                500,
                '{"error":{"message":"EngineDeadError: engine core died",'
                '"type":"InternalServerError","param":null,"code":500}}',
            )
        elif path == "/401":
            self._body(401, '{"error":"Unauthorized"}')
        elif path == "/json":
            self._body(200, '{"choices": []}')
        elif path == "/html":
            self._body(200, "<html>gateway</html>", "text/html")
        elif path == "/v1/chat/completions":  # TurnCache: counts what reaches the server
            CHAT_SEEN.append(json.loads(request)["messages"][-1]["content"])
            if CHAT_SEEN[-1] == "fail":
                self._body(500, '{"error":{"message":"boom","type":"x","code":500}}')
            else:
                self._body(200, json.dumps(CHAT_REPLY))
        else:
            self._body(404, "{}")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = QuietServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


BODY = {"model": "m", "messages": [], "stream": True}


def fail(client: httpx.Client, path: str, timeout: float = 5.0, idle: float = 0.5) -> ServingError:
    with pytest.raises(ServingError) as info:
        stream_chat(client, path, BODY, timeout=timeout, idle_timeout=idle)
    err = info.value
    assert KEY not in err.message and KEY not in json.dumps(err.exchange.evidence())
    return err


def test_ok_stream_framing(client: httpx.Client) -> None:
    result = stream_chat(client, "/ok", BODY, timeout=5, idle_timeout=1)
    assert result.count == 3 and result.chunks[-1]["usage"]["completion_tokens"] == 2
    assert len(result.times) == 3 and result.total_s >= result.times[-1]
    assert "<redacted>" in result.exchange.evidence()["request"]


@pytest.fixture
def hold() -> Iterator[Hold]:
    HOLD.reset()
    try:
        yield HOLD
    finally:
        HOLD.release.set()  # the held handler ends; the next test resets


def test_stall_fails_with_idle_timeout(client: httpx.Client, hold: Hold) -> None:
    err = fail(client, "/stall", idle=0.3)
    assert not hold.ended.is_set()  # the server still stalls: the idle timeout cut it
    assert err.kind == "stall"
    assert "no data for 0.3 s after 2 chunks" in err.message
    assert err.exchange.evidence()["stream"].count("data:") == 2


def test_whole_request_timeout(client: httpx.Client, hold: Hold) -> None:
    err = fail(client, "/drip", timeout=0.5, idle=1.0)
    assert not hold.ended.is_set()  # the server still drips: the request timeout cut it
    assert err.kind == "timeout" and "0.5 s request timeout" in err.message


@pytest.mark.parametrize("path", ["/truncated-chunked", "/truncated-close"])
def test_truncated_stream(client: httpx.Client, path: str) -> None:
    err = fail(client, path)
    assert err.kind == "truncated"
    assert "connection closed after 2 chunks without data: [DONE]" in err.message


def test_invalid_json_is_quoted(client: httpx.Client) -> None:
    err = fail(client, "/badjson")
    assert err.kind == "malformed-sse"
    assert "SSE data line 2 is not valid JSON" in err.message
    assert '\'data: {"id": "c1", "choices": [\'' in err.message


def test_mid_stream_error(client: httpx.Client) -> None:
    err = fail(client, "/error")
    assert err.kind == "stream-error"
    assert "error mid-stream after 1 chunks: 'EngineCore died'" in err.message


def test_http_500_quotes_body(client: httpx.Client) -> None:
    err = fail(client, "/500")
    assert err.kind == "http-5xx" and err.status == 500
    assert "HTTP 500" in err.message and "EngineDeadError: engine core died" in err.message


def test_401_names_the_key_problem_never_the_key(client: httpx.Client, server: str) -> None:
    err = fail(client, "/401")
    assert err.kind == "auth" and "the API key sent was refused" in err.message
    with httpx.Client(base_url=server) as anonymous, pytest.raises(ServingError) as info:
        stream_chat(anonymous, "/401", BODY, timeout=5, idle_timeout=1)
    assert "requires an API key and none was sent" in info.value.message


def test_not_sse(client: httpx.Client) -> None:
    assert "did the server ignore" in fail(client, "/json").message
    assert "non-JSON body '<html>gateway</html>'" in fail(client, "/html").message


def test_non_streaming_body_not_json(client: httpx.Client) -> None:
    with pytest.raises(ServingError) as info:
        post_json(client, "/html", {"model": "m"}, timeout=5)
    assert info.value.kind == "not-json"
    assert "HTTP 200 but the body is not JSON" in info.value.message
    with pytest.raises(ServingError) as info:
        post_json(client, "/500", {"model": "m"}, timeout=5)
    assert info.value.kind == "http-5xx"


def test_connection_refused() -> None:
    with httpx.Client(base_url="http://127.0.0.1:9") as c, pytest.raises(ServingError) as info:
        post_json(c, "/v1/chat/completions", {}, timeout=2)
    assert info.value.kind == "connect" and "cannot connect" in info.value.message


def test_async_stall_and_timeout(server: str, hold: Hold) -> None:
    async def run(path: str, timeout: float, idle: float) -> ServingError:
        async with httpx.AsyncClient(base_url=server) as c:
            with pytest.raises(ServingError) as info:
                await astream_chat(c, path, BODY, timeout=timeout, idle_timeout=idle)
        return info.value

    stall = asyncio.run(run("/stall", 5.0, 0.3))
    assert stall.kind == "stall" and "after 2 chunks" in stall.message
    drip = asyncio.run(run("/drip", 0.4, 1.0))
    assert drip.kind == "timeout"
    assert not hold.ended.is_set()  # both streams were still held: the client cut them
    seen: list[float] = []

    async def ok() -> int:
        async with httpx.AsyncClient(base_url=server) as c:
            r = await astream_chat(
                c,
                "/ok",
                BODY,
                timeout=5,
                idle_timeout=1,
                keep=False,
                on_chunk=lambda t, ch: seen.append(t),
            )
        return r.count

    assert asyncio.run(ok()) == 3 and len(seen) == 3


def test_decoder_framing_rules() -> None:
    dec = SSEDecoder()
    events = dec.feed(b"data: a\r")
    events += dec.feed(b"\ndata:b\r\n\r\n: comment\nevent: x\nid: 1\ndata: c\rdata: d\r\r")
    assert events == ["a\nb", "c\nd"] and dec.comments == 1
    assert dec.feed("data: caf\u00e9".encode()[:-1]) == []
    assert dec.feed("data: caf\u00e9".encode()[-1:] + b"\n\n") == ["caf\u00e9"]
    assert dec.feed(b"data: tail") == [] and dec.pending == "data: tail"


def test_turn_cache_sends_each_request_once_and_keeps_its_error(server: str) -> None:
    client = ServingClient(ApiEndpoint(server, "m"), timeout=5, idle_timeout=5)
    cache = TurnCache(client)
    CHAT_SEEN.clear()
    try:
        first = cache.turn("ask", lambda: client.body("ask"), False)
        again = cache.turn("ask", lambda: client.body("ask"), False)
        assert first is again and first.content == "42"
        for _ in range(2):
            with pytest.raises(ServingError) as info:
                cache.turn("fail", lambda: client.body("fail"), False)
            assert "500" in info.value.message
        assert CHAT_SEEN == ["ask", "fail"], "one request per key, also when it failed"
    finally:
        client.close()
