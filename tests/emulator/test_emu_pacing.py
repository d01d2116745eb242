"""Token pacing: per-stream decode rate holds within 5% from 1 to 32 concurrent streams
(uncapped), and the aggregate cap shares a fixed budget across streams."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import pytest

from conftest import Emu, set_faults

RATE = 40.0
TOKENS = 81  # 80 gaps at 40 tok/s: ~2 s per stream


def one_stream(port: int, out: list[dict[str, float]], tokens: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    start = time.monotonic()
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
    )
    resp = conn.getresponse()
    stamps: list[float] = []
    usage = 0
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: [DONE]"):
            break
        if b'"delta":{"content":"' in line and b'"content":""' not in line:
            stamps.append(time.monotonic())  # cheap check: keep the client off the CPU
        elif b'"usage":' in line:
            usage = json.loads(line[6:])["usage"]["completion_tokens"]
    resp.read()
    conn.close()
    out.append(
        {
            "rate": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "ttft": stamps[0] - start,
            "tokens": usage,
            "end": stamps[-1],
        }
    )


def run(emu: Emu, streams: int, tokens: int = TOKENS) -> tuple[list[dict[str, float]], float]:
    results: list[dict[str, float]] = []
    threads = [
        threading.Thread(target=one_stream, args=(emu.port, results, tokens))
        for _ in range(streams)
    ]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wall = max(r["end"] for r in results) - start
    assert len(results) == streams
    return results, wall


@pytest.fixture
def paced(qwen: Emu) -> Any:
    set_faults(qwen, [], decode_tok_s=RATE, ttft_s=0.1)
    yield qwen
    set_faults(qwen, [])


@pytest.mark.parametrize("streams", [1, 8, 32])
def test_per_stream_rate_is_accurate(paced: Emu, streams: int) -> None:
    results, wall = run(paced, streams)
    rates = [r["rate"] for r in results]
    mean = sum(rates) / len(rates)
    agg = sum(r["tokens"] for r in results) / wall
    print(
        f"\npacing {streams:2d} streams @ {RATE:.0f} tok/s: mean {mean:.2f} min {min(rates):.2f} "
        f"max {max(rates):.2f} tok/s, ttft {sum(r['ttft'] for r in results) / streams:.3f} s, "
        f"aggregate {agg:.1f} tok/s"
    )
    assert all(r["tokens"] == TOKENS for r in results)
    assert all(abs(rate - RATE) / RATE < 0.05 for rate in rates), rates


def test_aggregate_cap_shares_the_budget(paced: Emu) -> None:
    set_faults(paced, [], decode_tok_s=RATE, ttft_s=0.05, max_agg_tok_s=160)
    results, _ = run(paced, 8, 41)
    rates = [r["rate"] for r in results]
    mean = sum(rates) / len(rates)
    print(f"\ncapped 8 streams @ {RATE:.0f} tok/s, cap 160: mean {mean:.2f} tok/s per stream")
    assert abs(mean - 20.0) / 20.0 < 0.1  # 160 / 8
