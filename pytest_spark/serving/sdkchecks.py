"""What the ``openai`` SDK made of an answer, against what the raw client read from the
same request (pure: two ``Turn``s in, a ``Finding`` out).

The raw client (``stream``/``turn``) reads the wire exactly; the SDK is what applications
use. Both asked the same deterministic request (temperature 0, fixed seed), so the SDK's
typed objects must assemble to the same calls (names and decoded arguments, the finish
reason), expose the reasoning under the same field (``model_extra``) and give the same
JSON answer.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_spark.checks.base import Finding
from pytest_spark.serving.evidence import short
from pytest_spark.serving.turn import Turn

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
