"""Depth x concurrency (#27 §2): the option, the heat-aware order, prefix-cache busting, the
llama-benchy report fields and the report's table (pure; the emulator run is in
tests/test_serving_suite.py)."""

from __future__ import annotations

import itertools

import pytest

from pytest_spark.report.depth import depth_html, table_rows
from pytest_spark.serving.load.depth import (
    CellResult,
    DepthResult,
    heat,
    heat_order,
    prompt,
    request_body,
)
from pytest_spark.serving.load.sweep import RequestRecord
from pytest_spark.settings.parsers import ARENA_CONCURRENCY, ARENA_DEPTHS, DepthSweep, depth_sweep

pytestmark = pytest.mark.unit


def test_the_option_reads_the_arena_profile_or_a_trimmed_spec() -> None:
    assert depth_sweep("off") is None
    arena = depth_sweep("arena")
    assert arena == DepthSweep(runs=3, prefix_caching=True)
    assert arena.depths == (0, 4096, 8192, 16384, 32768, 65535, 100000)
    assert (arena.pp, arena.tg, arena.concurrency) == (2048, 128, (1, 2, 5, 10))
    small = depth_sweep("depths=0,256;pp=64;tg=8;c=1,2;cooldown=1.5s")
    assert small == DepthSweep((0, 256), 64, 8, (1, 2), 1.5)
    for bad, says in (
        ("depths=0,x", "whole numbers"),
        ("c=0,1", "at least 1"),
        ("tg=0", "at least 1 token"),
        ("warp=9", "unknown key 'warp'"),
        ("fast", "not KEY=VALUE"),
    ):
        with pytest.raises(ValueError, match=says):
            depth_sweep(bad)


def test_the_heat_aware_order_alternates_hot_and_cool_cells() -> None:
    spec = DepthSweep()
    order = heat_order(spec)
    assert sorted(order) == sorted((d, c) for d in ARENA_DEPTHS for c in ARENA_CONCURRENCY)
    assert order[0] == (100000, 10) and order[1] == (0, 1)  # hottest, then coolest
    heats = [heat(spec, cell) for cell in order]
    # a hot cell is always followed by a cooler one, and the hot half only ever cools
    assert all(heats[i] > heats[i + 1] for i in range(0, len(heats) - 1, 2))
    assert heats[::2] == sorted(heats[::2], reverse=True)
    # never two of the hottest half in a row (an ascending sweep runs all of them last)
    median = sorted(heats)[len(heats) // 2]
    assert not any(a >= median and b >= median for a, b in itertools.pairwise(heats))


def test_every_request_starts_with_its_own_nonce_and_carries_the_depth() -> None:
    a, b = prompt("run-0-0", 300, 64), prompt("run-0-1", 300, 64)
    assert a.startswith("[run-0-0] ") and b.startswith("[run-0-1] ") and a[:10] != b[:10]
    words = len(a.split())
    assert 300 + 64 - 12 <= words <= 300 + 64 + 16
    assert "Context:" not in prompt("n", 0, 64)
    body = request_body("m", DepthSweep(pp=64, tg=8), "n", 100)
    assert body["max_tokens"] == 8 and body["ignore_eos"] is True and body["stream"] is True


def _record(start: float, ttft: float, e2e: float, out: int, prompt_tokens: int) -> RequestRecord:
    record = RequestRecord(start=start, ttft=ttft, e2e=e2e, output_tokens=out)
    record.prompt_tokens = prompt_tokens
    return record


def test_a_cell_is_written_in_llama_benchys_fields() -> None:
    spec = DepthSweep((0, 1000), 100, 11, (1, 2))
    cell = CellResult(
        1000,
        2,
        [_record(0.0, 0.5, 1.5, 11, 1100), _record(0.0, 1.0, 2.0, 11, 1100)],
        order=3,
        wall_s=2.0,
    )
    b = cell.to_benchy(spec)
    assert (b["concurrency"], b["context_size"], b["prompt_size"], b["response_size"]) == (
        2,
        1000,
        100,
        11,
    )
    assert b["pp_req_throughput"]["values"] == [2200.0, 1100.0]  # 1100 tokens / TTFT
    assert b["pp_throughput"]["values"] == [2200.0]  # 2200 tokens in the 1 s to the last
    assert b["tg_req_throughput"]["values"] == [10.0, 10.0]  # 10 tokens after the first, 1 s
    assert b["tg_throughput"]["values"] == [13.333]  # 20 tokens from 0.5 s to 2.0 s
    assert b["e2e_ttft"] == {"mean": 750.0, "std": 250.0, "values": [500.0, 1000.0]}
    assert b["failed"] == 0 and b["run_order"] == 3
    failed = RequestRecord(start=0.0, e2e=0.1, error="400: too long", error_kind="http")
    broken = CellResult(1000, 1, [failed], order=0, wall_s=0.1).to_benchy(spec)
    assert broken["failed"] == 1 and broken["e2e_ttft"] is None
    assert broken["errors"] == ["400: too long"]


def test_the_run_is_a_llama_benchy_report_and_a_report_table() -> None:
    spec = DepthSweep((0,), 100, 11, (1,))
    result = DepthResult(spec, "qwen", started="2026-12-03T17:00:00+00:00", prefix_caching=True)
    result.cells.append(CellResult(0, 1, [_record(0.0, 0.1, 1.1, 11, 100)], 0, 1.1))
    report = result.to_benchy()
    required = {"version", "timestamp", "latency_mode", "latency_ms", "model"}
    assert required | {"prefix_caching_enabled", "max_concurrency", "benchmarks"} <= set(report)
    assert report["max_concurrency"] == 1 and report["heat_order"] == [[0, 1]]
    rows = table_rows(report)
    assert rows == [
        {
            "depth": "0",
            "concurrency": "1",
            "pp tok/s": "1000.0 ± 0.0 (n=1)",
            "tg tok/s": "10.0 ± 0.0 (n=1)",
            "tg tok/s per request": "10.0 ± 0.0 (n=1)",
            "TTFT ms": "100 ± 0 (n=1)",
            "order": "0",
            "failed": "0",
        }
    ]
    doc = {"checks": [{"extra": {"depth_sweep": report}}]}
    html = depth_html(doc)
    assert 'id="spark-depth"' in html and "<td>1000.0 ± 0.0 (n=1)</td>" in html
    assert "0x1" in html and depth_html({"checks": []}) == ""
