"""The emulator against recorded vLLM 0.32.0 transcripts: same status, header names in the
same order, same JSON key sets/order and value types, same SSE framing."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from conftest import Emu, load_transcript

QWEN = "vllm-0.32.0-cpu-qwen2.5-0.5b"
SMOL = "vllm-0.32.0-cpu"


def shape(value: Any) -> Any:
    """Keys (in order) and value types; lists reduced to their first element's shape."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def replay(emu: Emu, name: str) -> tuple[dict[str, Any], Any]:
    t = load_transcript(name)
    resp = emu.request(t["method"], t["path"], t["request"])
    return t, resp


@pytest.mark.parametrize("name", ["health.txt", "ping.txt", "version.txt"])
def test_simple_endpoints_match_byte_for_byte(plain: Emu, name: str) -> None:
    t, resp = replay(plain, f"{QWEN}/{name}")
    assert resp.status == t["status"]
    assert resp.header_names() == [k for k, _ in t["headers"]]
    assert resp.body.decode() == t["body"].rstrip("\n")


@pytest.mark.parametrize(
    "name",
    [
        "chat.txt",
        "chat_truncated.txt",
        "models.txt",
        "tokenize.txt",
        "tools_required.txt",
        "tools_named.txt",
    ],
)
def test_json_shapes_match(plain: Emu, name: str) -> None:
    t, resp = replay(plain, f"{QWEN}/{name}")
    want = json.loads(t["body"])
    got = resp.json()
    assert resp.status == t["status"]
    assert resp.header_names() == [k for k, _ in t["headers"]]
    assert shape(got) == shape(want)
    if "choices" in want:
        assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
        assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", got["id"])
        assert (
            got["usage"]["total_tokens"]
            == got["usage"]["prompt_tokens"] + got["usage"]["completion_tokens"]
        )
        calls = want["choices"][0]["message"].get("tool_calls")
        if calls:
            # The healthy recording: integer typed, json.dumps spacing, content "".
            got_calls = got["choices"][0]["message"]["tool_calls"]
            assert got_calls[0]["function"] == calls[0]["function"]
            assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", got_calls[0]["id"])
            assert got["choices"][0]["message"]["content"] == ""


def test_truncated_text_matches_recording(plain: Emu) -> None:
    _, resp = replay(plain, f"{QWEN}/chat_truncated.txt")
    assert resp.json()["choices"][0]["message"]["content"] == "Once upon a time,"
    assert resp.json()["usage"]["completion_tokens"] == 5


def test_tokenize_counts_like_recording(plain: Emu) -> None:
    t, resp = replay(plain, f"{QWEN}/tokenize.txt")
    assert resp.json()["count"] == json.loads(t["body"])["count"] == 2


@pytest.mark.parametrize(
    "name", ["error_bad_request.txt", "error_model_not_found.txt", "error_too_long.txt"]
)
def test_error_bodies_match_exactly(plain: Emu, name: str) -> None:
    t, resp = replay(plain, f"{QWEN}/{name}")
    assert resp.status == t["status"]
    assert resp.header_names() == [k for k, _ in t["headers"]]
    assert resp.json() == json.loads(t["body"])


def sse_events(body: str) -> list[str]:
    return [b[len("data: ") :] for b in body.split("\n\n") if b.strip()]


def test_stream_with_usage_matches_recording(plain: Emu) -> None:
    t, resp = replay(plain, f"{QWEN}/chat_stream_usage.txt")
    want = sse_events(t["body"])
    got = resp.events()
    assert resp.header_names() == [k for k, _ in t["headers"]]
    assert dict(resp.headers)["content-type"] == "text/event-stream; charset=utf-8"
    assert got[-1] == want[-1] == "[DONE]"
    assert len(got) == len(want)
    for g, w in zip(got[:-1], want[:-1], strict=True):
        assert shape(json.loads(g)) == shape(json.loads(w))
    # Same text, token by token, as the recorded model produced.
    texts = [json.loads(e)["choices"][0]["delta"].get("content") for e in got[1:-2]]
    assert texts == [json.loads(e)["choices"][0]["delta"].get("content") for e in want[1:-2]]
    usage = json.loads(got[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8


def test_required_tool_stream_matches_recording(plain: Emu) -> None:
    t, resp = replay(plain, f"{QWEN}/tools_required_stream.txt")
    want = sse_events(t["body"])
    got = resp.events()
    assert got[-1] == "[DONE]"
    assert [shape(json.loads(e)) for e in got[:-1]] == [shape(json.loads(e)) for e in want[:-1]]
    frags = [json.loads(e)["choices"][0]["delta"]["tool_calls"][0]["function"] for e in got[1:-2]]
    want_frags = [
        json.loads(e)["choices"][0]["delta"]["tool_calls"][0]["function"] for e in want[1:-2]
    ]
    assert frags == want_frags  # name first, then '{"', 'city', '":', ' "', 'Paris', ...


def test_plain_chat_shape_matches_other_recording(plain: Emu) -> None:
    """The second recording (smollm2) has the same envelope."""
    t = load_transcript(f"{SMOL}/chat.txt")
    resp = plain.chat({**t["request"], "model": "qwen"})
    assert shape(resp.json()) == shape(json.loads(t["body"]))


def metric_families(text: str) -> set[tuple[str, str]]:
    return {tuple(line.split()[2:4]) for line in text.splitlines() if line.startswith("# TYPE ")}  # type: ignore[misc]


def label_names(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.match(r"([^{ ]+)(?:\{(.*)\})? ", line)
        assert m, line
        names = set(re.findall(r'(\w+)="', m.group(2) or ""))
        out.setdefault(m.group(1), set()).update(names)
    return out


def test_metrics_families_labels_and_content_type(plain: Emu) -> None:
    replay(plain, f"{QWEN}/tokenize.txt")
    replay(plain, f"{QWEN}/models.txt")
    t = load_transcript(f"{QWEN}/metrics_after.txt")
    resp = plain.request("GET", "/metrics")
    assert resp.status == 200
    assert dict(resp.headers)["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    assert resp.header_names() == [k for k, _ in t["headers"]]
    got, want = resp.body.decode(), t["body"]
    assert metric_families(got) == metric_families(want)
    want_labels = label_names(want)
    got_labels = label_names(got)
    for name, labels in want_labels.items():
        if name.startswith("vllm:"):
            assert got_labels.get(name) == labels, name
    # Counter values are floats in Go format, labels sorted.
    assert re.search(
        r'^vllm:prompt_tokens_total\{engine="0",model_name="qwen"\} \d+\.\d+$', got, re.M
    )
