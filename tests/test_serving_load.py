"""The load client's arithmetic on synthetic timings, and one small sweep against a local
server that paces tokens at a known rate and refuses ``ignore_eos`` (as non-vLLM servers
do)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving import LevelResult, LoadSpec, Summary, percentile, run_sweep
from pytest_spark.serving.load.openloop import OpenLoopSpec, poisson_schedule, run_rate_sweep
from pytest_spark.serving.load.slo import Slo
from pytest_spark.serving.load.soak import SoakSpec, run_soak
from pytest_spark.serving.load.sweep import LoadClient, RequestRecord, request_body


def delta_chunk(**delta: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def test_percentiles_match_numpy_linear() -> None:
    data = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(data, 50) == 3.0
    assert percentile(data, 90) == pytest.approx(7.6)
    assert percentile(data, 99) == pytest.approx(9.76)
    assert percentile([5.0], 99) == 5.0 and math.isnan(percentile([], 50))
    s = Summary.of(data)
    assert (s.count, s.mean, s.median, s.min, s.max) == (5, 4.0, 3.0, 1.0, 10.0)
    assert Summary.of([]).to_dict()["mean"] is None


def test_request_record_timings() -> None:
    rec = RequestRecord(start=0.0)
    rec.on_chunk(0.05, delta_chunk(role="assistant", content=""))  # not a token
    rec.on_chunk(0.50, delta_chunk(reasoning="Okay"))  # first token: reasoning counts
    rec.on_chunk(0.60, delta_chunk(reasoning_content=" so"))
    rec.on_chunk(0.75, delta_chunk(content="42"))  # first content token
    rec.on_chunk(0.80, delta_chunk(content="."))
    rec.on_chunk(0.80, {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5}})
    rec.e2e = 0.90
    assert rec.ttft == 0.50 and rec.ttfc == 0.75
    assert rec.gaps == pytest.approx([0.10, 0.15, 0.05])
    assert rec.output_tokens == 5 and rec.prompt_tokens == 12 and rec.deltas == 4
    assert rec.tpot == pytest.approx((0.90 - 0.50) / 4)


def test_level_figures() -> None:
    records = []
    for i in range(4):  # 4 requests of 11 tokens: TTFT 0.1, then 10 tokens at 0.02 s
        rec = RequestRecord(
            start=i * 0.3, ttft=0.1, ttfc=0.1, e2e=0.3, output_tokens=11, gaps=[0.02] * 10
        )
        records.append(rec)
    records.append(RequestRecord(start=0.0, e2e=0.01, error="HTTP 500", error_kind="http-5xx"))
    level = LevelResult(1, records, wall_s=1.2, cpu_s=0.011)
    doc = level.to_dict()
    assert json.loads(json.dumps(doc)) == doc  # JSON-ready
    assert doc["requests"] == 4 and doc["failed"] == 1 and doc["errors"] == ["HTTP 500"]
    assert doc["output_tokens"] == 44 and doc["output_tok_s"] == pytest.approx(44 / 1.2, 1e-3)
    assert doc["tpot_s"]["median"] == pytest.approx(0.02)
    assert doc["decode_tok_s"]["median"] == pytest.approx(50.0)
    assert doc["itl_s"]["count"] == 40 and doc["ttft_s"]["p90"] == pytest.approx(0.1)
    assert doc["client_cpu_s_per_1k_tokens"] == pytest.approx(0.25)


def test_request_body_fixed_lengths() -> None:
    spec = LoadSpec(prompt_tokens=64, output_tokens=32)
    body = request_body("m", spec, 7)
    assert body["max_tokens"] == body["max_completion_tokens"] == 32
    assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["content"].startswith("Request 7.")
    assert "ignore_eos" not in request_body("m", spec, 7, dropped=["ignore_eos"])


RATE = 100.0  # tokens/s per stream
TTFT = 0.05


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away


class Paced(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if "ignore_eos" in body:
            data = b'{"error":{"message":"Unrecognized request argument: ignore_eos"}}'
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        n = int(body["max_tokens"])
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        t0 = time.monotonic()
        for i in range(n):
            delay = t0 + TTFT + i / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._send({"choices": [{"index": 0, "delta": {"content": " w"}}]})
        self._send({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": n}})
        self._send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def _send(self, obj: Any) -> None:
        text = obj if isinstance(obj, str) else json.dumps(obj)
        data = f"data: {text}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


@pytest.fixture(scope="module")
def paced() -> Iterator[str]:
    httpd = QuietServer(("127.0.0.1", 0), Paced)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_sweep_against_paced_server(paced: str) -> None:
    spec = LoadSpec(
        concurrency=(1, 4),
        prompt_tokens=32,
        output_tokens=21,
        requests_per_stream=1,
        min_requests=3,
        warmup_requests=1,
        level_budget_s=10,
        request_timeout_s=10,
        idle_timeout_s=5,
    )
    result = run_sweep(ApiEndpoint(paced, "m"), spec)
    doc = result.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert result.dropped_params == ["ignore_eos"]
    one, four = doc["levels"]
    assert (one["requests"], four["requests"], one["failed"]) == (3, 4, 0)
    assert one["token_source"] == ["usage"] and one["output_tokens"] == 63
    # What the client measured cannot beat the server's schedule: its clock starts before
    # the request is sent, the first token comes TTFT after it is read, token i at
    # TTFT + i / RATE (late ones are sent at once). How close it comes (the client's
    # accuracy) is a figure of benchmarks/load_client_accuracy.py, not of a timed test:
    # a loaded 2-core machine adds any amount of delay.
    slack = 0.002  # timestamps rounded to 6 digits, monotonic clock resolution
    for level in (one, four):
        assert level["ttft_s"]["min"] >= TTFT - slack
        assert level["e2e_s"]["min"] >= TTFT + 20 / RATE - slack
        assert level["decode_tok_s"]["count"] == level["requests"]
    assert one["decode_tok_s"]["median"] > 0
    assert one["itl_s"]["median"] > 0 and one["itl_s"]["count"] == 3 * 20
    assert four["output_tok_s"] <= 4 * 21 / (TTFT + 20 / RATE) * 1.05


def test_server_metrics_view_detects_the_kv_metric_name() -> None:
    from pathlib import Path

    from pytest_spark.serving import kv_cache_metric, parse_metrics
    from pytest_spark.serving.load.sweep import server_view

    real = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "vllm-0.32.0-cpu"
    metrics = parse_metrics((real / "metrics_vllm.txt").read_text().split("\n\n", 1)[1])
    assert kv_cache_metric(metrics) == "vllm:kv_cache_usage_perc"
    assert metrics["vllm:generation_tokens_total"] == 352.0
    old = parse_metrics(
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
        'vllm:generation_tokens_total{model_name="m"} 10.0\n'
    )
    assert kv_cache_metric(old) == "vllm:gpu_cache_usage_perc"
    view = server_view(old, {**old, "vllm:generation_tokens_total": 74.0}, 60)
    assert view == {
        "generation_tokens": 64,
        "client_output_tokens": 60,
        "kv_cache_metric": "vllm:gpu_cache_usage_perc",
        "kv_cache_usage": 0.25,
    }
    assert server_view(None, old, 1) is None


def test_sweep_json_round_trip(paced: str) -> None:
    """What a sweep shares with other xdist workers (run dir JSON) rebuilds it exactly."""
    from pytest_spark.measure.codec import dump, load_as
    from pytest_spark.serving import SweepResult

    spec = LoadSpec(concurrency=(1, 2), output_tokens=5, min_requests=2, warmup_requests=1)
    result = run_sweep(ApiEndpoint(paced, "m"), spec)
    back = load_as(SweepResult, json.loads(json.dumps(dump(result))))
    assert back == result
    assert back.to_dict() == result.to_dict()
    assert (
        back.level(2) is not None and back.level(2).decode_rates() == result.level(2).decode_rates()
    )  # type: ignore[union-attr]


def test_serving_error_json_round_trip() -> None:
    from pytest_spark.serving import Exchange, ServingError, parse_error_body

    body = '{"error": {"message": "ignore_eos is not supported", "type": "BadRequest"}}'
    exchange = Exchange(
        "POST",
        "http://127.0.0.1:8000/v1/chat/completions",
        request_body={"model": "m", "stream": True},
        request_headers={"Authorization": "Bearer sk-secret", "Content-Type": "application/json"},
        status=400,
        reason="Bad Request",
        response_headers={"content-type": "application/json"},
        body=body,
        streamed=True,
        elapsed_s=0.012,
    )
    error = ServingError("http-4xx", "HTTP 400: ignore_eos", exchange, parse_error_body(body), 3)
    back = ServingError.from_json(json.loads(json.dumps(error.to_json())))
    assert (back.kind, back.message, back.error, back.chunks) == (
        error.kind,
        error.message,
        error.error,
        error.chunks,
    )
    assert back.finding("warm-up") == error.finding("warm-up")  # the key is redacted in both
    assert "sk-secret" not in json.dumps(error.to_json())


def test_rate_sweep_finds_the_knee_of_a_paced_server(paced: str) -> None:
    """The paced server answers each request in TTFT + 20 / RATE = 0.25 s at the soonest,
    whatever the load: a 30 s TTFT SLO holds at every rate (the knee is the top rate tried),
    an E2E SLO of 0.1 s breaks at the first rate (no knee) and the sweep stops there."""
    load = LoadSpec(prompt_tokens=16, output_tokens=21, warmup_requests=1, level_budget_s=10)
    spec = OpenLoopSpec(start_rate=4.0, rate_factor=2.0, max_levels=2, requests_per_level=6)
    lines: list[str] = []
    lc = LoadClient(ApiEndpoint(paced, "m"), load)
    sweep = run_rate_sweep(lc, spec, Slo(ttft_s=30.0, min_goodput_pct=100.0), lines.append)
    doc = sweep.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert [lv["rate"] for lv in doc["levels"]] == [4.0, 8.0]
    assert all(lv["met"] and lv["requests"] == 6 for lv in doc["levels"])
    assert doc["knee_req_s"] == 8.0 and sweep.knee == 8.0
    level = doc["levels"][0]["level"]
    assert level["rate"] == 4.0 and level["output_tokens"] == 6 * 21
    # sent on the seeded Poisson schedule: never before a request's time (late on a busy
    # machine: late_s records by how much)
    starts = sorted(r.start for r in sweep.levels[0].level.records)
    expected = poisson_schedule(4.0, 6, spec.seed)
    assert all(s >= e - 0.005 for s, e in zip(starts, expected, strict=True))
    assert sweep.levels[0].late_s >= 0.0
    assert lines[-1].startswith("open loop 8 req/s: 6/6 requests 100% ")
    tight = run_rate_sweep(
        LoadClient(ApiEndpoint(paced, "m"), load), spec, Slo(e2e_s=0.1, min_goodput_pct=50.0)
    )
    assert [lv.rate for lv in tight.levels] == [4.0] and tight.knee is None
    assert tight.levels[0].goodput.worst() == "e2e"


def test_soak_holds_the_load_and_reports_windows(paced: str) -> None:
    """2 streams for 1.2 s at 0.25 s a request: about 10 requests, two windows of 0.5 s at
    about 2 x 21 / 0.25 = 168 tok/s each (no drift), /metrics absent (None, not 0)."""
    load = LoadSpec(prompt_tokens=16, output_tokens=21, warmup_requests=1)
    lines: list[str] = []
    spec = SoakSpec(duration_s=1.2, concurrency=2, window_s=0.5)
    result = run_soak(LoadClient(ApiEndpoint(paced, "m"), load), spec, lines.append)
    doc = result.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["failed"] == 0 and 8 <= doc["requests"] <= 12
    assert len(doc["window_tok_s"]) == 2
    assert all(w <= 2 * 21 / 0.25 * 1.05 for w in doc["window_tok_s"])
    assert doc["preemptions"] is None and doc["waiting_growth"] is None
    assert lines[-1].startswith(f"soak 1/1 s: {doc['requests']} requests 100% ")
