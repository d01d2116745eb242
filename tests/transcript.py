"""Recorded HTTP exchanges (``fixtures/vllm/*/*.txt``) read back into ``Exchange``s and
``Turn``s, so validators can be run on what a real server sent.

File format: request line, JSON request body, ``--- HTTP STATUS REASON``, response
headers, a blank line, then the raw body (SSE exactly as sent for streams).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pytest_spark.serving.client.evidence import Exchange
from pytest_spark.serving.client.stream import _Stream
from pytest_spark.serving.client.turn import Turn, assemble, from_response


def read_exchange(path: Path) -> Exchange:
    text = path.read_text()
    head, sep, rest = text.partition("\n--- HTTP ")
    if not sep:
        raise ValueError(f"{path}: no '--- HTTP' line")
    request_line, _, request_body = head.partition("\n")
    method, _, url = request_line.partition(" ")
    status_line, _, rest = rest.partition("\n")
    status, _, reason = status_line.partition(" ")
    header_text, _, body = rest.partition("\n\n")
    headers = {}
    for line in header_text.splitlines():
        key, _, value = line.partition(": ")
        headers[key] = value
    streamed = "text/event-stream" in headers.get("content-type", "")
    return Exchange(
        method,
        url,
        json.loads(request_body) if request_body.strip() else None,
        {},
        int(status),
        reason,
        headers,
        body,
        streamed,
    )


def read_turn(path: Path) -> Turn:
    """A recorded chat completion, streamed or not, as a ``Turn``."""
    ex = read_exchange(path)
    if ex.streamed:
        return assemble(sse_chunks(ex.body), ex)
    data: dict[str, Any] = json.loads(ex.body)
    return from_response(data, ex)


def sse_chunks(body: str) -> list[dict[str, Any]]:
    """Parse a whole SSE body with the stream client's own decoder (errors raise)."""
    state = _Stream(Exchange("POST", "(recorded)", streamed=True), True, None, 0.0)
    state.feed(body.encode(), time.perf_counter())
    state.finish(0.0)
    return state.chunks
