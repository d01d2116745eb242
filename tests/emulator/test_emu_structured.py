"""Structured output on the emulator as vLLM serves it: ``response_format`` json_schema and
json_object give JSON the schema accepts (plain and streamed, after the reasoning), a
schema the grammar compiler cannot take is vLLM's 400, and the ``response-format-ignored``
fault answers in plain text."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from conftest import Emu

GRAMMAR = "Failed to transform json schema into a grammar: "
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "sunny": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
    },
    "required": ["city", "days", "unit", "sunny", "tags"],
    "additionalProperties": False,
}
ASK = {
    "messages": [{"role": "user", "content": "Forecast for Paris for 3 days in fahrenheit."}],
    "max_tokens": 400,
}


def json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}}


def streamed(emu: Emu, body: dict[str, Any]) -> tuple[str, str]:
    """(content, reasoning) joined from a stream's deltas."""
    events = emu.chat({**body, "stream": True}).events()
    assert events[-1] == "[DONE]"
    content, reasoning = [], []
    for e in events[:-1]:
        for choice in json.loads(e)["choices"]:
            content.append(choice["delta"].get("content") or "")
            reasoning.append(choice["delta"].get("reasoning") or "")
    return "".join(content), "".join(reasoning)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_json_schema_answer_validates(qwen: Emu, stream: bool) -> None:
    body = {**ASK, "response_format": json_schema(CITY)}
    if stream:
        content, reasoning = streamed(qwen, body)
    else:
        message = qwen.chat(body).json()["choices"][0]["message"]
        content, reasoning = message["content"], message["reasoning"]
    value = json.loads(content)
    jsonschema.validate(value, CITY)
    assert value["city"] == "Paris" and value["days"] == 3 and value["unit"] == "fahrenheit"
    assert reasoning  # thinking comes first; the grammar applies to the answer only


def test_json_object_answer_is_an_object(qwen: Emu) -> None:
    body = {**ASK, "response_format": {"type": "json_object"}}
    content = qwen.chat(body).json()["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content), dict)


def test_text_format_is_plain(qwen: Emu) -> None:
    body = {**ASK, "response_format": {"type": "text"}}
    content = qwen.chat(body).json()["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):
        json.loads(content)


@pytest.mark.parametrize(
    ("fmt", "says"),
    [
        (
            json_schema({"type": "wibble"}),
            'Failed to transform json schema into a grammar: $: unsupported type "wibble"',
        ),
        (json_schema({"type": "object", "properties": []}), "$.properties: must be an object"),
        ({"type": "json_schema"}, "requires a json_schema field"),
        ({"type": "yaml"}, "literal_error"),
    ],
)
def test_bad_response_format_is_400(qwen: Emu, fmt: dict[str, Any], says: str) -> None:
    resp = qwen.chat({**ASK, "response_format": fmt})
    assert resp.status == 400, resp.body
    error = resp.json()["error"]
    assert error["code"] == 400 and says in error["message"], error


def test_response_format_ignored_fault(faulty: Any) -> None:
    emu = faulty("response-format-ignored")
    body = {**ASK, "response_format": json_schema(CITY)}
    content = emu.chat(body).json()["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):
        json.loads(content)
    assert "Paris" not in content or not content.startswith("{")
