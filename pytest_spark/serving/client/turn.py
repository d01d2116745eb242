"""One assistant turn, read the same way from a JSON response or from stream chunks.

Streaming assembly follows OpenAI's delta rules as vLLM sends them: the first delta of a
tool call carries ``index``, ``id``, ``type`` and ``function.name``; later deltas carry the
same ``index`` and ``function.arguments`` fragments that concatenate into the arguments.
Anything inconsistent (an id that changes, an index that skips, a call without a name)
is kept in ``Turn.problems`` for the validators to report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_spark.serving.client.evidence import Exchange, sse_lines
from pytest_spark.serving.client.stream import StreamResult
from pytest_spark.serving.client.wire import reasoning_of


@dataclass
class ToolCall:
    index: int
    id: str | None
    type: str | None
    name: str | None
    arguments: Any  # a str on the wire; anything else is reported
    fragments: int = 1  # streamed: non-empty argument deltas
    first_chunk: int = 0  # streamed: chunk number of the header delta


@dataclass
class Turn:
    """What the assistant sent: content, reasoning, tool calls, finish reason, usage."""

    streamed: bool
    content: str | None
    reasoning: str | None
    reasoning_fields: tuple[str, ...]
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: dict[str, Any] | None
    exchange: Exchange
    reasoning_null_fields: tuple[str, ...] = ()
    order: list[str] = field(default_factory=list)  # streamed: kinds in arrival order
    problems: list[str] = field(default_factory=list)
    chunks: int = 0
    response_id: str | None = None
    token_deltas: int = 0  # streamed: chunks that carried text or tool-call data

    @property
    def reasoning_field(self) -> str | None:
        return "+".join(self.reasoning_fields) or None

    @property
    def label(self) -> str:
        return "streaming" if self.streamed else "non-streaming"

    def evidence(self, *needles: str) -> dict[str, str]:
        """Request and response or stream excerpt; for a stream, also its chunks that hold
        any of ``needles`` (e.g. the tool-call deltas), wherever they fall."""
        extra = {}
        if self.streamed and needles:
            lines = sse_lines(self.exchange.body, needles)
            if lines:
                extra["stream (selected chunks)"] = lines
        return self.exchange.evidence(**extra)


def from_response(data: dict[str, Any], exchange: Exchange) -> Turn:
    """A non-streaming chat completion."""
    problems: list[str] = []
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        problems.append("the response has no choices[0]")
        return Turn(
            False,
            None,
            None,
            (),
            [],
            None,
            data.get("usage"),
            exchange,
            problems=problems,
            response_id=data.get("id"),
        )
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        problems.append("choices[0] has no message object")
        message = {}
    reasoning = reasoning_of(message)
    calls = []
    for i, raw in enumerate(message.get("tool_calls") or []):
        if not isinstance(raw, dict):
            problems.append(f"tool_calls[{i}] is not an object: {raw!r}")
            continue
        fn = _obj(raw.get("function"))
        calls.append(
            ToolCall(i, raw.get("id"), raw.get("type"), fn.get("name"), fn.get("arguments"))
        )
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        problems.append(f"content is a {type(content).__name__}, not a string")
        content = str(content)
    return Turn(
        False,
        content,
        reasoning.text,
        reasoning.fields,
        calls,
        choice.get("finish_reason"),
        data.get("usage"),
        exchange,
        reasoning_null_fields=reasoning.null_fields,
        problems=problems,
        response_id=data.get("id"),
    )


def from_stream(result: StreamResult) -> Turn:
    """A streamed chat completion, assembled from its chunks."""
    return assemble(result.chunks, result.exchange)


def assemble(chunks: list[dict[str, Any]], exchange: Exchange) -> Turn:
    problems: list[str] = []
    content: list[str] = []
    reasoning: list[str] = []
    fields: list[str] = []
    null_fields: set[str] = set()
    calls: dict[int, ToolCall] = {}
    order: list[str] = []
    finish: str | None = None
    usage = None
    ids: set[str] = set()
    token_deltas = 0
    for n, chunk in enumerate(chunks, 1):
        if chunk.get("id") is not None:
            ids.add(str(chunk["id"]))
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                problems.append(f"chunk {n}: a choice is not an object")
                continue
            if choice.get("index", 0) != 0:
                problems.append(f"chunk {n}: choice index {choice.get('index')} (asked for one)")
            if choice.get("finish_reason") is not None:
                if finish is not None and choice["finish_reason"] != finish:
                    problems.append(
                        f"chunk {n}: a second finish_reason "
                        f"{choice['finish_reason']!r} after {finish!r}"
                    )
                finish = choice["finish_reason"]
            delta = choice.get("delta") or {}
            carried = False
            r = reasoning_of(delta)
            null_fields.update(r.null_fields)
            if r.text:
                reasoning.append(r.text)
                fields.extend(f for f in r.fields if f not in fields)
                _mark(order, "reasoning")
                carried = True
            text = delta.get("content")
            if isinstance(text, str) and text:
                content.append(text)
                _mark(order, "content")
                carried = True
            for tc in delta.get("tool_calls") or []:
                _tool_delta(tc, n, calls, problems)
                _mark(order, "tool_calls")
                carried = True
            token_deltas += carried
    if len(ids) > 1:
        problems.append(f"chunk ids differ within one stream: {sorted(ids)}")
    return Turn(
        True,
        "".join(content) if content else None,
        "".join(reasoning) if reasoning else None,
        tuple(fields),
        [calls[i] for i in sorted(calls)],
        finish,
        usage,
        exchange,
        reasoning_null_fields=tuple(sorted(null_fields - set(fields))),
        order=order,
        problems=problems,
        chunks=len(chunks),
        response_id=next(iter(ids)) if len(ids) == 1 else None,
        token_deltas=token_deltas,
    )


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _mark(order: list[str], kind: str) -> None:
    if not order or order[-1] != kind:
        order.append(kind)


def _tool_delta(tc: Any, n: int, calls: dict[int, ToolCall], problems: list[str]) -> None:
    if not isinstance(tc, dict):
        problems.append(f"chunk {n}: a tool_calls delta is not an object: {tc!r}")
        return
    index = tc.get("index")
    fn = _obj(tc.get("function"))
    args = fn.get("arguments")
    if not isinstance(index, int):
        problems.append(f"chunk {n}: tool_calls delta without an integer index: {tc!r}")
        index = max(calls, default=0)
    call = calls.get(index)
    if call is None:
        if index != len(calls):
            problems.append(
                f"chunk {n}: tool call index {index} opened after "
                f"{len(calls)} call(s) (indexes must count up from 0)"
            )
        if not tc.get("id"):
            problems.append(f"chunk {n}: the first delta of tool call {index} has no id")
        if not fn.get("name"):
            problems.append(f"chunk {n}: the first delta of tool call {index} has no function name")
        others = {c.id for c in calls.values()}
        if tc.get("id") and tc["id"] in others:
            problems.append(f"chunk {n}: tool call {index} reuses id {tc['id']!r} of another call")
        calls[index] = ToolCall(
            index,
            tc.get("id"),
            tc.get("type"),
            fn.get("name"),
            args if isinstance(args, str) else "",
            fragments=1 if isinstance(args, str) and args else 0,
            first_chunk=n,
        )
        if args is not None and not isinstance(args, str):
            problems.append(
                f"chunk {n}: tool call {index} arguments is a "
                f"{type(args).__name__}, not a string fragment"
            )
        return
    if tc.get("id") and call.id and tc["id"] != call.id:
        problems.append(f"chunk {n}: tool call {index} changed id from {call.id!r} to {tc['id']!r}")
    if fn.get("name") and call.name and fn["name"] != call.name:
        problems.append(
            f"chunk {n}: tool call {index} changed name from {call.name!r} to {fn['name']!r}"
        )
    if fn.get("name") and not call.name:
        call.name = fn["name"]
    if isinstance(args, str):
        if args:
            call.arguments = str(call.arguments) + args
            call.fragments += 1
    elif args is not None:
        problems.append(
            f"chunk {n}: tool call {index} arguments fragment is a "
            f"{type(args).__name__}, not a string"
        )
