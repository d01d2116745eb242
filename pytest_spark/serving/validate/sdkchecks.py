"""What the ``openai`` SDK made of an answer, against what the raw client read from the
same request (pure: two ``Turn``s in, a ``Finding`` out).

The raw client (``stream``/``turn``) reads the wire exactly; the SDK is what applications
use. Both asked the same deterministic request (temperature 0, fixed seed), so the SDK's
typed objects must assemble to the same calls (names and decoded arguments, the finish
reason), expose the reasoning under the same field (``model_extra``) and give the same
JSON answer.

A streamed call must also come out of the SDK's own accumulator typed and finished
(:func:`check_stream_helper`): OpenAI's chunk schema requires only ``index`` in a tool-call
delta, so the raw checks accept a header delta without ``type``; the SDK's stream helper
does not type such a call, and applications built on it never run it. That defect is this
check's alone (the raw checks pass it, as the schema allows).
"""

from __future__ import annotations

import json
from typing import Any

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.client.evidence import short
from pytest_spark.serving.client.sdk import SdkTurn, StreamHelper
from pytest_spark.serving.client.turn import Turn

DONE_EVENT = "tool_calls.function.arguments.done"

FIX_SDK = (
    "the server's answer is valid on the wire but typed differently by the openai SDK: "
    "compare the raw and the SDK evidence; usually a vLLM change in a field the SDK models "
    "(upgrade or pin vLLM), else an SDK version that models the field differently (pin "
    "openai)"
)


def _calls(turn: Turn) -> list[tuple[Any, Any]]:
    out = []
    for c in turn.tool_calls:
        try:
            out.append((c.name, json.loads(c.arguments)))
        except (TypeError, ValueError):
            out.append((c.name, c.arguments))
    return out


def _json(text: str | None) -> Any:
    try:
        return json.loads(text or "")
    except ValueError:
        return text


def compare_sdk(raw: Turn, sdk: Turn, label: str, *, what: str, server: str = "") -> Finding:
    """``what``: ``calls`` (names, decoded arguments, finish reason), ``reasoning`` (the
    field that holds it, and that it is there), ``json`` (the decoded answer)."""
    if what == "calls":
        a: Any = {"calls": _calls(raw), "finish_reason": raw.finish_reason}
        b: Any = {"calls": _calls(sdk), "finish_reason": sdk.finish_reason}
    elif what == "reasoning":
        a = {"field": raw.reasoning_field, "reasoning": bool((raw.reasoning or "").strip())}
        b = {"field": sdk.reasoning_field, "reasoning": bool((sdk.reasoning or "").strip())}
    else:
        a, b = _json(raw.content), _json(sdk.content)
    if a == b:
        return Finding.passed(
            b, a, message=f"{label}: the openai SDK reads the same {what} as the raw client"
        )
    prefix = f"{server}: " if server else ""
    return Finding.failed(
        b,
        a,
        message=f"{prefix}{label}: through the openai SDK the {what} are {short(b, 200)}, the "
        f"raw client read {short(a, 200)} for the same request (temperature 0, fixed seed); "
        f"{FIX_SDK}",
        evidence={
            **{f"raw {k}": v for k, v in raw.exchange.evidence().items()},
            **{f"sdk {k}": v for k, v in sdk.exchange.evidence().items()},
        },
    )


FIX_HELPER = (
    "The bytes are within OpenAI's chunk schema (a tool-call delta needs only index), so the "
    "raw client assembles the call, but the SDK's stream helper types a call from its first "
    "delta's type. A known vLLM bug in the named tool_choice streaming path "
    "(vllm-project/vllm#16340: the first DeltaToolCall built without type, chunks "
    "serialised with exclude_unset): upgrade vLLM (or pin a build without it)"
)


def check_stream_helper(turn: SdkTurn, label: str, *, server: str = "") -> Finding:
    """A streamed turn's tool calls through the SDK's stream helper
    (``ChatCompletionStreamState``, behind ``client.chat.completions.stream()``): every call
    the chunks carried is typed ``function`` in ``get_final_completion()``, was reported by
    a ``tool_calls.function.arguments.done`` event, and has the name and arguments the
    chunks spell (``turn.tool_calls``, assembled from the same typed chunks)."""
    helper = turn.helper or StreamHelper()
    want = [(c.name, c.arguments) for c in turn.tool_calls]
    got = [(c.name, c.arguments) for c in helper.calls]
    measured = {
        "calls": [
            {"index": c.index, "type": c.type, "name": c.name, "done": c.done} for c in helper.calls
        ],
        **({"error": helper.error} if helper.error else {}),
    }
    expected = {"calls": [{"type": "function", "name": n, "done": True} for n, _ in want]}
    problems = []
    if helper.error:
        problems.append(f"the stream helper raised {helper.error}")
    elif got != want:
        problems.append(
            f"the stream helper assembled {short(got, 200)}, the chunks spell {short(want, 200)}"
        )
    for c in helper.calls:
        tag = f"tool call {c.index} ({c.name or 'no name'})"
        if c.type != "function":
            where = f"choices.0.delta.tool_calls.{c.index}.type"
            if '"type"' not in c.header:
                problems.append(
                    f"{tag}: its first delta (chunk {c.header_chunk}) has no field {where}: "
                    f"{short(c.header, 300)}; so get_final_completion() types it "
                    f"type={c.type!r}"
                )
            else:
                problems.append(f"{tag}: get_final_completion() types it type={c.type!r}")
        if not c.done:
            problems.append(f"{tag}: no {DONE_EVENT} event came for it")
    if not problems:
        return Finding.passed(
            measured,
            expected,
            message=f"{label}: the SDK's stream helper typed and finished "
            f"{len(helper.calls)} call(s)",
        )
    prefix = f"{server}: " if server else ""
    consequence = (
        "; applications on client.chat.completions.stream() (its events, or "
        "tool_call.type == 'function' in the final completion) never see the call"
    )
    return Finding.failed(
        measured,
        expected,
        message=f"{prefix}{label}: through the openai SDK's stream helper "
        f"(ChatCompletionStreamState): " + "; ".join(problems) + f"{consequence}. {FIX_HELPER}",
        evidence=turn.evidence('"tool_calls"', '"finish_reason":"'),
    )
