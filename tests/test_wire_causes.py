"""One root cause, one failure for the serving wire and its dependents (issue #13 §4): the
wire verdicts judge the canary (SSE framing, a JSON body) and a dependent request that
broke the same way is cited to them; a slow single-stream decode owns the aggregate
shortfall it explains; streamed tool-call arguments that never come are one verdict's; a
serving environment wrong the same way on every node is the head's check's, and the TCP
fallback it forces is cited to it. Pure logic here, on real wire text and fixtures."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.nccl.check import socket_forced_by_env
from pytest_spark.infra.nccl.parse import parse_nccl_tests
from pytest_spark.infra.preflight.env_check import check_serving_env, same_env_as, same_env_note
from pytest_spark.infra.preflight.probe import parse_container_env
from pytest_spark.serving.client.evidence import Exchange
from pytest_spark.serving.client.stream import ServingError, post_json, stream_chat
from pytest_spark.serving.client.turn import assemble
from pytest_spark.serving.load.slo import Goodput
from pytest_spark.serving.validate.causes import (
    BODY_VERDICT,
    STREAM_VERDICT,
    body_failure,
    check_stream_wire,
    cited_verdict,
    decode_explains_aggregate,
    decode_explains_goodput,
    knee_cause,
    trim,
    wire_cause,
    wire_verdict,
)
from pytest_spark.serving.validate.tools import unstreamed_arguments

REPO = Path(__file__).resolve().parents[1]
PREFLIGHT = REPO / "fixtures" / "preflight"
NCCL = REPO / "fixtures" / "nccl"
SERVER = "qwen at http://127.0.0.1:8000"
CHUNK = (
    '{"id":"c","object":"chat.completion.chunk","model":"qwen","choices":[{"index":0,'
    '"delta":{"content":"OK"},"finish_reason":null}]}'
)
BODY = {"model": "qwen", "messages": [{"role": "user", "content": "Say OK."}]}


def _client(body: bytes, ctype: str = "text/event-stream") -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": ctype}, content=body)

    return httpx.Client(base_url="http://127.0.0.1:8000", transport=httpx.MockTransport(answer))


def _stream(body: bytes) -> ServingError | object:
    with _client(body) as client:
        try:
            return stream_chat(client, "/v1/chat/completions", BODY, timeout=5, idle_timeout=5)
        except ServingError as exc:
            return exc


def _stream_error(body: bytes) -> ServingError:
    got = _stream(body)
    assert isinstance(got, ServingError), got
    return got


# What the emulator's wire faults send (sparksim/emulator/jobs.py), as vLLM frames it.
MALFORMED = f"data: {CHUNK}\n\ndata: {CHUNK[: len(CHUNK) // 2]}\n\ndata: [DONE]\n\n".encode()
TRUNCATED = f"data: {CHUNK}\n\ndata: {CHUNK}\n\n".encode()
HEALTHY = f"data: {CHUNK}\n\ndata: {CHUNK}\n\ndata: [DONE]\n\n".encode()


def test_stream_verdict_fails_on_broken_framing_naming_expected_and_fix() -> None:
    for body, words in ((MALFORMED, "is not valid JSON"), (TRUNCATED, "without data: [DONE]")):
        finding = check_stream_wire(_stream_error(body), server=SERVER)
        assert finding.level == "fail"
        assert finding.message.startswith(f"{SERVER}: streamed canary chat completion: POST ")
        assert words in finding.message
        assert "expected text/event-stream of data: {json} events" in finding.message
        assert "proxy" in finding.message and "upgrade vLLM" in finding.message
        assert finding.evidence  # the request and the stream text


def test_stream_verdict_passes_a_healthy_stream() -> None:
    result = _stream(HEALTHY)
    assert not isinstance(result, ServingError)
    finding = check_stream_wire(result, server=SERVER)  # type: ignore[arg-type]
    assert finding.level == "pass" and finding.measured == 2
    assert "2 SSE events, each a JSON object, ended by data: [DONE]" in finding.message


def test_body_verdict_names_the_unparsable_body_and_the_fix() -> None:
    half = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"mess'
    with _client(half, "application/json") as client, pytest.raises(ServingError) as info:
        post_json(client, "/v1/chat/completions", BODY, timeout=5)
    finding = body_failure(info.value, server=SERVER)
    assert finding.level == "fail" and info.value.kind == "not-json"
    assert "canary chat completion: POST" in finding.message
    assert "HTTP 200 but the body is not JSON" in finding.message
    assert "Every non-streaming check reads this body" in finding.message


def test_a_dependent_wire_failure_cites_the_verdict_that_broke_the_same_way() -> None:
    malformed, truncated = _stream_error(MALFORMED), _stream_error(TRUNCATED)
    assert wire_verdict(malformed.kind) == wire_verdict(truncated.kind) == STREAM_VERDICT
    assert wire_verdict("not-json") == BODY_VERDICT
    assert wire_verdict("http-5xx") is None and wire_verdict("stall") is None
    mine = f"{SERVER}: tool_choice=auto, streaming: {malformed.message}"
    reason = wire_cause(malformed.kind, mine, truncated)  # the stream family: one cause
    assert reason is not None and reason.endswith(f"({STREAM_VERDICT} has the evidence)")
    assert "the server's SSE stream is broken for every request, the canary's too" in reason
    assert "tool_choice=auto, streaming" in reason  # which check, and why


def test_a_wire_failure_the_canary_did_not_share_is_reported_where_it_is() -> None:
    malformed = _stream_error(MALFORMED)
    assert wire_cause(malformed.kind, malformed.message, None) is None  # the canary got through
    other = ServingError(
        "not-json", "POST x: HTTP 200 but the body is not JSON", malformed.exchange
    )
    assert wire_cause(malformed.kind, malformed.message, other) is None  # the other family
    assert wire_cause("stall", "no data for 5 s", malformed) is None  # not the wire's


def test_slow_decode_explains_the_aggregate_when_the_streams_scaled() -> None:
    # The fault matrix's slow-decode row: 4.0 tok/s per stream (floor 20), 15.9 tok/s at
    # 4 streams (floor 45): 3.97x the single stream, the profile expects 2.25x.
    assert decode_explains_aggregate(15.9, 45, 4.0, 20)
    # Batching limited as well (4 streams no faster than one): a cause of its own.
    assert not decode_explains_aggregate(4.2, 45, 4.0, 20)
    # The decode is fine: the aggregate shortfall is the aggregate check's own failure.
    assert not decode_explains_aggregate(30.0, 45, 25.0, 20)
    assert not decode_explains_aggregate(15.9, 45, None, 20)  # nothing measured
    assert not decode_explains_aggregate(50.0, 45, 4.0, 20)  # the aggregate did not fail


def _goodput(good: int, broken: dict[str, int]) -> Goodput:
    limits = {"ttft": 1.5, "tpot": 0.1, "e2e": 8.0}
    return Goodput(8, good, 4.0, broken, dict.fromkeys(limits, 1.0), limits, {})


def test_a_knee_under_its_floor_cites_the_goodput_gate_that_broke_the_same_slos() -> None:
    # The fault matrix's open-loop row: TTFT + 1 s per running request; 2 of 8 requests met
    # the SLOs at 4 closed-loop streams: the goodput gate's failure, the knee skips.
    cause = knee_cause(_goodput(2, {"ttft": 6}), 4, 90.0, 155.0, 20.0)
    assert cause == (
        "the SLOs already break in the closed loop: goodput 25.0% at 4 streams, expected >= "
        "90%, most broken: TTFT (test_goodput has the evidence)"
    )
    # The closed loop met them: capacity that runs out above its streams is the knee's own.
    assert knee_cause(_goodput(8, {}), 4, 90.0, 155.0, 20.0) is None
    assert knee_cause(None, 4, 90.0, 155.0, 20.0) is None  # no such level in the sweep
    # Goodput lost to slow decode steps: the goodput gate cites the decode verdict, so does
    # the knee (when that verdict runs; else the goodput gate's).
    slow = _goodput(0, {"tpot": 8})
    assert "(test_decode_single_stream has the evidence)" in str(knee_cause(slow, 4, 90, 4, 20))
    alone = knee_cause(slow, 4, 90, 4, 20, decode_verdict=False)
    assert str(alone).endswith("(test_goodput has the evidence)")
    assert decode_explains_goodput("e2e", 4.0, 20.0)
    assert not decode_explains_goodput("ttft", 4.0, 20.0)
    assert not decode_explains_goodput("tpot", 25.0, 20.0)
    assert not decode_explains_goodput("tpot", None, 20.0)


def _streamed_call(fragments: list[str]) -> list[dict[str, object]]:
    header = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    deltas: list[dict[str, object]] = [{"role": "assistant", "content": ""}]
    deltas.append({"tool_calls": [header]})
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": f}}]} for f in fragments]
    chunks = [
        {"id": "s", "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    chunks.append(
        {"id": "s", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    )
    return chunks


def test_unstreamed_arguments_name_each_call_and_its_header_chunk() -> None:
    ex = Exchange("POST", "http://127.0.0.1:8000/v1/chat/completions", streamed=True)
    lost = assemble(_streamed_call([]), ex)
    assert unstreamed_arguments(lost) == (
        "the streamed tool-call arguments never came: call 0 (get_weather, header at chunk 2), "
        "then no argument fragments"
    )
    fine = assemble(_streamed_call(['{"city": "Paris",', ' "days": 2}']), ex)
    assert unstreamed_arguments(fine) is None


def test_cited_verdict_says_which_check_failed_why_and_where() -> None:
    owner = Finding.failed(
        {"content_chars": 9},
        {"content": "answer"},
        message="reasoning (non-streaming): </think> leaked into content: '</think>\\n\\nOK'",
    )
    reason = cited_verdict("test_reasoning_separated[plain]", "reasoning (streaming)", owner)
    assert reason == (
        "reasoning (streaming): the same failure as test_reasoning_separated[plain]: reasoning "
        "(non-streaming): </think> leaked into content: '</think>\\n\\nOK' "
        "(test_reasoning_separated[plain] has the evidence)"
    )
    assert trim("a\n b  c" * 100, 20).endswith("...") and len(trim("x" * 50, 20)) == 20


FABRIC = ["enP2p1s0f1np1", "enp1s0f1np1"]
DEVS = ["roceP2p1s0f1", "rocep1s0f1"]
NODE_IFS = {"lo": True, "mgmt0": True, "enp1s0f1np1": True, "enP2p1s0f1np1": True}


def _env_finding(node: str, name: str) -> Finding:
    env = parse_container_env((PREFLIGHT / name).read_text())
    return check_serving_env(node, "vllm_node", env, FABRIC, DEVS, NODE_IFS)


def test_a_worker_wrong_as_the_head_is_cited_to_the_heads_check() -> None:
    head = _env_finding("spark-head", "container_env_nccl_socket.json")
    worker = _env_finding("spark-worker-1", "container_env_nccl_socket.json")
    reason = same_env_as("spark-worker-1", worker, "spark-head", head)
    assert reason is not None
    assert reason.startswith("spark-worker-1: its serving container's environment is spark-head's")
    assert "NCCL_IB_DISABLE=1" in reason
    assert reason.endswith("(test_serving_env_matches_fabric[spark-head] has the evidence)")
    noted = same_env_note(head, ["spark-worker-1"])
    assert noted.message.endswith(
        "The same environment on spark-worker-1: this one fix covers them."
    )
    assert same_env_note(head, []) is head


def test_a_worker_wrong_its_own_way_reports_itself() -> None:
    healthy = _env_finding("spark-head", "container_env_healthy.json")
    worker = _env_finding("spark-worker-1", "container_env_nccl_socket.json")
    assert same_env_as("spark-worker-1", worker, "spark-head", healthy) is None
    assert same_env_as("spark-head", healthy, "spark-head", healthy) is None


def test_socket_fallback_is_the_env_that_turns_rdma_off() -> None:
    socket = parse_nccl_tests((NCCL / "all_reduce_socket_fallback.txt").read_text()).transports
    ib = parse_nccl_tests((NCCL / "all_reduce_sweep_healthy.txt").read_text()).transports
    off = {"NCCL_IB_DISABLE": "1"}
    on = {"NCCL_IB_DISABLE": "0"}
    assert socket and ib
    assert socket_forced_by_env(socket, [("spark-head", on), ("spark-worker-1", off)]) == (
        "spark-worker-1",
        "NCCL_IB_DISABLE=1",
    )
    assert socket_forced_by_env(socket, [("spark-head", on), ("spark-worker-1", None)]) is None
    assert socket_forced_by_env(ib, [("spark-head", off)]) is None  # NCCL is on IB after all
