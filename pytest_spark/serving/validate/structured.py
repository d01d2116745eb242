"""Structured output: ``response_format`` json_schema and json_object -> ``Finding`` (pure).

The answer (``content``; reasoning, when the server separates it, is not part of it) must
be JSON: for ``json_object`` an object, for ``json_schema`` a value the schema accepts,
validated with ``jsonschema`` (Draft 2020-12, as OpenAI's structured outputs and vLLM's
guided decoding read the schema). A server that ignores ``response_format`` answers in
plain text: that fails, quoting what came back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.client.evidence import short
from pytest_spark.serving.client.turn import Turn

FormatKind = Literal["json_schema", "json_object"]
FORMATS: tuple[FormatKind, ...] = ("json_schema", "json_object")

FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        # no numeric ranges: older xgrammar backends refuse minimum/maximum with a 400
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
QUESTION = (
    "Give the forecast request for Paris for 3 days in celsius as JSON with the keys "
    "city, days and unit."
)
SEED = 1234

FIX_IGNORED = (
    "vLLM honours response_format through structured outputs (guided decoding): check that "
    "the server was not started with a structured-outputs backend that is missing or "
    "disabled (--structured-outputs-config), and that no proxy between the suite and vLLM "
    "drops the field; else upgrade vLLM (a server not meant to honour response_format: "
    "--spark-threshold=structured_output.expected=false)"
)
FIX_INVALID = (
    "guided decoding should only allow JSON the schema accepts: a known vLLM "
    "structured-outputs bug, or a backend that does not support a keyword of this schema "
    "(--structured-outputs-config backend=...): upgrade vLLM or change the backend"
)
FIX_CUT = "raise structured_output.max_tokens in the profile: the JSON did not fit"


@dataclass(frozen=True)
class FormatRequest:
    """What was asked: the format, its schema (json_schema), streaming or not."""

    kind: FormatKind
    streamed: bool = False
    schema: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        how = "streaming" if self.streamed else "non-streaming"
        return f"response_format {self.kind}, {how}"

    def response_format(self) -> dict[str, Any]:
        if self.kind == "json_object":
            return {"type": "json_object"}
        return {
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": self.schema or FORECAST, "strict": True},
        }

    def params(self, max_tokens: int) -> dict[str, Any]:
        """The chat completion parameters (besides model and messages)."""
        return {
            "response_format": self.response_format(),
            "temperature": 0,
            "seed": SEED,
            "max_tokens": max_tokens,
        }


def request_for(kind: FormatKind, streamed: bool) -> FormatRequest:
    return FormatRequest(kind, streamed, FORECAST if kind == "json_schema" else None)


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Every way ``value`` breaks ``schema`` (``jsonschema``), as ``$.days: ...`` lines."""
    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        path = "$" + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
        )
        out.append(f"{path}: {error.message}")
    return out


def decoded(turn: Turn) -> tuple[bool, Any]:
    """(whether content parsed as JSON, the value or the content)."""
    try:
        return True, json.loads(turn.content or "")
    except ValueError:
        return False, turn.content


def trailing_json(text: str) -> tuple[str, Any] | None:
    """(the text before, the value) when ``text`` ends in a JSON object or array after
    some other text; None otherwise."""
    for i, ch in enumerate(text):
        if ch in "{[" and i > 0:
            try:
                return text[:i], json.loads(text[i:])
            except ValueError:
                continue
    return None


def reasoning_leak(turn: Turn) -> str | None:
    """The answer's JSON came after the model's thinking, left in content (no reasoning
    field, or a think tag in content): the reasoning parser's failure, not the format's.
    What was seen, or None."""
    content = turn.content or ""
    ok, _ = decoded(turn)
    if ok or ((turn.reasoning or "").strip() and "</think>" not in content):
        return None
    found = trailing_json(content)
    if found is None:
        return None
    return (
        f"the JSON answer follows text left in content ({short(found[0].strip(), 120)}): "
        "the model's reasoning was not separated from the answer"
    )


def ignored(turn: Turn) -> bool:
    """The answer is not JSON at all (text, nothing): the format was not applied."""
    ok, _ = decoded(turn)
    return not ok and turn.finish_reason != "length" and reasoning_leak(turn) is None


def check_structured(turn: Turn, req: FormatRequest, *, server: str = "") -> Finding:
    """Content parses as JSON; json_object: an object; json_schema: the schema accepts it.
    The message names what came back."""
    prefix = f"{server}: " if server else ""
    expected = "JSON the schema accepts" if req.kind == "json_schema" else "a JSON object"
    problems = [f"stream: {p}" for p in turn.problems]
    ok, value = decoded(turn)
    if not ok:
        content = turn.content
        if turn.finish_reason == "length":
            problems.append(
                f"the JSON was cut by max_tokens (finish_reason length): content "
                f"{short(content, 200)}; {FIX_CUT}"
            )
        elif reasoning_leak(turn) is not None:
            problems.append(f"{reasoning_leak(turn)}; check --reasoning-parser")
        elif not (content or "").strip():
            problems.append(
                f"no content came back (content {short(content)}, finish_reason "
                f"{turn.finish_reason!r}) although response_format asks for {expected}"
            )
        else:
            problems.append(
                f"the server ignored response_format: content is not JSON but text "
                f"{short(content, 200)}; {FIX_IGNORED}"
            )
    elif req.kind == "json_object" and not isinstance(value, dict):
        problems.append(
            f"content is JSON {type(value).__name__}, not an object: {short(turn.content)}"
        )
    elif req.kind == "json_schema":
        errors = schema_errors(value, req.schema or FORECAST)
        if errors:
            problems.append(
                f"content {short(turn.content, 200)} breaks the schema: "
                + "; ".join(errors)
                + f"; {FIX_INVALID}"
            )
    measured = {"content": turn.content, "finish_reason": turn.finish_reason}
    if problems:
        return Finding.failed(
            measured,
            expected,
            message=f"{prefix}{req.label}: " + "; ".join(problems),
            evidence=turn.evidence('"content"'),
        )
    return Finding.passed(
        measured, expected, message=f"{req.label}: content {short(turn.content)} is {expected}"
    )
