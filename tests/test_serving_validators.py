"""Tool-call and reasoning validators on real vLLM 0.32.0 transcripts (a tiny model: good
negative examples), on hand-made healthy answers, and on each known vLLM bug."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from transcript import read_turn

from pytest_spark.serving import (
    ToolRequest,
    Turn,
    assemble,
    check_auto_refused,
    check_order,
    check_reasoning,
    check_reasoning_then_tool,
    check_thinking_disabled,
    check_tool_calls,
    check_truncated,
    compare_arguments,
    compare_stream,
    from_response,
    parse_error_body,
    validate,
)
from pytest_spark.serving.client.evidence import Exchange

VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
SMOL = VLLM / "vllm-0.32.0-cpu"
QWEN = VLLM / "vllm-0.32.0-cpu-qwen2.5-0.5b"
STRICT = VLLM / "vllm-0.32.0-cpu-strict"  # SmolLM2 with --tool-strict-level parameter
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
KEY = "sk-secret-123"


def req(
    mode: str = "required", streamed: bool = False, names: tuple[str, ...] = ("get_weather",)
) -> ToolRequest:
    return ToolRequest((WEATHER,), mode, names, streamed)  # type: ignore[arg-type]


def exchange(body: Any = None, streamed: bool = False) -> Exchange:
    return Exchange(
        "POST",
        "http://127.0.0.1:8000/v1/chat/completions",
        body or {"model": "m"},
        {"Authorization": f"Bearer {KEY}"},
        200,
        "OK",
        {"content-type": "application/json"},
        "{...}",
        streamed,
    )


def message(
    content: str | None = "",
    calls: list[dict[str, Any]] | None = None,
    finish: str = "tool_calls",
    reasoning: str | None = None,
    field: str = "reasoning",
) -> Turn:
    msg: dict[str, Any] = {"role": "assistant", "content": content, field: reasoning}
    if calls is not None:
        msg["tool_calls"] = calls
    data = {"id": "chatcmpl-1", "choices": [{"index": 0, "message": msg, "finish_reason": finish}]}
    return from_response(data, exchange())


def call(
    args: Any = '{"city": "Paris", "days": 2}',
    name: str = "get_weather",
    cid: str = "chatcmpl-tool-0123456789abcdef",
) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-s", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def stream_turn(deltas: list[dict[str, Any]], finish: str = "tool_calls") -> Turn:
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk(d) for d in deltas]
    chunks.append(chunk({}, finish))
    return assemble(chunks, exchange(streamed=True))


def streamed_call(
    fragments: list[str], cid: str = "call_abc", index: int = 0
) -> list[dict[str, Any]]:
    head = {
        "tool_calls": [
            {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    return [head] + [
        {"tool_calls": [{"index": index, "function": {"arguments": f}}]} for f in fragments
    ]


# --- real transcripts --------------------------------------------------------------------


def test_real_required_call_left_in_content_is_reported() -> None:
    turn = read_turn(SMOL / "tools_required.txt")
    finding = check_tool_calls(turn, req())
    assert finding.level == "fail"
    assert "the call was left in content as raw markup (<tool_call>)" in finding.message
    assert "finish_reason 'length'" in finding.message
    assert "<tool_call>" in finding.evidence["response"]


def test_real_named_call_left_in_content_is_reported() -> None:
    finding = check_tool_calls(read_turn(SMOL / "tools_named.txt"), req("named"))
    assert finding.level == "fail" and "left in content" in finding.message


def test_real_auto_text_answer_is_a_model_failure() -> None:
    finding = check_tool_calls(read_turn(SMOL / "tools_auto.txt"), req("auto"))
    assert "the model answered in content instead of calling get_weather" in finding.message


def test_real_auto_json_in_content_is_reported() -> None:
    finding = check_tool_calls(read_turn(QWEN / "tools_auto.txt"), req("auto"))
    assert "written into content as JSON" in finding.message


def test_real_stream_with_unparseable_arguments() -> None:
    turn = read_turn(SMOL / "tools_required_stream.txt")
    assert turn.tool_calls[0].name == "get_weather" and turn.tool_calls[0].fragments > 10
    finding = check_tool_calls(turn, req(streamed=True))
    assert "streamed argument fragments do not join into valid JSON" in finding.message
    selected = finding.evidence["stream (selected chunks)"]
    assert selected.startswith("[chunk 2] data:") and '"finish_reason":"length"' in selected


@pytest.mark.parametrize("recorded", [QWEN, STRICT], ids=["qwen2.5-0.5b", "smollm2-strict"])
@pytest.mark.parametrize(
    "name,mode",
    [
        ("tools_required.txt", "required"),
        ("tools_named.txt", "named"),
        ("tools_required_stream.txt", "required"),
    ],
)
def test_real_healthy_calls_pass(recorded: Path, name: str, mode: str) -> None:
    turn = read_turn(recorded / name)
    finding = check_tool_calls(turn, req(mode, turn.streamed))
    assert finding.level == "pass", finding.message
    # streamed, vLLM passes on the model's own JSON text (SmolLM2 indents it); plain, it
    # re-serialises with json.dumps: the same value, compared parsed
    assert json.loads(finding.measured["calls"][0]["arguments"]) == {"city": "Paris", "days": 2}
    assert turn.finish_reason == ("stop" if mode == "named" else "tool_calls")


@pytest.mark.parametrize("recorded", [QWEN, STRICT], ids=["qwen2.5-0.5b", "smollm2-strict"])
def test_real_streamed_and_plain_arguments_agree(recorded: Path) -> None:
    plain = read_turn(recorded / "tools_required.txt")
    streamed = read_turn(recorded / "tools_required_stream.txt")
    assert streamed.tool_calls[0].fragments > 1, "arguments arrive in pieces"
    assert compare_arguments(plain, streamed, req(streamed=True)).level == "pass"


def test_real_transcripts_have_no_reasoning_field_value() -> None:
    turn = read_turn(SMOL / "chat.txt")
    assert turn.reasoning is None and turn.reasoning_null_fields == ("reasoning",)
    finding = check_reasoning(turn)
    assert finding.level == "fail"
    assert "started without --reasoning-parser?" in finding.message


def test_real_error_bodies_are_nested() -> None:
    for name in ("error_bad_request.txt", "error_too_long.txt", "error_model_not_found.txt"):
        body = (SMOL / name).read_text().split("\n\n", 1)[1]
        err = parse_error_body(body)
        assert err.shape == "nested" and err.message and err.code in (400, 404)


# --- hand-made healthy answers -----------------------------------------------------------


def test_healthy_call_passes_and_evidence_redacts_key() -> None:
    finding = check_tool_calls(message(calls=[call()]), req())
    assert finding.level == "pass"
    bad = check_tool_calls(message(calls=[call('{"city": 3}')]), req())
    assert KEY not in json.dumps(bad.evidence) and "<redacted>" in bad.evidence["request"]


def test_named_choice_expects_stop() -> None:
    assert check_tool_calls(message(calls=[call()], finish="stop"), req("named")).ok
    finding = check_tool_calls(message(calls=[call()]), req("named"))
    assert "finish_reason 'tool_calls', expected 'stop'" in finding.message


def test_required_wrong_finish_reason() -> None:
    finding = check_tool_calls(message(calls=[call()], finish="stop"), req())
    assert "finish_reason 'stop', expected 'tool_calls'" in finding.message


def test_healthy_stream_passes() -> None:
    turn = stream_turn(streamed_call(['{"city": ', '"Paris"', ', "days": 2', "}"]))
    assert check_tool_calls(turn, req(streamed=True)).level == "pass"


def test_parallel_calls() -> None:
    two = ("get_weather", "get_weather")
    deltas = streamed_call(['{"city": "Paris"', ', "days": 2}'], "call_a", 0) + streamed_call(
        ['{"city": "Tokyo"', ', "days": 2}'], "call_b", 1
    )
    assert check_tool_calls(stream_turn(deltas), req("auto", True, two)).level == "pass"
    one = stream_turn(streamed_call(['{"city": "Paris"', ', "days": 2}']))
    finding = check_tool_calls(one, req("auto", True, two))
    assert "parallel calls were not returned" in finding.message


# --- known bugs --------------------------------------------------------------------------


def test_bug_call_left_in_content_qwen3_coder() -> None:
    raw = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    finding = check_tool_calls(message(raw, None, "stop"), req("auto"))
    assert "left in content as raw markup" in finding.message
    assert "<function=" in finding.message and "--tool-call-parser" in finding.message


def test_bug_arguments_never_streamed() -> None:
    finding = check_tool_calls(stream_turn(streamed_call([])), req(streamed=True))
    assert "arguments never streamed" in finding.message


def test_bug_arguments_in_one_piece() -> None:
    turn = stream_turn(streamed_call(['{"city": "Paris", "days": 2}']))
    assert "arrived in one delta" in check_tool_calls(turn, req(streamed=True)).message
    relaxed = ToolRequest((WEATHER,), "required", ("get_weather",), True, False)
    assert check_tool_calls(turn, relaxed).ok


def test_bug_parameter_tag_leak() -> None:
    finding = check_tool_calls(message("\n\n</parameter>", [call()]), req())
    assert (
        "tool markup leaked into content next to the parsed call (</parameter>)" in finding.message
    )


def test_bug_string_typed_parameters() -> None:
    finding = check_tool_calls(message(calls=[call('{"city": "Paris", "days": "2"}')]), req())
    assert '$.days: "2" is a string, expected integer' in finding.message
    assert "not typed by the schema" in finding.message


def test_bug_arguments_as_object() -> None:
    finding = check_tool_calls(message(calls=[call({"city": "Paris"})]), req())
    assert "expected a JSON string" in finding.message


def test_stream_ids_and_indexes_must_be_consistent() -> None:
    deltas = streamed_call(['{"city": "Paris"}'])
    deltas.append({"tool_calls": [{"index": 0, "id": "call_other", "function": {"arguments": ""}}]})
    deltas += streamed_call(['{"city": "Tokyo"}'], "call_c", 2)
    finding = check_tool_calls(stream_turn(deltas), req(streamed=True))
    assert "changed id from 'call_abc' to 'call_other'" in finding.message
    assert "index 2 opened after 1 call(s)" in finding.message


def test_streamed_arguments_that_differ_fail() -> None:
    plain = message(calls=[call()])
    streamed = stream_turn(streamed_call(['{"city": "Paris"', ', "days": 3}']))
    assert (
        "differ from the non-streaming calls"
        in compare_arguments(plain, streamed, req(streamed=True)).message
    )


def test_auto_refused_is_a_misconfiguration() -> None:
    body = (
        '{"error":{"message":"\\"auto\\" tool choice requires --enable-auto-tool-choice '
        'and --tool-call-parser to be set","type":"BadRequestError","param":null,"code":400}}'
    )
    finding = check_auto_refused(400, parse_error_body(body), {}, server="m at u")
    assert finding is not None
    assert (
        "server started without --enable-auto-tool-choice --tool-call-parser" in finding.message
        and "not a model failure" in finding.message
    )
    flat = (
        '{"object":"error","message":"\\"auto\\" tool choice requires '
        '--enable-auto-tool-choice and --tool-call-parser to be set","type":"BadRequestError"}'
    )
    assert parse_error_body(flat).shape == "flat"
    assert check_auto_refused(400, parse_error_body(flat), {}) is not None
    assert check_auto_refused(400, parse_error_body('{"error":{"message":"other"}}'), {}) is None


# --- reasoning ---------------------------------------------------------------------------


def test_reasoning_healthy_either_field() -> None:
    for field in ("reasoning", "reasoning_content"):
        turn = message("\n\n42", None, "stop", "17 + 25 is 42.", field)
        finding = check_reasoning(turn)
        assert finding.level == "pass" and finding.measured["reasoning_field"] == field


def test_bug_think_tag_in_content() -> None:
    finding = check_reasoning(message("</think>\n\n42", None, "stop", "17 + 25 is 42."))
    assert "</think> leaked into content" in finding.message


def test_bug_reasoning_in_content() -> None:
    finding = check_reasoning(message("Okay, the user asks 17 + 25.\n\n42", None, "stop", None))
    assert "no reasoning (reasoning null)" in finding.message
    assert "thinking landed in content" in finding.message


def test_no_parser_shows_think_tag() -> None:
    finding = check_reasoning(message("Okay...</think>\n\n42", None, "stop", None))
    assert "reasoning is not separated: </think> in content" in finding.message


def test_bug_answer_in_reasoning_with_thinking_disabled() -> None:
    finding = check_thinking_disabled(message(None, None, "stop", "42"))
    assert "the answer landed in reasoning" in finding.message
    assert check_thinking_disabled(message("42", None, "stop", None)).level == "pass"


def test_truncation_inside_thinking() -> None:
    full = "Okay, the user asks for 17 + 25, which is 42."
    good = message(None, None, "length", "Okay, the user asks")
    assert check_truncated(good, 8, full_reasoning=full).level == "pass"
    leak = message("the user asks", None, "length", "Okay,")
    finding = check_truncated(leak, 8, full_reasoning=full)
    assert "reasoning leaked into content on truncation" in finding.message
    old = message("Okay, the user asks", None, "length", None)
    assert "nothing came back as reasoning" in check_truncated(old, 8).message
    done = message("42", None, "length", "short")
    assert check_truncated(done, 8, full_reasoning="short").level == "warn"


def _reasoning_stream(parts: list[tuple[str, str]]) -> Turn:
    deltas = [{"reasoning": t} if k == "r" else {"content": t} for k, t in parts]
    return stream_turn(deltas, "stop")


def test_stream_order_and_comparison() -> None:
    plain = message("\n\n42", None, "stop", "17 + 25 is 42.")
    good = _reasoning_stream([("r", "17 + 25"), ("r", " is 42."), ("c", "\n\n"), ("c", "42")])
    assert check_order(good).level == "pass"
    assert compare_stream(plain, good, deterministic=True).level == "pass"
    late = _reasoning_stream([("r", "17 + 25"), ("c", "42"), ("r", " is 42.")])
    assert "reasoning must come before content" in check_order(late).message
    moved = _reasoning_stream([("r", "17 + 25"), ("c", " is 42. 42")])
    assert "split differently" in compare_stream(plain, moved, deterministic=True).message
    other = _reasoning_stream([("r", "17 plus 25 is 42."), ("c", "42")])
    assert compare_stream(plain, other, deterministic=True).level == "warn"
    assert compare_stream(plain, other, deterministic=False).level == "pass"


def test_reasoning_then_tool_call() -> None:
    turn = message("", [call()], "tool_calls", "I should call get_weather.")
    assert check_reasoning_then_tool(turn, req("auto")).level == "pass"
    no_reasoning = copy.deepcopy(turn)
    no_reasoning.reasoning = None
    assert "no reasoning" in check_reasoning_then_tool(no_reasoning, req("auto")).message


def test_schema_subset() -> None:
    schema = {
        "type": "object",
        "required": ["a"],
        "additionalProperties": False,
        "properties": {
            "a": {"type": "integer", "minimum": 1},
            "b": {"type": "array", "items": {"type": "string"}},
            "c": {"enum": ["x", "y"]},
            "d": {"type": "number"},
            "e": {"type": "boolean"},
            "f": {"type": ["string", "null"]},
        },
    }
    assert validate({"a": 1, "b": ["s"], "c": "x", "d": 2, "e": False, "f": None}, schema) == []
    errors = validate({"a": 2.0, "b": [1], "c": "z", "d": "1", "e": 1, "g": 0}, schema)
    assert errors == [
        "$.a: 2.0 is a number, expected integer",
        "$.b[0]: 1 is a integer, expected string",
        '$.c: "z" is not one of ["x", "y"]',
        '$.d: "1" is a string, expected number',
        "$.e: 1 is a integer, expected boolean",
        "$: property 'g' is not in the schema",
    ]
    assert validate({}, schema) == ["$: required property 'a' is missing"]
    assert validate(True, {"type": "integer"}) == ["$: true is a boolean, expected integer"]


def test_schema_checks_every_keyword_with_jsonschema() -> None:
    """Issue #25 section 7: ``pattern``, ``minLength``, ``$ref`` and ``format`` were ignored
    by the hand-written subset, so a tool schema using them passed unchecked."""
    schema = {
        "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 3},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "unit": {"$ref": "#/$defs/unit"},
            "date": {"type": "string", "format": "date"},
        },
    }
    good = {"city": "Paris", "code": "CDG", "unit": "celsius", "date": "2026-12-03"}
    assert validate(good, schema) == []
    bad = {"city": "P", "code": "cdg", "unit": "kelvin", "date": "2026-13-45"}
    assert validate(bad, schema) == [
        '$.city: "P" is 1 characters, expected at least 3',
        '$.code: "cdg" does not match the pattern "^[A-Z]{3}$"',
        '$.unit: "kelvin" is not one of ["celsius", "fahrenheit"]',
        '$.date: "2026-13-45" is not a valid date (format)',
    ]


def test_schema_keeps_the_strict_integer() -> None:
    """2.0 and true are not integers (JSON Schema would take 2.0); 2 is a number too."""
    assert validate(2.0, {"type": "integer"}) == ["$: 2.0 is a number, expected integer"]
    assert validate(False, {"type": "number"}) == ["$: false is a boolean, expected number"]
    assert validate(2, {"type": "number"}) == []
    assert validate(
        {"n": 2.0},
        {"properties": {"n": {"$ref": "#/$defs/i"}}, "$defs": {"i": {"type": "integer"}}},
    ) == ["$.n: 2.0 is a number, expected integer"]
