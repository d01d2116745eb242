"""Endpoints beyond the recorded transcripts: auth, request ids, completions, metrics
that move with traffic, tokenize/detokenize, unknown routes, access log."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from conftest import Emu

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def keyed() -> Iterator[Emu]:
    """--api-key, no tool flags, request-id headers on; plus an unknown vLLM flag."""
    args = [
        "--served-model-name",
        "qwen",
        "--max-model-len",
        "2048",
        "--api-key",
        KEY,
        "--enable-request-id-headers",
        "--swap-space-gb",
        "4",
    ]
    emu = Emu(args)
    try:
        yield emu.ready()
    finally:
        emu.stop()


def auth(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/v1/completions"])
def test_v1_needs_the_key(keyed: Emu, path: str) -> None:
    method = "GET" if path == "/v1/models" else "POST"
    for headers in ({}, auth("wrong"), {"authorization": KEY}):
        resp = keyed.request(method, path, {} if method == "POST" else None, headers)
        assert resp.status == 401
        assert resp.body == b'{"error":"Unauthorized"}'
        assert "vary" not in resp.header_names()  # the auth middleware sits outside CORS


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/metrics"])
def test_open_paths_stay_open_with_a_key(keyed: Emu, path: str) -> None:
    assert keyed.request("GET", path).status == 200


def test_tokenize_is_outside_v1_so_open(keyed: Emu) -> None:
    resp = keyed.request("POST", "/tokenize", {"prompt": "Hello world"})
    assert resp.status == 200 and resp.json()["count"] == 2


def test_key_accepted_and_request_id_echoed(keyed: Emu) -> None:
    assert keyed.request("GET", "/v1/models", headers=auth()).status == 200
    resp = keyed.chat(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        {**auth(), "x-request-id": "abc123"},
    )
    assert resp.status == 200
    assert resp.json()["id"] == "chatcmpl-abc123"
    assert dict(resp.headers)["x-request-id"] == "abc123"


def test_api_key_from_environment(emu_factory: object) -> None:
    emu = emu_factory(["--served-model-name", "qwen"], {"VLLM_API_KEY": "envkey"})  # type: ignore[operator]
    assert emu.request("GET", "/v1/models").status == 401
    assert emu.request("GET", "/v1/models", headers=auth("envkey")).status == 200


def test_auto_tool_choice_without_server_flags_is_400(keyed: Emu) -> None:
    body = {
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
    }
    resp = keyed.chat(body, auth())
    assert resp.status == 400
    assert resp.json() == {
        "error": {
            "message": '"auto" tool choice requires --enable-auto-tool-choice and '
            "--tool-call-parser to be set",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
    # "required" goes through guided decoding and needs no server flag.
    resp = keyed.chat({**body, "tool_choice": "required"}, auth())
    assert resp.status == 200 and resp.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_unknown_flag_is_logged_not_fatal(keyed: Emu) -> None:
    line = keyed.lines[keyed.wait_for("ignoring vLLM argument")]
    assert "--swap-space-gb 4" in line
    args_line = keyed.lines[keyed.wait_for(r"non-default args: ")]
    assert "'api_key': '**REDACTED**'" in args_line and KEY not in args_line


def test_unknown_route_and_wrong_method(qwen: Emu) -> None:
    resp = qwen.request("GET", "/nope")
    assert resp.status == 404 and resp.json() == {"detail": "Not Found"}
    resp = qwen.request("GET", "/v1/chat/completions")
    assert resp.status == 405 and resp.json() == {"detail": "Method Not Allowed"}


def test_request_id_header_sets_completion_id(qwen: Emu) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    resp = qwen.chat(body, {"x-request-id": "my-req-1"})
    assert resp.json()["id"] == "chatcmpl-my-req-1"
    assert "x-request-id" not in resp.header_names()  # only with --enable-request-id-headers
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", qwen.chat(body).json()["id"])


def test_models_created_is_request_time(qwen: Emu) -> None:
    before = int(time.time())
    data = qwen.request("GET", "/v1/models").json()["data"][0]
    assert before <= data["created"] <= int(time.time()) + 1
    assert data["root"] == qwen.model and data["max_model_len"] == 4096
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", data["permission"][0]["id"])


def test_max_completion_tokens_ignore_eos_and_stop(qwen: Emu) -> None:
    base = {
        "messages": [{"role": "user", "content": "Say hello."}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    r = qwen.chat({**base, "max_completion_tokens": 3}).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"
    r = qwen.chat({**base, "max_tokens": 50, "ignore_eos": True}).json()
    assert r["usage"]["completion_tokens"] == 50 and r["choices"][0]["finish_reason"] == "length"
    r = qwen.chat({**base, "max_tokens": 50}).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == "Hello! How can I assist you today?"
    assert r["usage"]["completion_tokens"] == 10  # 9 tokens + EOS, as the recording counts
    r = qwen.chat({**base, "max_tokens": 50, "stop": [" How"]}).json()
    assert r["choices"][0]["message"]["content"] == "Hello!"
    assert r["choices"][0]["stop_reason"] == " How"


def test_completions_plain_and_stream(qwen: Emu) -> None:
    r = qwen.request(
        "POST", "/v1/completions", {"model": "qwen", "prompt": "Hello", "max_tokens": 5}
    )
    body = r.json()
    assert r.status == 200 and body["object"] == "text_completion"
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", body["id"])
    assert (
        body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"
    )
    assert isinstance(body["choices"][0]["text"], str) and body["choices"][0]["text"]
    r = qwen.request(
        "POST",
        "/v1/completions",
        {
            "prompt": "Hello",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = r.events()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    assert streamed and body["choices"][0]["text"].startswith(streamed)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_tokenize_messages_and_detokenize(qwen: Emu) -> None:
    r = qwen.request(
        "POST", "/tokenize", {"prompt": "Hello world", "return_token_strs": True}
    ).json()
    assert r["token_strs"] == ["Hello", " world"] and r["max_model_len"] == 4096
    back = qwen.request("POST", "/detokenize", {"tokens": r["tokens"]}).json()
    assert back == {"prompt": "Hello world"}
    msgs = {"messages": [{"role": "user", "content": "Say hello."}]}
    chat = qwen.chat({**msgs, "max_tokens": 1}).json()
    assert qwen.request("POST", "/tokenize", msgs).json()["count"] == chat["usage"]["prompt_tokens"]


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_metrics_move_with_traffic(emu_factory: object) -> None:
    emu = emu_factory(["--served-model-name", "m1"], {"SPARKSIM_EMU_STATS_INTERVAL_S": "0.3"})  # type: ignore[operator]
    before = emu.request("GET", "/metrics").body.decode()
    lbl = '{engine="0",model_name="m1"}'
    assert metric(before, f"vllm:generation_tokens_total{lbl}") == 0.0
    r = emu.chat(
        {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}
    ).json()
    emu.chat(
        {
            "model": "m1",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": True,
        }
    )
    after = emu.request("GET", "/metrics").body.decode()
    assert metric(after, f"vllm:generation_tokens_total{lbl}") == 10.0
    assert metric(after, f"vllm:prompt_tokens_total{lbl}") == 2 * r["usage"]["prompt_tokens"]
    reason = '{engine="0",finished_reason="length",model_name="m1"}'
    assert metric(after, f"vllm:request_success_total{reason}") == 2.0
    assert metric(after, f"vllm:time_to_first_token_seconds_count{lbl}") == 2.0
    assert metric(after, f"vllm:inter_token_latency_seconds_count{lbl}") == 8.0
    assert metric(after, f"vllm:num_requests_running{lbl}") == 0.0
    # The HTTP counters come from a middleware that counts a request once its handler has
    # returned, after the last chunk went out (prometheus-fastapi-instrumentator in vLLM):
    # a reader of [DONE] may ask /metrics first, in vLLM as here, so it is read until it moves.
    http = 'http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"}'
    deadline = time.monotonic() + 5
    while metric(after, http) < 2.0 and time.monotonic() < deadline:
        time.sleep(0.02)
        after = emu.request("GET", "/metrics").body.decode()
    assert metric(after, http) == 2.0
    assert 'handler="/metrics"' not in after  # excluded, as in vLLM
    emu.wait_for(
        r"^\(APIServer pid=\d+\) INFO .* \[loggers\.py:335\] Engine 000: Avg prompt throughput: "
        r"[\d.]+ tokens/s, Avg generation throughput: [\d.]+ tokens/s, Running: 0 reqs, "
        r"Waiting: 0 reqs, GPU KV cache usage: [\d.]+%, Prefix cache hit rate: 0\.0%$",
        3,
    )
    assert re.search(
        r'^INFO:     127\.0\.0\.1:\d+ - "POST /v1/chat/completions HTTP/1\.1" 200 OK$',
        emu.text(),
        re.M,
    )
