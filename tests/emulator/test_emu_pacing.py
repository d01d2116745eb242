"""Token pacing: per-stream decode rate from 1 to 32 concurrent streams (uncapped, the
step model's batch growth off: step_expert_share 0), a batch's slower step with it on
(tests/emulator/test_emu_step_model.py holds the model itself), and the aggregate cap
shares a fixed budget across streams.

Held to what a loaded 2-core machine cannot fake: the emulator sends on an absolute
schedule, so a stream is never faster than its rate (late wake-ups only delay tokens), and
the median gap between tokens is the rate's (a late token is followed by a catch-up, so
contention shortens gaps as often as it stretches them; a pacer that drifts slow stretches
every one). The +-5% accuracy of the mean rate on an idle machine is a benchmark:
benchmarks/emu_pacing.py."""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from typing import Any

import pytest

from conftest import Emu, set_faults
from sparksim.emulator.config import Knobs
from sparksim.emulator.generation import StepModel

RATE = 40.0
TOKENS = 81  # 80 gaps at 40 tok/s: ~2 s per stream
TTFT = 0.1
EPS = 1e-3  # float rounding between the two processes' readings of one monotonic clock


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
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
    out.append(
        {
            "rate": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "ttft": stamps[0] - start,
            "tokens": usage,
            "end": stamps[-1],
            "took": stamps[-1] - start,  # request sent -> last token read
            "median_gap": gaps[len(gaps) // 2],
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
    set_faults(qwen, [], decode_tok_s=RATE, ttft_s=TTFT, step_expert_share=0)
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
    # Never faster: the TTFT, then one token per 1/RATE at the earliest.
    floor = TTFT + (TOKENS - 1) / RATE
    assert all(r["took"] >= floor - EPS for r in results), ([r["took"] for r in results], floor)
    # Not slower: the median gap is the rate's.
    gaps = [r["median_gap"] for r in results]
    assert all(gap <= 1.05 / RATE for gap in gaps), (gaps, 1 / RATE)


def test_a_batch_steps_slower(paced: Emu) -> None:
    """4 streams with the default step model: each stream's median gap is the 4-sequence
    step, not the 1-stream one (never faster; the median not slower)."""
    k = Knobs()
    share, streams, tokens = k.step_expert_share, 4, 41
    set_faults(paced, [], decode_tok_s=RATE, ttft_s=TTFT, step_expert_share=share)
    step = StepModel(RATE, share, k.step_expert_pick, k.step_kv_s_per_token).step_s(streams)
    results, _ = run(paced, streams, tokens)
    gaps = [r["median_gap"] for r in results]
    print(f"\n4 streams @ {RATE:.0f} tok/s: median gaps {gaps}, step {step:.4f} s")
    assert all(r["tokens"] == tokens for r in results)
    assert all(0.95 * step <= gap <= 1.05 * step for gap in gaps), (gaps, step, 1 / RATE)


def test_aggregate_cap_shares_the_budget(paced: Emu) -> None:
    cap, streams, tokens = 160.0, 8, 41
    set_faults(paced, [], decode_tok_s=RATE, ttft_s=0.05, max_agg_tok_s=cap, step_expert_share=0)
    results, wall = run(paced, streams, tokens)
    rates = [r["rate"] for r in results]
    mean = sum(rates) / len(rates)
    print(f"\ncapped 8 streams @ {RATE:.0f} tok/s, cap 160: mean {mean:.2f} tok/s per stream")
    assert all(r["tokens"] == tokens for r in results)
    # Never more than the cap: 8 x 40 tok/s would be 320 tok/s; the slots are 1/160 s apart
    # (the first one at once), so the last of the 8 x 41 tokens goes out no earlier than this.
    assert wall >= (streams * tokens - 1) / cap - EPS, wall
    # The budget is shared, not starved: each stream's median gap is 8/160 s.
    gaps = [r["median_gap"] for r in results]
    assert all(gap <= 1.1 * streams / cap for gap in gaps), (gaps, streams / cap)
