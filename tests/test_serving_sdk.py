"""The openai SDK client (serving/client/sdk.py) against a loopback server that sends recorded
and broken answers, and the structured-output check (serving/validate/structured.py) on turns:
what the SDK parses, what it cannot (the field named, the bytes quoted), the settings it
honours; JSON that validates, a format ignored, a schema broken, reasoning left in content.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving import ServingError, assemble
from pytest_spark.serving.client.evidence import Exchange
from pytest_spark.serving.client.sdk import SdkClient, SdkTurn, StreamHelper
from pytest_spark.serving.client.turn import Turn, from_response
from pytest_spark.serving.validate.sdkchecks import check_stream_helper, compare_sdk
from pytest_spark.serving.validate.structured import check_structured, request_for
from pytest_spark.serving.validate.tools import ToolRequest, check_tool_calls

MESSAGE = {
    "role": "assistant",
    "content": None,
    "refusal": None,
    "annotations": None,
    "audio": None,
    "function_call": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
        }
    ],
    "reasoning": "The user wants Paris.",
}


def completion(message: dict[str, Any], finish: str = "tool_calls") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "qwen",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    data = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return "data: " + json.dumps(data, separators=(",", ":")) + "\n\n"


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning": "The user wants Paris."}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": '},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris", "days": 2}'}}]}),
    chunk({}, "tool_calls"),
    "data: [DONE]\n\n",
]


class Server:
    """One loopback HTTP server: answers every POST with ``reply`` (status, content type,
    body or SSE events) and remembers the requests' headers."""

    def __init__(self) -> None:
        self.reply: tuple[int, str, list[str]] = (200, "application/json", ["{}"])
        self.requests: list[dict[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                owner.requests.append({k.lower(): v for k, v in self.headers.items()})
                status, ctype, parts = owner.reply
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("connection", "close")
                self.end_headers()
                for part in parts:
                    self.wfile.write(part.encode())
                    self.wfile.flush()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture
def sdk(server: Server) -> Iterator[SdkClient]:
    client = SdkClient(ApiEndpoint(server.url, "qwen", "secret-key"), timeout=5)
    yield client
    client.close()


BODY = {"model": "qwen", "messages": [{"role": "user", "content": "weather?"}], "seed": 1}
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
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def raw_turn(streamed: bool) -> Turn:
    ex = Exchange("POST", "u")
    if not streamed:
        return from_response(completion(MESSAGE), ex)
    chunks = [json.loads(e[6:]) for e in STREAM if not e.startswith("data: [DONE]")]
    return assemble(chunks, ex)


def test_plain_answer_typed_by_the_sdk(server: Server, sdk: SdkClient) -> None:
    server.reply = (200, "application/json", [json.dumps(completion(MESSAGE))])
    turn = sdk.turn({**BODY, "chat_template_kwargs": {"enable_thinking": True}}, False)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        ("get_weather", '{"city": "Paris", "days": 2}')
    ]
    assert turn.reasoning == "The user wants Paris." and turn.reasoning_fields == ("reasoning",)
    assert turn.finish_reason == "tool_calls"
    # the suite's key, as a bearer token; no retry hides a failure
    assert server.requests[-1]["authorization"] == "Bearer secret-key"
    assert compare_sdk(raw_turn(False), turn, "x", what="calls").ok
    assert compare_sdk(raw_turn(False), turn, "x", what="reasoning").ok


def test_streamed_deltas_assemble_to_the_raw_call(server: Server, sdk: SdkClient) -> None:
    server.reply = (200, "text/event-stream", STREAM)
    turn = sdk.turn(BODY, True)
    assert turn.tool_calls[0].arguments == '{"city": "Paris", "days": 2}'
    assert turn.tool_calls[0].fragments == 2 and turn.reasoning_fields == ("reasoning",)
    assert compare_sdk(raw_turn(True), turn, "x", what="calls").ok


def test_the_sdks_stream_helper_types_and_finishes_the_call(server: Server, sdk: SdkClient) -> None:
    server.reply = (200, "text/event-stream", STREAM)
    turn = sdk.turn({**BODY, "tools": [WEATHER]}, True)
    assert isinstance(turn, SdkTurn) and turn.helper is not None
    (call,) = turn.helper.calls
    assert (call.type, call.name, call.done) == ("function", "get_weather", True)
    assert call.arguments == '{"city": "Paris", "days": 2}' and call.header_chunk == 3
    finding = check_stream_helper(turn, "x")
    assert finding.ok, finding.message


# vLLM #16340: the named tool_choice stream's first tool-call delta without "type"
NO_TYPE = [
    STREAM[0],
    chunk(
        {
            "tool_calls": [
                {
                    "id": "chatcmpl-tool-1",
                    "index": 0,
                    "function": {"name": "get_weather", "arguments": '{"city": '},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris", "days": 2}'}}]}),
    chunk({}, "stop"),
    "data: [DONE]\n\n",
]


def test_a_header_delta_without_type_is_the_sdk_checks_alone(
    server: Server, sdk: SdkClient
) -> None:
    """Within OpenAI's chunk schema (type optional), so the raw check passes it; the SDK's
    stream helper leaves the call untyped and never reports it done: that check fails,
    naming the field and quoting the delta as the SDK read it."""
    server.reply = (200, "text/event-stream", NO_TYPE)
    named = ToolRequest((WEATHER,), "named", ("get_weather",), streamed=True)
    body = {**BODY, "tools": [WEATHER], "tool_choice": NAMED}
    turn = sdk.turn(body, True)
    assert check_tool_calls(turn, named).ok  # the SDK's typed deltas assemble to the call
    chunks = [json.loads(e[6:]) for e in NO_TYPE if not e.startswith("data: [DONE]")]
    raw = assemble(chunks, Exchange("POST", "u"))
    assert check_tool_calls(raw, named).ok, check_tool_calls(raw, named).message
    assert compare_sdk(raw, turn, "x", what="calls").ok
    assert isinstance(turn, SdkTurn) and turn.helper is not None
    (call,) = turn.helper.calls
    assert (call.type, call.done) == (None, False)
    finding = check_stream_helper(turn, "named", server="qwen at u")
    assert not finding.ok
    message = finding.message
    assert message.startswith("qwen at u: named: through the openai SDK's stream helper")
    assert "tool call 0 (get_weather): its first delta (chunk 2) has no field " in message
    assert "choices.0.delta.tool_calls.0.type" in message
    quoted = message.split("choices.0.delta.tool_calls.0.type: ", 1)[1].split("; so ")[0]
    assert quoted.startswith("""'{"index":0,"id":"chatcmpl-tool-1","function":""")
    assert '"name":"get_weather"' in quoted and '"type"' not in quoted, quoted
    assert "type=None" in message and "no tool_calls.function.arguments.done event" in message
    assert "vllm-project/vllm#16340" in message
    assert finding.evidence["request"] and finding.evidence["stream"]


def test_a_call_without_type_still_fails_the_raw_check_when_not_streamed() -> None:
    """Non-streaming, OpenAI's schema requires type: that stays the raw check's failure."""
    message = {**MESSAGE, "tool_calls": [{**MESSAGE["tool_calls"][0], "type": None}]}
    turn = from_response(completion(message, "stop"), Exchange("POST", "u"))
    named = ToolRequest((WEATHER,), "named", ("get_weather",))
    finding = check_tool_calls(turn, named)
    assert not finding.ok and "type is None, expected 'function'" in finding.message


def test_the_stream_helpers_own_failure_is_reported() -> None:
    turn = SdkTurn(**vars(raw_turn(True)))
    turn.helper = StreamHelper(error="IndexError: list index out of range")
    finding = check_stream_helper(turn, "x")
    assert not finding.ok and "raised IndexError: list index out of range" in finding.message


def test_a_field_the_sdk_cannot_type_is_named_and_quoted(server: Server, sdk: SdkClient) -> None:
    bad = {
        **MESSAGE,
        "tool_calls": [
            {**MESSAGE["tool_calls"][0], "function": {"name": "f", "arguments": {"city": "Paris"}}}
        ],
    }
    server.reply = (200, "application/json", [json.dumps(completion(bad))])
    with pytest.raises(ServingError) as err:
        sdk.turn(BODY, False)
    assert err.value.kind == "sdk-parse"
    assert "choices.0.message.tool_calls" in err.value.message, err.value.message
    assert "function.arguments" in err.value.message
    assert '"arguments": {"city": "Paris"}' in err.value.message, err.value.message
    assert len(server.requests) >= 1


def test_a_body_that_is_not_json_quotes_it(server: Server, sdk: SdkClient) -> None:
    server.reply = (200, "application/json", ['{"id": "chatcmpl-1", "choices": [tru'])
    with pytest.raises(ServingError) as err:
        sdk.turn(BODY, False)
    assert err.value.kind == "not-json" and "[tru" in err.value.message, err.value.message


def test_a_stream_line_that_is_not_json_quotes_it(server: Server, sdk: SdkClient) -> None:
    server.reply = (200, "text/event-stream", [*STREAM[:2], "data: {not json}\n\n", *STREAM[2:]])
    with pytest.raises(ServingError) as err:
        sdk.turn(BODY, True)
    assert err.value.kind == "malformed-sse" and "{not json}" in err.value.message


def test_a_stream_cut_short_is_truncated(server: Server, sdk: SdkClient) -> None:
    server.reply = (200, "text/event-stream", STREAM[:3])
    with pytest.raises(ServingError) as err:
        sdk.turn(BODY, True)
    assert err.value.kind == "truncated" and "without a finish_reason" in err.value.message


def test_http_errors_are_not_retried(server: Server, sdk: SdkClient) -> None:
    before = len(server.requests)
    server.reply = (500, "application/json", ['{"error": {"message": "boom", "code": 500}}'])
    with pytest.raises(ServingError) as err:
        sdk.turn(BODY, False)
    assert err.value.kind == "http-5xx" and "boom" in err.value.message
    assert len(server.requests) == before + 1


# --- the structured-output check ----------------------------------------------------------


def turn_with(content: str | None, finish: str = "stop", reasoning: str | None = None) -> Turn:
    message = {"role": "assistant", "content": content, "reasoning": reasoning}
    return from_response(completion(message, finish), Exchange("POST", "u"))


def test_valid_json_schema_answer_passes() -> None:
    req = request_for("json_schema", False)
    good = turn_with('{"city": "Paris", "days": 3, "unit": "celsius"}', reasoning="think")
    assert check_structured(good, req).ok


def test_ignored_format_fails_quoting_the_text() -> None:
    finding = check_structured(
        turn_with("The forecast is sunny."), request_for("json_object", True)
    )
    assert not finding.ok
    assert "ignored response_format" in finding.message
    assert "The forecast is sunny." in finding.message


def test_schema_break_names_the_path() -> None:
    bad = turn_with('{"city": "Paris", "days": "3", "unit": "kelvin"}')
    finding = check_structured(bad, request_for("json_schema", False))
    assert not finding.ok
    assert "$.days: '3' is not of type 'integer'" in finding.message, finding.message
    assert "$.unit: 'kelvin' is not one of" in finding.message


def test_json_object_must_be_an_object() -> None:
    finding = check_structured(turn_with("[1, 2]"), request_for("json_object", False))
    assert not finding.ok and "not an object" in finding.message


def test_cut_json_says_max_tokens() -> None:
    finding = check_structured(
        turn_with('{"city": "Pa', "length"), request_for("json_object", False)
    )
    assert not finding.ok and "structured_output.max_tokens" in finding.message


def test_reasoning_left_in_content_is_named_as_such() -> None:
    leaked = turn_with('Okay, Paris.</think>\n\n{"city": "Paris", "days": 3, "unit": "celsius"}')
    finding = check_structured(leaked, request_for("json_schema", False))
    assert not finding.ok
    assert "reasoning was not separated" in finding.message
    assert "ignored" not in finding.message


# --- recorded real vLLM 0.32 answers (tests/emulator/transcripts): the SDK types them ------

TRANSCRIPTS = Path(__file__).resolve().parent / "emulator" / "transcripts"
RECORDED = sorted(
    p
    for d in TRANSCRIPTS.iterdir()
    if d.is_dir()
    for p in d.iterdir()
    if p.name.startswith(("chat", "tools_"))
)


def recorded(path: Path) -> tuple[dict[str, Any], str, str]:
    """(request body, content type, response body) of one transcript."""
    head, _, rest = path.read_text().partition("\n--- HTTP ")
    request = json.loads(head.partition("\n")[2])
    header_block, _, body = rest.partition("\n")[2].partition("\n\n")
    headers = dict(h.split(": ", 1) for h in header_block.splitlines() if ": " in h)
    return request, headers.get("content-type", "application/json"), body


@pytest.mark.parametrize("path", RECORDED, ids=[f"{p.parent.name}/{p.stem}" for p in RECORDED])
def test_recorded_vllm_answers_parse_strictly(server: Server, sdk: SdkClient, path: Path) -> None:
    """Strict validation accepts what real vLLM sends (the SDK check must not fail a
    healthy server), and the SDK's turn is the raw client's."""
    request, ctype, body = recorded(path)
    streamed = bool(request.get("stream"))
    server.reply = (200, ctype, [body])
    turn = sdk.turn(request, streamed)
    ex = Exchange("POST", "u")
    if streamed:
        events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
        raw = assemble([json.loads(e) for e in events if e != "[DONE]"], ex)
    else:
        raw = from_response(json.loads(body), ex)
    assert (turn.content, turn.finish_reason) == (raw.content, raw.finish_reason)
    assert compare_sdk(raw, turn, path.stem, what="calls").ok
    if streamed:  # the SDK's stream helper types and finishes real vLLM's calls
        assert isinstance(turn, SdkTurn)
        finding = check_stream_helper(turn, path.stem)
        assert finding.ok, finding.message
        assert len(turn.helper.calls if turn.helper else ()) == len(raw.tool_calls)
