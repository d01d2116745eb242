"""Tool calls: auto (qwen3_coder and hermes parsers), required, named; streaming deltas;
argument typing from the schema; parallel calls; reasoning then a call in one turn."""

from __future__ import annotations

import json
import re
from typing import Any

from conftest import Emu

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
ASK = "What is the weather in Paris for 2 days?"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def ask(text: str = ASK, tools: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": text}],
        "tools": tools or [WEATHER],
        "max_tokens": 400,
        **kw,
    }


def collect(
    emu: Emu, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """Stream a request; return chunks and the tool calls rebuilt from the deltas."""
    events = emu.chat({**body, "stream": True}).events()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    calls: dict[int, dict[str, Any]] = {}
    for c in chunks:
        for tc in c["choices"][0]["delta"].get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in tc:
                assert call["id"] is None, "id sent twice"
                call["id"] = tc["id"]
                assert tc["type"] == "function"
            fn = tc.get("function", {})
            if "name" in fn:
                call["name"] = fn["name"]
            call["arguments"] += fn.get("arguments", "")
    return chunks, calls


def test_auto_non_streaming(qwen: Emu) -> None:
    r = qwen.chat(ask(**NO_THINK)).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] is None
    (call,) = msg["tool_calls"]
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert call["function"]["arguments"] == '{"city": "Paris", "days": 2}'  # json.dumps spacing


def test_auto_streaming_qwen3_coder(qwen: Emu) -> None:
    chunks, calls = collect(qwen, ask(**NO_THINK))
    first_tool = next(c for c in chunks if c["choices"][0]["delta"].get("tool_calls"))
    header = first_tool["choices"][0]["delta"]["tool_calls"][0]
    assert list(header) == ["id", "type", "index", "function"]
    assert header["function"]["name"] == "get_weather"
    fragments = [
        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
        for c in chunks
        if c["choices"][0]["delta"].get("tool_calls")
    ]
    assert len(fragments) >= 3  # header "{", one per parameter, "}"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_required_and_named(qwen: Emu) -> None:
    r = qwen.chat(ask(tool_choice="required", **NO_THINK)).json()["choices"][0]
    assert r["finish_reason"] == "tool_calls" and r["message"]["content"] == ""
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", r["message"]["tool_calls"][0]["id"])
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = qwen.chat(ask(tool_choice=named, **NO_THINK)).json()["choices"][0]
    assert (
        r["finish_reason"] == "stop"
        and r["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    chunks, calls = collect(qwen, ask(tool_choice=named, **NO_THINK))
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # A named tool that is not in `tools` is a validation error.
    bad = qwen.chat(ask(tool_choice={"type": "function", "function": {"name": "nope"}}))
    assert bad.status == 400 and "has not been passed in `tools`" in bad.json()["error"]["message"]


def test_required_picks_a_tool_even_when_none_matches(qwen: Emu) -> None:
    r = qwen.chat(ask("Tell me a joke.", tool_choice="required", **NO_THINK)).json()["choices"][0]
    assert r["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_auto_without_a_matching_tool_answers_in_text(qwen: Emu) -> None:
    r = qwen.chat(ask("Say hello.", **NO_THINK)).json()["choices"][0]
    assert r["finish_reason"] == "stop" and "tool_calls" not in r["message"]
    assert r["message"]["content"] == "Hello! How can I assist you today?"


def test_after_a_tool_result_auto_answers_in_text(qwen: Emu) -> None:
    body = ask(**NO_THINK)
    body["messages"] += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]
    r = qwen.chat(body).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["message"]["content"]


def test_parallel_calls(qwen: Emu) -> None:
    two_tools = ask("What is the weather and the time in Tokyo?", [WEATHER, TIME], **NO_THINK)
    calls = qwen.chat(two_tools).json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    two_cities = ask("Compare the weather in Paris and London.", **NO_THINK)
    calls = qwen.chat(two_cities).json()["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris", "London"]
    _, streamed = collect(qwen, two_cities)
    assert sorted(streamed) == [0, 1]
    assert streamed[0]["id"] != streamed[1]["id"]
    assert [json.loads(c["arguments"])["city"] for c in streamed.values()] == ["Paris", "London"]


def test_arguments_typed_by_schema(qwen: Emu) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "book_flight",
            "parameters": {
                "type": "object",
                "properties": {
                    "destination": {"type": "string"},
                    "passengers": {"type": "integer"},
                    "budget": {"type": "number"},
                    "cabin": {"type": "string", "enum": ["economy", "business"]},
                    "refundable": {"type": "boolean"},
                    "notes": {"type": "string"},
                },
                "required": ["destination", "passengers", "budget", "cabin", "refundable"],
            },
        },
    }
    body = ask(
        "Book a flight to Rome for 3 people, budget 1250.5, business class.", [tool], **NO_THINK
    )
    args = json.loads(
        qwen.chat(body).json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    )
    assert args == {
        "destination": "Rome",
        "passengers": 3,
        "budget": 1250.5,
        "cabin": "business",
        "refundable": True,
    }


def test_reasoning_then_tool_call_in_one_turn(qwen: Emu) -> None:
    r = qwen.chat(ask()).json()["choices"][0]
    msg = r["message"]
    assert msg["reasoning"] and "get_weather" in msg["reasoning"]
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
    assert r["finish_reason"] == "tool_calls"
    assert (msg["content"] or "").strip() == ""  # only the "\n\n" that followed </think>
    chunks, calls = collect(qwen, ask())
    kinds = [
        k for c in chunks for k in c["choices"][0]["delta"] if k in ("reasoning", "tool_calls")
    ]
    assert kinds.index("tool_calls") > max(i for i, k in enumerate(kinds) if k == "reasoning")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2}


def test_hermes_parser_streams_argument_tokens(plain: Emu) -> None:
    r = plain.chat(ask()).json()["choices"][0]
    assert r["finish_reason"] == "tool_calls"
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", r["message"]["tool_calls"][0]["id"])
    chunks, calls = collect(plain, ask())
    fragments = [
        c["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments")
        for c in chunks
        if c["choices"][0]["delta"].get("tool_calls")
    ]
    assert fragments[0] is None and len(fragments) > 5  # name first, then token fragments
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2}
