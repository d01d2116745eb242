"""Tool-call validators: a ``Turn`` plus what was asked -> ``Finding`` (pure, no I/O).

What is checked (REFERENCE section 4): ``tool_calls`` present with ``type`` function (in a
stream, function or never sent: the chunk schema leaves it optional) and the right name;
``arguments`` a JSON string valid against the tool's schema with typed values;
finish_reason ``tool_calls`` for auto/required and ``stop`` for a named choice; no tool
markup in content; streamed fragments that join into valid JSON with stable ids and
indexes; parallel calls; and the 400 of a server without the tool flags, recognised as a
misconfiguration rather than a model failure.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.client.evidence import short
from pytest_spark.serving.client.turn import ToolCall, Turn
from pytest_spark.serving.client.wire import MISCONFIGURED_TOOLS, ErrorBody
from pytest_spark.serving.validate.schema import validate

Mode = Literal["auto", "required", "named"]
MARKUP = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")
TOOL_NEEDLES = ('"tool_calls"', '"finish_reason":"', "</parameter>", "<tool_call>", "<function=")
ONE_PIECE_CHARS = 24  # arguments longer than this arrive in several deltas when streamed

FIX_PARSER = (
    "check that --tool-call-parser matches the model's tool format (qwen3_coder "
    "for Qwen3.5/Qwen3-Coder, hermes for Qwen2.5/Qwen3) and that the chat "
    "template is the model's own"
)
# The profile's side of the same fix: the expectation, where the server is not meant to.
TOOL_SWITCH = (
    "(a server not meant to parse tool calls: --spark-threshold=tool_calls.expected=false; "
    "one that need not call under tool_choice=auto: tool_calls.auto_emits_calls=false, as "
    "--spark-profile=generic has)"
)
FIX_UPGRADE = "a known vLLM tool-parser bug: upgrade vLLM (or pin a build without it)"


@dataclass(frozen=True)
class ToolRequest:
    """What the request asked for: the tools, the tool_choice mode, the calls expected."""

    tools: tuple[dict[str, Any], ...]
    mode: Mode
    names: tuple[str, ...]  # expected calls, one entry per call (parallel: two entries)
    streamed: bool = False
    require_streamed_arguments: bool = True

    @property
    def label(self) -> str:
        choice = f"named {self.names[0]}" if self.mode == "named" else self.mode
        return f"tool_choice={choice}, {'streaming' if self.streamed else 'non-streaming'}"

    def schema(self, name: str | None) -> dict[str, Any] | None:
        for tool in self.tools:
            fn = tool.get("function") or {}
            if fn.get("name") == name:
                params = fn.get("parameters")
                return params if isinstance(params, dict) else {"type": "object"}
        return None

    @property
    def finish_expected(self) -> str:
        return "stop" if self.mode == "named" else "tool_calls"


def markup_in(text: str | None) -> list[str]:
    return [m for m in MARKUP if text and m in text]


def _json_call_in(content: str | None, names: tuple[str, ...]) -> bool:
    """Content that spells a call as JSON (``{"name": "get_weather", "arguments": ...}``)."""
    if not content:
        return False
    return any(re.search(r'"name"\s*:\s*"' + re.escape(n) + '"', content) for n in names)


def _summary(turn: Turn) -> dict[str, Any]:
    return {
        "finish_reason": turn.finish_reason,
        "calls": [
            {
                "id": c.id,
                "type": c.type,
                "name": c.name,
                "arguments": c.arguments,
                **({"fragments": c.fragments} if turn.streamed else {}),
            }
            for c in turn.tool_calls
        ],
        "content": turn.content,
    }


def _call_problems(call: ToolCall, req: ToolRequest, turn: Turn) -> list[str]:
    out: list[str] = []
    tag = f"call {call.index} ({call.name or 'no name'})"
    # Streamed, a call whose deltas never say its type is within OpenAI's chunk schema
    # (ChatCompletionMessageToolCallChunk requires only index): the raw client takes it as
    # the only type there is. What the openai SDK's stream helper makes of it (an untyped
    # call, vLLM #16340) is test_sdk_tool_call[...-stream]'s check (sdkchecks).
    if call.type != "function" and not (turn.streamed and call.type is None):
        out.append(f"{tag}: type is {call.type!r}, expected 'function'")
    if not call.id:
        out.append(f"{tag}: no id")
    if not call.name:
        out.append(f"{tag}: no function name")
    elif req.schema(call.name) is None:
        known = ", ".join(str((t.get("function") or {}).get("name")) for t in req.tools)
        out.append(f"{tag}: names a function that was not offered (offered: {known})")
    args = call.arguments
    if not isinstance(args, str):
        out.append(
            f"{tag}: arguments is a JSON {type(args).__name__}, expected a JSON "
            f"string (OpenAI wire format): {short(args)}"
        )
        return out
    if turn.streamed and args == "":
        out.append(
            f"{tag}: arguments never streamed: the header delta (chunk "
            f"{call.first_chunk}) was followed by no argument fragments before "
            f"finish_reason; {FIX_UPGRADE}"
        )
        return out
    try:
        value = json.loads(args)
    except ValueError as exc:
        what = (
            "the streamed argument fragments do not join into valid JSON"
            if turn.streamed
            else "arguments are not valid JSON"
        )
        out.append(f"{tag}: {what} ({exc}): {short(args)}")
        return out
    if not isinstance(value, dict):
        out.append(
            f"{tag}: arguments is JSON {type(value).__name__}, expected an object: {short(args)}"
        )
        return out
    schema = req.schema(call.name)
    if schema is not None:
        errors = validate(value, schema)
        if errors:
            typed = any("is a string, expected" in e for e in errors)
            hint = ("; values were not typed by the schema: " + FIX_UPGRADE) if typed else ""
            out.append(
                f"{tag}: arguments {short(args)} break the tool's JSON schema: "
                + "; ".join(errors)
                + hint
            )
    if (
        turn.streamed
        and req.require_streamed_arguments
        and call.fragments == 1
        and len(args) > ONE_PIECE_CHARS
    ):
        out.append(
            f"{tag}: arguments arrived in one delta ({len(args)} characters) instead "
            f"of streamed fragments; {FIX_UPGRADE}"
        )
    return out


def auto_declined(turn: Turn, req: ToolRequest) -> str | None:
    """Why the model itself (not the parser) made no call under ``tool_choice=auto``: no
    ``tool_calls`` and plain text with neither tool markup nor a JSON call in it. None
    when the turn did call, or left a call in content (that is a parser failure)."""
    if req.mode != "auto" or turn.tool_calls:
        return None
    content = turn.content
    if markup_in(content) or _json_call_in(content, req.names):
        return None
    return f"the model answered in plain text with no tool markup (content {short(content)})"


# What each vLLM tool parser reads (vllm/entrypoints/openai/tool_parsers/).
PARSER_FORMATS = {
    "qwen3_coder": "XML calls (<tool_call><function=NAME><parameter=KEY>)",
    "qwen3_xml": "XML calls (<tool_call><function=NAME><parameter=KEY>)",
    "hermes": 'JSON in tags (<tool_call>{"name": ..., "arguments": ...}</tool_call>)',
    "llama3_json": 'bare JSON ({"name": ..., "parameters": ...})',
    "mistral": "[TOOL_CALLS] followed by JSON",
    "pythonic": "a Python list of calls ([f(x=1)])",
}


def model_tool_format(content: str | None, names: tuple[str, ...]) -> str | None:
    """The format the model wrote its call in, read from content; None for plain text."""
    text = content or ""
    if "<function=" in text or "<parameter=" in text:
        return "XML calls (<tool_call><function=NAME><parameter=KEY>), the qwen3_coder format"
    if "<tool_call>" in text:
        return 'JSON in tags (<tool_call>{"name": ...}</tool_call>), the hermes format'
    if "[TOOL_CALLS]" in text:
        return "[TOOL_CALLS] JSON, the mistral format"
    if _json_call_in(text, names):
        return 'bare JSON ({"name": ..., "arguments": ...}), the llama3_json format'
    return None


def formats_of(content: str | None, names: tuple[str, ...], parser: str | None) -> str | None:
    """``the model wrote <format>; the server runs <parser>, which reads <format>``, or
    None when content holds no call."""
    written = model_tool_format(content, names)
    if written is None:
        return None
    if parser is None:
        reads = "the server's --tool-call-parser (not read from its command line)"
    else:
        fmt = PARSER_FORMATS.get(parser, "its own format")
        reads = f"--tool-call-parser {parser}, which reads {fmt}"
    return f"the model wrote {written}; the server runs {reads}"


def calls_in_content(turn: Turn, req: ToolRequest, *, parser: str | None = None) -> str | None:
    """The model wrote its call into content and no tool_calls came back: which format the
    model wrote and which the server's parser reads. None when that is not the case."""
    if turn.tool_calls:
        return None
    formats = formats_of(turn.content, req.names, parser)
    return None if formats is None else f"the call was left in content: {formats}"


def unstreamed_arguments(turn: Turn) -> str | None:
    """A streamed turn whose calls came as a header delta with no argument fragments after
    it (the streaming tool parser dropped them): which calls; None when that is not so."""
    if not turn.streamed:
        return None
    empty = [c for c in turn.tool_calls if c.arguments == ""]
    if not empty:
        return None
    calls = ", ".join(
        f"call {c.index} ({c.name or 'no name'}, header at chunk {c.first_chunk})" for c in empty
    )
    return f"the streamed tool-call arguments never came: {calls}, then no argument fragments"


def check_tool_calls(
    turn: Turn, req: ToolRequest, *, server: str = "", parser: str | None = None
) -> Finding:
    """Every tool-call property of one turn; the message lists each one that broke."""
    problems: list[str] = []
    content = turn.content
    leaked = markup_in(content)
    formats = formats_of(content, req.names, parser)
    if not turn.tool_calls:
        if leaked:
            problems.append(
                f"the call was left in content as raw markup ({', '.join(leaked)})"
                f" and no tool_calls came back: the tool parser did not parse the "
                f"model's output ({formats}); {FIX_PARSER}"
            )
        elif _json_call_in(content, req.names):
            problems.append(
                "the call was written into content as JSON and no tool_calls came "
                f"back: the tool parser did not recognise it ({formats}); {FIX_PARSER}"
            )
        elif req.mode == "auto":
            problems.append(
                f"the model answered in content instead of calling "
                f"{', '.join(sorted(set(req.names)))} (content "
                f"{short(content)}); if the model can call tools, {FIX_PARSER} {TOOL_SWITCH}"
            )
        else:
            problems.append(
                f"no tool_calls although tool_choice={req.mode} forces a call "
                f"(content {short(content)})"
            )
    elif leaked:
        problems.append(
            f"tool markup leaked into content next to the parsed call "
            f"({', '.join(leaked)}): content {short(content)}; {FIX_UPGRADE}"
        )
    problems += [f"stream: {p}" for p in turn.problems]
    for call in turn.tool_calls:
        problems += _call_problems(call, req, turn)
    if turn.tool_calls:
        got = Counter(str(c.name) for c in turn.tool_calls)
        want = Counter(req.names)
        if want - got:
            names = ", ".join(str(c.name) for c in turn.tool_calls)
            problems.append(
                f"expected {len(req.names)} call(s) ({', '.join(req.names)}), got "
                f"{len(turn.tool_calls)} ({names})"
                + ("; parallel calls were not returned" if len(req.names) > 1 else "")
            )
        if req.mode == "named" and set(got) - {req.names[0]}:
            problems.append(
                f"tool_choice named {req.names[0]!r} but the server called "
                f"{sorted(str(n) for n in got)}"
            )
    finish = turn.finish_reason
    if finish != req.finish_expected and (turn.tool_calls or finish == "length"):
        hint = (
            " (cut by max_tokens: the call did not fit)"
            if finish == "length"
            else " (vLLM sends stop for a named tool_choice, tool_calls for auto/required)"
        )
        problems.append(f"finish_reason {finish!r}, expected {req.finish_expected!r}{hint}")
    measured = _summary(turn)
    expected = {"names": list(req.names), "finish_reason": req.finish_expected}
    if problems:
        prefix = f"{server}: " if server else ""
        return Finding.failed(
            measured,
            expected,
            message=f"{prefix}{req.label}: " + "; ".join(problems),
            evidence=turn.evidence(*TOOL_NEEDLES),
        )
    return Finding.passed(
        measured,
        expected,
        message=f"{req.label}: {len(turn.tool_calls)} valid call(s), finish_reason {finish}",
    )


def compare_arguments(
    plain: Turn, streamed: Turn, req: ToolRequest, *, server: str = ""
) -> Finding:
    """Streamed arguments must decode to the same JSON as the non-streaming answer to the
    same deterministic request (temperature 0, fixed seed)."""

    def decoded(turn: Turn) -> list[Any]:
        out = []
        for c in turn.tool_calls:
            try:
                out.append((c.name, json.loads(c.arguments)))
            except (TypeError, ValueError):
                out.append((c.name, c.arguments))
        return out

    a, b = decoded(plain), decoded(streamed)
    if a == b:
        return Finding.passed(
            b, a, message=f"{req.label}: streamed arguments equal the non-streaming ones"
        )
    prefix = f"{server}: " if server else ""
    return Finding.failed(
        b,
        a,
        message=f"{prefix}{req.label}: streamed calls {short(b, 200)} differ from the "
        f"non-streaming calls {short(a, 200)} for the same request (temperature 0, fixed "
        f"seed): the streaming tool parser assembles arguments differently; {FIX_UPGRADE}",
        evidence={
            **{f"non-streaming {k}": v for k, v in plain.exchange.evidence().items()},
            **{f"streaming {k}": v for k, v in streamed.evidence(*TOOL_NEEDLES).items()},
        },
    )


def check_auto_refused(
    status: int, error: ErrorBody, evidence: dict[str, str], *, server: str = ""
) -> Finding | None:
    """The misconfiguration verdict for ``tool_choice: "auto"`` refused with vLLM's 400;
    None when the error is something else."""
    if status != 400 or not error.auto_tool_choice_refused:
        return None
    prefix = f"{server}: " if server else ""
    return Finding.failed(
        "HTTP 400 " + error.message,
        "tool_choice auto accepted",
        message=f"{prefix}{MISCONFIGURED_TOOLS}: tool_choice=auto is refused with HTTP 400 "
        f"{short(error.message, 200)}. This is the server's configuration, not a model "
        "failure: add --enable-auto-tool-choice --tool-call-parser PARSER to vllm serve "
        f"(qwen3_coder for Qwen3.5) {TOOL_SWITCH}",
        evidence=evidence,
    )
