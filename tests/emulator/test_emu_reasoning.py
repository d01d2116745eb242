"""qwen3 reasoning parser: reasoning then answer, thinking switch, truncation inside the
thinking block, streaming order, field names by emulated version."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Emu

ASK = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 200}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def stream(emu: Emu, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    resp = emu.chat({**body, "stream": True, "stream_options": {"include_usage": True}})
    events = resp.events()
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]], resp.body.decode()


def test_reasoning_then_answer(qwen: Emu) -> None:
    r = qwen.chat(ASK).json()
    msg = r["choices"][0]["message"]
    assert isinstance(msg["reasoning"], str) and msg["reasoning"]
    assert "reasoning_content" not in msg  # 0.32 sends only "reasoning"
    # vLLM's parser keeps what follows </think>, including the leading blank line.
    assert msg["content"] == "\n\nHello! How can I assist you today?"
    assert "</think>" not in msg["content"] and "</think>" not in msg["reasoning"]
    assert r["choices"][0]["finish_reason"] == "stop"
    # reasoning tokens count as output tokens: reasoning + </think> + \n\n + answer + EOS
    assert r["usage"]["completion_tokens"] == 12 + 1 + 1 + 9 + 1


def test_thinking_disabled_gives_content_only(qwen: Emu) -> None:
    r = qwen.chat({**ASK, **NO_THINK}).json()
    msg = r["choices"][0]["message"]
    assert msg["reasoning"] is None
    assert msg["content"] == "Hello! How can I assist you today?"


def test_truncated_inside_thinking(qwen: Emu) -> None:
    r = qwen.chat({**ASK, "max_tokens": 5}).json()
    msg = r["choices"][0]["message"]
    assert r["choices"][0]["finish_reason"] == "length"
    assert msg["content"] is None and msg["reasoning"]
    assert r["usage"]["completion_tokens"] == 5


def test_stream_reasoning_first_then_content(qwen: Emu) -> None:
    chunks, raw = stream(qwen, ASK)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    kinds = []
    for c in chunks[1:-1]:
        delta = c["choices"][0]["delta"]
        kinds.append("r" if "reasoning" in delta else "c")
    assert kinds == sorted(kinds, reverse=True)  # all reasoning deltas, then all content
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning", "") for c in chunks[1:-1])
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    full = qwen.chat(ASK).json()["choices"][0]["message"]
    assert reasoning == full["reasoning"] and content == full["content"]
    assert "</think>" not in raw
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 24


def test_stream_truncated_in_thinking_has_no_content(qwen: Emu) -> None:
    chunks, _ = stream(qwen, {**ASK, "max_tokens": 4})
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert all("content" not in d for d in deltas)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_strip_newlines_knob(emu_factory: Any) -> None:
    emu = emu_factory(
        ["--served-model-name", "qwen", "--reasoning-parser", "qwen3"],
        {"SPARKSIM_EMU_THINK_NEWLINES": "strip"},
    )
    msg = emu.chat(ASK).json()["choices"][0]["message"]
    assert msg["content"] == "Hello! How can I assist you today?" and msg["reasoning"]


@pytest.mark.parametrize(
    ("version", "fields"),
    [("0.11.0", ["reasoning_content"]), ("0.13.0", ["reasoning", "reasoning_content"])],
)
def test_field_names_follow_the_version(emu_factory: Any, version: str, fields: list[str]) -> None:
    emu = emu_factory(
        ["--served-model-name", "qwen", "--reasoning-parser", "qwen3"],
        {"SPARKSIM_EMU_VERSION": version},
    )
    assert emu.request("GET", "/version").json() == {"version": version}
    msg = emu.chat(ASK).json()["choices"][0]["message"]
    assert [k for k in msg if k.startswith("reasoning")] == fields
    assert all(msg[f] for f in fields)
    chunks, _ = stream(emu, ASK)
    first_reasoning = chunks[1]["choices"][0]["delta"]
    assert sorted(first_reasoning) == sorted(fields)
