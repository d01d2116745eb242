"""Reasoning validators: a ``Turn`` -> ``Finding`` (pure, no I/O).

REFERENCE section 4: the qwen3 parser splits ``reasoning</think>\\n\\nanswer`` into the
reasoning field (``reasoning`` or ``reasoning_content`` by version) and ``content``; the
tags never reach ``content``; ``enable_thinking: false`` gives content only; a cut inside
the thinking gives finish_reason ``length``, all reasoning and no content.
"""

from __future__ import annotations

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.client.evidence import short
from pytest_spark.serving.client.turn import Turn
from pytest_spark.serving.validate.tools import ToolRequest, check_tool_calls

THINK_TAGS = ("<think>", "</think>")
# stream chunks worth showing whatever the excerpt keeps: answer text, tags, the finish
NEEDLES = ('"content":"', "think>", '"finish_reason":"', '"tool_calls"')
NO_REASONING_FIELD = "server returns no reasoning field: started without --reasoning-parser?"
FIX_PARSER = "start vllm serve with --reasoning-parser matching the model (qwen3 for Qwen3/Qwen3.5)"
# The profile's side of the same fix: the expectation, where the server is not meant to.
REASONING_SWITCH = (
    "(a server not meant to separate reasoning, not vLLM or a model without thinking: "
    "--spark-threshold=reasoning.expected=false, or --spark-profile=generic)"
)
FIX_UPGRADE = "a known vLLM reasoning-parser bug: upgrade vLLM (or pin a build without it)"


def _norm(text: str | None) -> str:
    return " ".join((text or "").split())


def _fail(
    turn: Turn, what: str, problems: list[str], server: str, measured: object, expected: object
) -> Finding:
    prefix = f"{server}: " if server else ""
    return Finding.failed(
        measured,
        expected,
        message=f"{prefix}{what} ({turn.label}): " + "; ".join(problems),
        evidence=turn.evidence(*NEEDLES),
    )


def _measured(turn: Turn) -> dict[str, object]:
    return {
        "reasoning_field": turn.reasoning_field,
        "reasoning_chars": len(turn.reasoning or ""),
        "content_chars": len(turn.content or ""),
        "finish_reason": turn.finish_reason,
        **({"order": list(turn.order)} if turn.streamed else {}),
    }


def tags_in(text: str | None) -> list[str]:
    return [t for t in THINK_TAGS if text and t in text]


def check_reasoning(turn: Turn, *, server: str = "") -> Finding:
    """Thinking on: reasoning present and non-empty (field recorded), no tags in content,
    the answer in content."""
    problems: list[str] = []
    leaked = tags_in(turn.content)
    if not (turn.reasoning or "").strip():
        if leaked:
            problems.append(
                f"reasoning is not separated: {' and '.join(leaked)} in content and "
                f"no reasoning field: {FIX_PARSER} {REASONING_SWITCH}"
            )
        else:
            known = turn.reasoning_null_fields
            field = (
                f" ({'/'.join(known)} null)"
                if known
                else " (neither reasoning nor reasoning_content present)"
            )
            problems.append(
                f"no reasoning{field}; content holds the whole output "
                f"({len(turn.content or '')} characters, {short(turn.content, 80)}): "
                f"the model's thinking landed in content; {NO_REASONING_FIELD} "
                f"{REASONING_SWITCH}. Otherwise {FIX_UPGRADE}"
            )
    elif leaked:
        problems.append(
            f"{' and '.join(leaked)} leaked into content: {short(turn.content, 160)}; {FIX_UPGRADE}"
        )
    if tags_in(turn.reasoning):
        problems.append(
            f"{' and '.join(tags_in(turn.reasoning))} left inside the reasoning text; {FIX_UPGRADE}"
        )
    if turn.finish_reason == "stop" and not _norm(turn.content) and not turn.tool_calls:
        problems.append(
            "content is empty although the answer finished (finish_reason stop): "
            "the answer stayed in reasoning"
        )
    problems += [f"stream: {p}" for p in turn.problems]
    expected = {"reasoning": "non-empty", "content": "answer, no <think>/</think>"}
    if problems:
        return _fail(turn, "reasoning", problems, server, _measured(turn), expected)
    return Finding.passed(
        _measured(turn),
        expected,
        message=f"reasoning ({turn.label}) in "
        f"field {turn.reasoning_field}, {len(turn.reasoning or '')} chars",
    )


def check_thinking_disabled(turn: Turn, *, server: str = "") -> Finding:
    """``chat_template_kwargs: {"enable_thinking": false}``: no reasoning, answer in content."""
    problems: list[str] = []
    reasoning = _norm(turn.reasoning)
    if reasoning and not _norm(turn.content):
        problems.append(
            f"the answer landed in reasoning ({turn.reasoning_field}: "
            f"{short(turn.reasoning, 120)}) and content is empty; {FIX_UPGRADE}"
        )
    elif reasoning:
        problems.append(
            f"reasoning came back although thinking was disabled "
            f"({turn.reasoning_field}: {short(turn.reasoning, 120)})"
        )
    elif not _norm(turn.content):
        problems.append(f"content is empty (finish_reason {turn.finish_reason!r}): no answer")
    leaked = tags_in(turn.content)
    if leaked:
        problems.append(f"{' and '.join(leaked)} in content: {short(turn.content, 160)}")
    problems += [f"stream: {p}" for p in turn.problems]
    expected = {"reasoning": None, "content": "the answer"}
    if problems:
        return _fail(turn, "enable_thinking false", problems, server, _measured(turn), expected)
    return Finding.passed(
        _measured(turn),
        expected,
        message=f"enable_thinking false ({turn.label}): answer in content, no reasoning",
    )


def check_truncated(
    turn: Turn, max_tokens: int, *, full_reasoning: str | None = None, server: str = ""
) -> Finding:
    """Cut by max_tokens inside the thinking: finish_reason ``length``, reasoning only,
    nothing leaked into content. ``full_reasoning`` (the uncut answer to the same request)
    tells a leak from a thinking phase that really ended before the cut."""
    problems: list[str] = []
    content = _norm(turn.content)
    reasoning = _norm(turn.reasoning)
    if turn.finish_reason != "length":
        problems.append(
            f"finish_reason {turn.finish_reason!r} after max_tokens={max_tokens}, expected 'length'"
        )

    def compact(text: str | None) -> str:
        return "".join((text or "").split())

    inside = full_reasoning is not None and compact(full_reasoning).startswith(
        compact((turn.reasoning or "") + (turn.content or ""))
    )
    if content and (inside or not reasoning):
        where = (
            "the cut fell inside the thinking (the uncut reasoning starts with this text)"
            if inside
            else "nothing came back as reasoning"
        )
        got = short(turn.reasoning, 60) if turn.reasoning else "none"
        problems.append(
            f"reasoning leaked into content on truncation: content "
            f"{short(turn.content, 120)}, reasoning {got}; {where}; {FIX_UPGRADE}"
        )
    elif not reasoning and not content:
        problems.append("neither reasoning nor content came back")
    leaked = tags_in(turn.content)
    if leaked:
        problems.append(f"{' and '.join(leaked)} in content: {short(turn.content, 120)}")
    expected = {"finish_reason": "length", "content": None, "reasoning": "the cut thinking"}
    if problems:
        return _fail(
            turn,
            f"truncation by max_tokens={max_tokens}",
            problems,
            server,
            _measured(turn),
            expected,
        )
    if content:
        return Finding.warned(
            _measured(turn),
            expected,
            message=f"truncation "
            f"({turn.label}): the thinking ended within max_tokens="
            f"{max_tokens}, so a cut inside it was not observed",
            evidence=turn.evidence(*NEEDLES),
        )
    return Finding.passed(
        _measured(turn),
        expected,
        message=f"truncation ({turn.label}): finish_reason length, reasoning only",
    )


def check_order(turn: Turn, *, server: str = "") -> Finding:
    """Streaming: every reasoning delta before the first content or tool-call delta."""
    order = turn.order
    problems = []
    if "reasoning" not in order:
        problems.append("no reasoning deltas in the stream")
    elif order.index("reasoning") != 0 or order.count("reasoning") > 1:
        problems.append(
            f"delta kinds arrived in the order {' -> '.join(order)}: reasoning "
            f"must come before content and tool calls; {FIX_UPGRADE}"
        )
    expected = "reasoning -> content | tool_calls"
    if problems:
        return _fail(turn, "reasoning stream order", problems, server, order, expected)
    return Finding.passed(order, expected, message=f"stream order {' -> '.join(order)}")


def compare_stream(
    plain: Turn, streamed: Turn, *, deterministic: bool, server: str = ""
) -> Finding:
    """Streamed reasoning and content join into the non-streaming ones (when the request is
    deterministic: temperature 0 and a fixed seed); otherwise the structure must match."""
    expected = {"reasoning": _norm(plain.reasoning)[:200], "content": _norm(plain.content)[:200]}
    measured = {
        "reasoning": _norm(streamed.reasoning)[:200],
        "content": _norm(streamed.content)[:200],
    }
    evidence = {
        **{f"non-streaming {k}": v for k, v in plain.exchange.evidence().items()},
        **{f"streaming {k}": v for k, v in streamed.evidence(*NEEDLES).items()},
    }
    prefix = f"{server}: " if server else ""
    shape = (
        [bool(_norm(t.reasoning)) for t in (plain, streamed)],
        [bool(_norm(t.content)) for t in (plain, streamed)],
    )
    if shape[0][0] != shape[0][1] or shape[1][0] != shape[1][1]:
        return Finding.failed(
            measured,
            expected,
            message=(
                f"{prefix}streamed reasoning/content: the stream has reasoning={shape[0][1]}, "
                f"content={shape[1][1]} but the non-streaming answer has reasoning={shape[0][0]}, "
                f"content={shape[1][0]}: the streaming reasoning parser splits differently; "
                f"{FIX_UPGRADE}"
            ),
            evidence=evidence,
        )
    if not deterministic:
        return Finding.passed(
            measured,
            expected,
            message="streamed reasoning/content have "
            "the non-streaming structure (sampling on: texts not compared)",
        )
    same_r = _norm(plain.reasoning) == _norm(streamed.reasoning)
    same_c = _norm(plain.content) == _norm(streamed.content)
    if same_r and same_c:
        return Finding.passed(
            measured,
            expected,
            message="streamed reasoning and content join into the non-streaming texts",
        )
    joined_plain = _norm((plain.reasoning or "") + " " + (plain.content or ""))
    joined_stream = _norm((streamed.reasoning or "") + " " + (streamed.content or ""))
    if joined_plain == joined_stream:
        return Finding.failed(
            measured,
            expected,
            message=(
                f"{prefix}streamed reasoning/content: the same text is split differently "
                f"(streamed reasoning {len(_norm(streamed.reasoning))} chars vs "
                f"{len(_norm(plain.reasoning))} non-streaming): the streaming reasoning parser "
                f"moves text between reasoning and content; {FIX_UPGRADE}"
            ),
            evidence=evidence,
        )
    at = next(
        (i for i, (a, b) in enumerate(zip(joined_plain, joined_stream, strict=False)) if a != b),
        min(len(joined_plain), len(joined_stream)),
    )
    return Finding.warned(
        measured,
        expected,
        message=(
            f"{prefix}streamed text diverges from the non-streaming answer at character {at} "
            f"although temperature is 0 with a fixed seed: {short(joined_stream[at : at + 40])} vs "
            f"{short(joined_plain[at : at + 40])}; the model is not deterministic here, so the "
            "texts cannot be compared (structure matches)"
        ),
        evidence=evidence,
    )


def check_reasoning_then_tool(turn: Turn, req: ToolRequest, *, server: str = "") -> Finding:
    """A thinking model asked to use a tool: reasoning first, then valid ``tool_calls``."""
    parts = [check_reasoning(turn, server=""), check_tool_calls(turn, req, server="")]
    if turn.streamed:
        parts.append(check_order(turn))
    failed = [f for f in parts if f.level == "fail"]
    measured = {**_measured(turn), "calls": [c.name for c in turn.tool_calls]}
    expected = {"reasoning": "non-empty", "then": "tool_calls", "finish_reason": "tool_calls"}
    if failed:
        prefix = f"{server}: " if server else ""
        return Finding.failed(
            measured,
            expected,
            message=f"{prefix}reasoning then tool call: " + " | ".join(f.message for f in failed),
            evidence=turn.evidence(*NEEDLES),
        )
    return Finding.passed(
        measured,
        expected,
        message=f"reasoning ({turn.reasoning_field}) "
        f"then {len(turn.tool_calls)} tool call(s) ({turn.label})",
    )
