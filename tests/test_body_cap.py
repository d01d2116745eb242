"""Every HTTP body the suite reads has a ceiling (issue #25 section 5: a 2 GB /v1/models made
a run use 9.9 GB): past ``MAX_BODY_BYTES`` reading stops, and the message says it was cut.
Each body here is 20 MiB, served in 1 MiB pieces: past the ceiling nothing more is read."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from pytest_spark.access import body
from pytest_spark.access.body import MAX_BODY_BYTES
from pytest_spark.serving import ServingError, post_json, stream_chat

MIB = 1 << 20


def pieces(piece: bytes, count: int = 20) -> Iterator[bytes]:
    """``count`` pieces: more than the ceiling, and finite, so a reader without one
    returns (and fails the test) instead of eating the machine's memory."""
    for _ in range(count):
        yield piece


def client_answering(content_type: str, parts: Iterator[bytes]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=parts)

    return httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(handler))


def test_get_stops_at_the_cap_and_says_it_was_cut() -> None:
    with client_answering("application/json", pieces(b" " * MIB)) as client:
        got = body.get(client, "/v1/models")
    assert got.cut and len(got.content) == MAX_BODY_BYTES == 16 * MIB
    assert got.excerpt(20).endswith(
        "(body cut at 16 MiB: the server sent more than any answer asked for)"
    )
    with pytest.raises(ValueError, match="body cut at 16 MiB"):
        got.json()


def test_small_body_is_whole() -> None:
    with client_answering("application/json", iter([b'{"a": ', b"1}"])) as client:
        got = body.get(client, "/x")
    assert not got.cut and got.json() == {"a": 1}


def test_post_json_body_past_the_cap_is_a_serving_error() -> None:
    with (
        client_answering("application/json", pieces(b'{"choices": [' + b" " * MIB)) as client,
        pytest.raises(ServingError) as info,
    ):
        post_json(client, "/v1/chat/completions", {"model": "m"}, timeout=30)
    assert info.value.kind == "oversized"
    assert "with a body of more than 16 MiB, cut there" in info.value.message
    assert len(info.value.exchange.body or "") <= 64 * 1024  # the evidence stays small


def test_stream_past_the_cap_is_a_serving_error() -> None:
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": "x" * MIB}}]}
    event = f"data: {json.dumps(chunk)}\n\n".encode()
    with (
        client_answering("text/event-stream", pieces(event)) as client,
        pytest.raises(ServingError) as info,
    ):
        stream_chat(
            client, "/v1/chat/completions", {"model": "m"}, timeout=60, idle_timeout=30, keep=False
        )
    assert info.value.kind == "oversized"
    assert re.search(
        r"the stream passed 16 MiB after \d+ chunks and was cut there", info.value.message
    )
    assert "no data: [DONE] came before it" in info.value.message


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client stops reading at the ceiling and hangs up: that is the point


class _Huge(BaseHTTPRequestHandler):
    """Answers every POST with 20 MiB that never closes its JSON."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(20 * MIB + 1))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(b"{")
            for _ in range(20):
                self.wfile.write(b" " * MIB)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_sdk_reads_bodies_up_to_the_cap() -> None:
    """The openai SDK reads its bodies itself: its transport stops at the ceiling too."""
    from pytest_spark.access.api import ApiEndpoint
    from pytest_spark.serving.client.sdk import SdkClient

    httpd = _QuietServer(("127.0.0.1", 0), _Huge)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    sdk = SdkClient(ApiEndpoint(f"http://127.0.0.1:{httpd.server_address[1]}", "m"), timeout=30)
    try:
        with pytest.raises(ServingError) as info:
            sdk.turn({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, False)
    finally:
        sdk.close()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
    assert info.value.kind == "oversized", info.value.message
    assert "the response body passed 16 MiB and was cut there" in info.value.message
