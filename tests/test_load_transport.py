"""The load client's transport (serving/load/sweep.py LaneTransport): one keep-alive connection per
request in flight, reused across requests, and no per-request bookkeeping that grows with
the number of connections (httpcore's shared pool checked every connection against every
idle one each time a request started or ended: ~270,000 checks before a 64-stream level's
first round went out). Counted, not timed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpcore
import pytest
from test_serving_load import Paced, QuietServer  # type: ignore[import-not-found]

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.load.sweep import LaneTransport, LoadClient, LoadSpec

STREAMS = 32


class Counting(Paced):
    """The paced SSE server, counting the connections it accepts; GET answers keep them
    open (the level's opening GETs)."""

    connections = 0

    def setup(self) -> None:
        type(self).connections += 1
        super().setup()

    def do_GET(self) -> None:
        data = b'{"object":"list","data":[]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Backlogged(QuietServer):
    request_queue_size = 4 * STREAMS  # a level's connections arrive at once


@pytest.fixture
def server() -> Iterator[str]:
    Counting.connections = 0
    httpd = Backlogged(("127.0.0.1", 0), Counting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def spec() -> LoadSpec:
    return LoadSpec(
        concurrency=(STREAMS,),
        prompt_tokens=16,
        output_tokens=4,
        requests_per_stream=2,
        min_requests=2,
        warmup_requests=1,
        level_budget_s=30,
        request_timeout_s=30,
        idle_timeout_s=10,
        ignore_eos=False,  # the paced server refuses ignore_eos
    )


def test_a_level_costs_the_client_per_request_not_per_connection_squared(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks = {"n": 0}
    real = httpcore.AsyncHTTPConnection.is_idle

    def counted(self: Any) -> bool:
        checks["n"] += 1
        return bool(real(self))

    monkeypatch.setattr(httpcore.AsyncHTTPConnection, "is_idle", counted)
    client = LoadClient(ApiEndpoint(server, "m"), spec())

    async def run() -> Any:
        async with client._client() as http:
            await client.warmup(http)
            checks["n"] = 0
            return await client.level(http, STREAMS)

    level = asyncio.run(run())
    doc = level.to_dict()
    assert (doc["requests"], doc["failed"]) == (2 * STREAMS, 0), doc["errors"]
    # Each request's lane holds one connection: a few checks per request, whatever the
    # number of streams (the shared pool made ~STREAMS^2 per request: 2,000+ here).
    per_request = checks["n"] / doc["requests"]
    assert per_request < 10, per_request
    # One connection per stream, opened before the level and kept alive across its
    # requests (the warm-up's, the level's opening GETs', the 2 requests of each stream).
    assert Counting.connections <= STREAMS + 1, Counting.connections


def test_lanes_are_reused_and_closed() -> None:
    transport = LaneTransport()
    lane = transport._lane()
    transport._free.append(lane)
    assert transport._lane() is lane  # the most recently freed lane (its connection warm)
    assert transport._lane() is not lane  # none free: a new one
    asyncio.run(transport.aclose())
    assert transport._all == [] and transport._free == []
