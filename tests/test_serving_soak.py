"""The soak's judgements on synthetic timings and /metrics samples: tokens per window,
drift between the first and last window, preemptions and the waiting queue's growth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_spark.serving.load.soak import (
    Sample,
    drift_pct,
    preemptions_during,
    sample_of,
    waiting_growth,
    window_tok_s,
)
from pytest_spark.serving.load.sweep import RequestRecord


def rec(start: float, ttft: float, e2e: float, tokens: int) -> RequestRecord:
    return RequestRecord(start=start, ttft=ttft, e2e=e2e, output_tokens=tokens)


def test_tokens_are_spread_over_each_request_decode_span() -> None:
    # 100 tokens decoded from t=1 to t=11: 10 tok/s, windows of 5 s
    windows = window_tok_s([rec(0.0, 1.0, 11.0, 100)], 5.0, 15.0)
    assert windows == pytest.approx([8.0, 10.0, 2.0])  # 4 s, 5 s and 1 s of decode
    failed = RequestRecord(start=0.0, ttft=0.1, e2e=1.0, output_tokens=9, error="HTTP 500")
    assert window_tok_s([failed], 5.0, 10.0) == [0.0, 0.0]
    assert window_tok_s([rec(0.0, 1.0, 11.0, 100)], 5.0, 14.9) == pytest.approx([8.0, 10.0])


def test_drift_between_first_and_last_window() -> None:
    assert drift_pct([100.0, 98.0, 80.0]) == pytest.approx(-20.0)
    assert drift_pct([100.0]) is None and drift_pct([0.0, 5.0]) is None


def test_preemptions_and_waiting_queue_from_samples() -> None:
    samples = [
        sample_of(0.0, {"vllm:num_preemptions_total": 2.0, "vllm:num_requests_waiting": 0.0}),
        sample_of(5.0, {"vllm:num_preemptions_total": 2.0, "vllm:num_requests_waiting": 1.0}),
        sample_of(20.0, {"vllm:num_preemptions_total": 5.0, "vllm:num_requests_waiting": 6.0}),
        sample_of(25.0, {"vllm:num_preemptions_total": 5.0, "vllm:num_requests_waiting": 8.0}),
    ]
    assert preemptions_during(samples) == 3.0
    assert waiting_growth(samples, 5.0) == pytest.approx(7.0 - 0.5)
    assert sample_of(1.0, None) == Sample(1.0, None, None)
    assert preemptions_during([sample_of(0.0, None)]) is None
    assert waiting_growth([sample_of(0.0, {})], 5.0) is None
    # an older vLLM's counter without the _total suffix reads the same
    assert sample_of(0.0, {"vllm:num_preemptions": 4.0}).preemptions == 4.0


def test_the_soak_runs_after_every_other_check_even_when_named_first() -> None:
    """Its heat would reach the closed-loop levels measured after it (the heat-throttle
    row's throughput ran after the soak, throttled, before the soak was moved last)."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--co",
            "-q",
            "-p",
            "no:cacheprovider",
            "--spark-head=198.18.0.1",
            "tests_e2e/test_soak.py",
            "tests_e2e/test_throughput.py",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    soak = [i for i in ids if i.startswith("tests_e2e/test_soak.py::")]
    rest = [i for i in ids if i not in soak]
    assert soak and rest, out.stdout + out.stderr
    assert ids == rest + soak, ids
