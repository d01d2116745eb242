"""Every fault is observable: load-time faults on their own process, run-time faults through
the control file of the shared emulator (cleared after each test)."""

from __future__ import annotations

import http.client
import json
import re
import time
from typing import Any

import pytest

from conftest import Emu, refused, set_faults

SAY = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 60}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TOOL_ASK = {
    "messages": [{"role": "user", "content": "What is the weather in Paris for 2 days?"}],
    "tools": [WEATHER],
    "max_tokens": 300,
    **NO_THINK,
}


def raw_stream(emu: Emu, body: dict[str, Any]) -> tuple[bytes, bool]:
    """(body received, whether the chunked response ended cleanly)."""
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "qwen", **body, "stream": True}),
            {"content-type": "application/json"},
        )
        resp = conn.getresponse()
        try:
            return resp.read(), True
        except http.client.IncompleteRead as exc:
            return exc.partial, False
    finally:
        conn.close()


def deltas(emu: Emu, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = emu.chat({**body, "stream": True}).events()
    assert events[-1] == "[DONE]"
    return [json.loads(e)["choices"][0]["delta"] for e in events[:-1] if json.loads(e)["choices"]]


# --- run-time faults (control file) ------------------------------------------------------


def test_http_5xx(faulty: Any) -> None:
    emu = faulty("http-5xx")
    resp = emu.chat(SAY)
    assert resp.status == 500
    assert (
        resp.json()["error"]["type"] == "InternalServerError"
        and resp.json()["error"]["code"] == 500
    )
    assert emu.request("GET", "/health").status == 200  # the server itself is up
    set_faults(emu, [])
    assert emu.chat(SAY).status == 200


def test_engine_hang_answers_health_and_models_but_no_completion(faulty: Any) -> None:
    """sparkrun#252: the API server up, the engine stuck: /health and /v1/models 200, a
    completion never answered (its client times out); answered again once cleared."""
    emu = faulty("engine-hang")
    assert emu.request("GET", "/health").status == 200
    assert emu.request("GET", "/v1/models").status == 200
    body = {"model": "qwen", **SAY, "max_tokens": 1}
    with pytest.raises(TimeoutError):
        emu.request("POST", "/v1/chat/completions", body, timeout=1.0)
    set_faults(emu, [])
    assert emu.chat(SAY).status == 200


def test_slow_decode_divides_the_rate(faulty: Any) -> None:
    emu = faulty("slow-decode", decode_tok_s=200)
    t = time.monotonic()
    r = emu.chat({**SAY, **NO_THINK, "max_tokens": 6, "ignore_eos": True}).json()
    took = time.monotonic() - t
    assert r["usage"]["completion_tokens"] == 6
    assert took >= 5 / 20 * 0.9  # 200 tok/s / 10 -> 5 gaps of 50 ms


def test_malformed_sse(faulty: Any) -> None:
    emu = faulty("malformed-sse")
    events = emu.chat({**SAY, **NO_THINK, "stream": True}).events()
    bad = []
    for e in events[:-1]:
        try:
            json.loads(e)
        except ValueError:
            bad.append(e)
    assert len(bad) == 1 and bad[0].startswith('{"id":"chatcmpl-')
    assert events[-1] == "[DONE]"


def test_truncated_stream(faulty: Any) -> None:
    emu = faulty("truncated-stream")
    body, clean = raw_stream(emu, {**SAY, **NO_THINK})
    assert not clean
    assert b"data: {" in body and b"[DONE]" not in body


def test_invalid_json_body(faulty: Any) -> None:
    emu = faulty("invalid-json-body")
    resp = emu.chat({**SAY, **NO_THINK})
    assert resp.status == 200 and dict(resp.headers)["content-type"] == "application/json"
    with pytest.raises(ValueError):
        json.loads(resp.body)


def test_tool_in_content(faulty: Any) -> None:
    emu = faulty("tool-in-content")
    r = emu.chat(TOOL_ASK).json()["choices"][0]
    assert "tool_calls" not in r["message"] and r["finish_reason"] == "stop"
    assert r["message"]["content"].startswith("<tool_call>\n<function=get_weather>")
    streamed = "".join(d.get("content") or "" for d in deltas(emu, TOOL_ASK))
    assert "<parameter=city>" in streamed


def test_tool_args_unstreamed(faulty: Any) -> None:
    emu = faulty("tool-args-unstreamed")
    calls = [tc for d in deltas(emu, TOOL_ASK) for tc in d.get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"].get("arguments", "") for c in calls) == ""  # never arrive


def test_tool_param_leak(faulty: Any) -> None:
    emu = faulty("tool-param-leak")
    msg = emu.chat(TOOL_ASK).json()["choices"][0]["message"]
    assert msg["tool_calls"] and "</parameter>" in msg["content"]
    assert any("</parameter>" in (d.get("content") or "") for d in deltas(emu, TOOL_ASK))


def test_tool_args_strings(faulty: Any) -> None:
    emu = faulty("tool-args-strings")
    msg = emu.chat(TOOL_ASK).json()["choices"][0]["message"]
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris",
        "days": "2",
    }


def test_tool_delta_no_type(faulty: Any) -> None:
    """vLLM #16340: a named tool_choice stream's header delta has no "type"; the
    non-streaming message and the auto stream keep theirs."""
    emu = faulty("tool-delta-no-type")
    named = {**TOOL_ASK, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    calls = [tc for d in deltas(emu, named) for tc in d.get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["index"] == 0
    assert calls[0]["id"].startswith("chatcmpl-tool-") and "type" not in calls[0]
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls))["city"]
    msg = emu.chat(named).json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["type"] == "function"
    auto = [tc for d in deltas(emu, TOOL_ASK) for tc in d.get("tool_calls") or []]
    assert auto[0]["type"] == "function"


def test_think_in_content(faulty: Any) -> None:
    emu = faulty("think-in-content")
    msg = emu.chat(SAY).json()["choices"][0]["message"]
    assert msg["content"].startswith("</think>") and msg["reasoning"]
    assert any(d.get("content") == "</think>" for d in deltas(emu, SAY))


def test_reasoning_in_content(faulty: Any) -> None:
    emu = faulty("reasoning-in-content")
    msg = emu.chat(SAY).json()["choices"][0]["message"]
    assert msg["reasoning"] is None and msg["content"].startswith("Okay.")
    assert not any("reasoning" in d for d in deltas(emu, SAY))


def test_answer_in_reasoning(faulty: Any) -> None:
    emu = faulty("answer-in-reasoning")
    msg = emu.chat({**SAY, **NO_THINK}).json()["choices"][0]["message"]
    assert msg["content"] is None and msg["reasoning"] == "Hello! How can I assist you today?"


def test_worker_death_via_control_file(emu_factory: Any, tmp_path: Any) -> None:
    control = tmp_path / "control.json"
    emu = emu_factory(
        [
            "--served-model-name",
            "qwen",
            "--tensor-parallel-size",
            "2",
            "--distributed-executor-backend",
            "ray",
        ],
        {"SPARKSIM_EMU_CONTROL": str(control), "SPARKSIM_EMU_DECODE_TOK_S": "20"},
    )
    emu.control = control
    assert emu.request("GET", "/health").status == 200
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=10)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps({**SAY, **NO_THINK, "stream": True, "max_tokens": 200, "ignore_eos": True}),
        {"content-type": "application/json"},
    )
    in_flight = conn.getresponse()
    assert in_flight.read(20).startswith(b"data: ")  # the stream is running
    set_faults(emu, ["worker-death"])
    emu.wait_for(r"EngineDeadError", 5)
    tail = in_flight.read().decode()
    conn.close()
    assert '"InternalServerError"' in tail and tail.rstrip().endswith("data: [DONE]")
    assert emu.request("GET", "/health").status == 503
    assert emu.request("GET", "/ping").status == 503
    resp = emu.chat(SAY)
    assert resp.status == 500
    assert resp.json() == {
        "error": {
            "message": "EngineCore encountered an issue. See stack trace (above) "
            "for the root cause.",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    text = emu.text()
    assert (
        "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task."
        in text
    )
    assert re.search(
        r"^\(APIServer pid=\d+\) ERROR .*vllm\.v1\.engine\.exceptions\.EngineDeadError", text, re.M
    )


# --- load-time faults ----------------------------------------------------------------------

TP2 = [
    "--served-model-name",
    "qwen",
    "--tensor-parallel-size",
    "2",
    "--distributed-executor-backend",
    "ray",
    "--gpu-memory-utilization",
    "0.9",
]


@pytest.mark.parametrize(
    ("fault", "signatures"),
    [
        ("crash-oom", [r"torch\.OutOfMemoryError: CUDA out of memory\."]),
        (
            "crash-free-memory",
            [
                r"ValueError: Free memory on device \(58\.2/119\.7 GiB\) on startup is less "
                r"than desired GPU memory utilization \(0\.9, 107\.73 GiB\)\."
            ],
        ),
        (
            "crash-nccl",
            [
                r"NCCL Error 2: unhandled system error",
                r"Watchdog caught collective operation timeout",
            ],
        ),
    ],
)
def test_crash_faults_exit_non_zero(emu_factory: Any, fault: str, signatures: list[str]) -> None:
    emu = emu_factory(TP2, {"SPARKSIM_EMU_FAULT": fault}, wait=False)
    assert emu.wait_exit(15) == 1
    text = emu.text()
    for signature in signatures:
        assert re.search(signature, text), signature
    assert "RuntimeError: Engine core initialization failed. See root cause above." in text
    assert "Application startup complete" not in text


def test_hang_placement_group(emu_factory: Any) -> None:
    emu = emu_factory(TP2, {"SPARKSIM_EMU_FAULT": "hang-placement-group"}, wait=False)
    first = emu.wait_for(r"Waiting for creating a placement group of specs for \d+ seconds", 10)
    emu.wait_for(r"Waiting for creating a placement group of specs for \d+ seconds", 5, first + 1)
    assert emu.proc.poll() is None and refused(emu.port)


def test_hang_silent(emu_factory: Any) -> None:
    emu = emu_factory(
        TP2, {"SPARKSIM_EMU_FAULT": "hang-silent", "SPARKSIM_EMU_SHARDS": "9"}, wait=False
    )
    emu.wait_for(r"Loading safetensors checkpoint shards:  33% Completed \| 3/9", 10)
    count = len(emu.lines)
    time.sleep(0.3)
    assert len(emu.lines) == count and emu.proc.poll() is None and refused(emu.port)


def test_slow_load_and_combined_faults(emu_factory: Any) -> None:
    env = {"SPARKSIM_EMU_FAULT": "slow-load,tool-args-strings"}
    emu = emu_factory(
        [
            "--served-model-name",
            "qwen",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "qwen3_coder",
        ],
        env,
    )
    took = float(re.search(r"Loading weights took ([\d.]+) seconds", emu.text()).group(1))  # type: ignore[union-attr]
    assert took >= 4 * 18 * 0.0005 * 10 * 0.9  # 4 shards x 18 s x time scale x 10
    msg = emu.chat(TOOL_ASK).json()["choices"][0]["message"]
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"])["days"] == "2"


def test_crawl_load_is_ten_times_slow_load(emu_factory: Any) -> None:
    env = {"SPARKSIM_EMU_FAULT": "crawl-load", "SPARKSIM_EMU_SHARDS": "1"}
    emu = emu_factory(["--served-model-name", "qwen"], env, wait=False)
    line = emu.lines[emu.wait_for(r"Loading weights took [\d.]+ seconds", 30)]
    took = float(re.search(r"Loading weights took ([\d.]+) seconds", line).group(1))  # type: ignore[union-attr]
    assert took >= 18 * 0.0005 * 100 * 0.9  # 1 shard x 18 s x time scale x 100


def test_unknown_fault_is_rejected(emu_factory: Any) -> None:
    emu = emu_factory(["--served-model-name", "qwen"], {"SPARKSIM_EMU_FAULT": "nope"}, wait=False)
    assert emu.wait_exit(10) == 2
    assert "unknown fault(s) nope" in emu.text()


def test_ttft_grows_with_batch(faulty: Any) -> None:
    """Alone a request is as fast as without the fault; three at once, the last admitted
    waits 1 s more for each other running request (the goodput fault's load-only TTFT)."""
    from concurrent.futures import ThreadPoolExecutor

    emu = faulty("ttft-grows-with-batch", decode_tok_s=400)
    body = {**SAY, **NO_THINK, "max_tokens": 4, "ignore_eos": True}

    def timed(_: int) -> float:
        t = time.monotonic()
        assert emu.chat(body).status == 200
        return time.monotonic() - t

    assert timed(0) < 0.9  # alone: no other request running
    with ThreadPoolExecutor(3) as pool:
        took = sorted(pool.map(timed, range(3)))
    assert took[-1] >= 2 * 0.95  # admitted third: 2 others running
