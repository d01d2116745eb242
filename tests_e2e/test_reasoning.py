"""Reasoning end to end: the server's --reasoning-parser keeps the model's thinking out of
``content`` (in ``reasoning`` or ``reasoning_content``, whichever the version sends).

Whether the deployment must separate reasoning comes from the profile
(``reasoning.expected``): where it must, a missing reasoning field is the bug; where it
need not, the checks skip with the reason. Requests are deterministic (temperature 0,
fixed seed) so streamed and non-streamed answers can be compared.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_spark import Finding, Settings, SparkCheck, verdict_in_session
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.servecmd import ServerCommand
from pytest_spark.infra.server.check import (
    check_reasoning_parser,
)
from pytest_spark.serving import (
    MISCONFIGURED_TOOLS,
    NO_REASONING_FIELD,
    ServingError,
    ToolRequest,
    Turn,
    check_auto_refused,
    check_order,
    check_reasoning,
    check_reasoning_then_tool,
    check_thinking_disabled,
    check_tool_calls,
    check_truncated,
    compare_stream,
)
from pytest_spark.serving.client.prefetch import confirmed_alone, item_params
from pytest_spark.serving.validate.accuracyprobe import cited_wrong_model
from pytest_spark.serving.validate.causes import cited_verdict
from pytest_spark.serving.validate.formatturns import DISABLED_VERDICT
from pytest_spark.serving.validate.reasoningturns import WEATHER, ReasoningTurns
from pytest_spark.serving.validate.toolturns import (
    cited_calls_in_content,
    cited_unstreamed_arguments,
)

pytestmark = pytest.mark.reasoning

STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])


@pytest.fixture
def turns(reasoning_turns: ReasoningTurns) -> ReasoningTurns:
    """The session's reasoning questions (tests_e2e/conftest.py: shared with the SDK's)."""
    return reasoning_turns


def _ask(
    request: pytest.FixtureRequest,
    turns: ReasoningTurns,
    spark_check: SparkCheck,
    kind: str,
    streamed: bool,
) -> Turn:
    try:
        return turns.turn(kind, streamed)
    except ServingError as exc:
        if (
            kind == "tool"
            and exc.error is not None
            and exc.status is not None
            and check_auto_refused(exc.status, exc.error, {}) is not None
        ):
            pytest.skip(
                f"{MISCONFIGURED_TOOLS}: tool_choice=auto refused with HTTP 400 "
                "(reported by test_tool_calls.py::test_auto_tool_choice_enabled)"
            )
        label = "streaming" if streamed else "non-streaming"
        what = f"{LABELS[kind]} ({label}): {exc.message}"
        cited = request.getfixturevalue("wire_cited")(exc.kind, what)
        if cited is not None:
            pytest.skip(cited)  # the wire verdict's failure (stream framing, JSON body)
        spark_check.require(exc.finding(f"{turns.client.server}: {LABELS[kind]} ({label})"))
        raise AssertionError("unreachable") from exc


LABELS = {
    "thinking": "reasoning",
    "no-thinking": "enable_thinking false",
    "truncated": "truncation inside thinking",
    "tool": "reasoning then tool call",
}


# Which turn each check reads (besides the verdicts' and _needs_reasoning's plain thinking).
KIND_OF = {
    "test_reasoning_separated": "thinking",
    "test_thinking_disabled": "no-thinking",
    "test_truncated_inside_thinking": "truncated",
    "test_reasoning_then_tool_call": "tool",
}


def plan_ahead(request: pytest.FixtureRequest, item: pytest.Item) -> None:
    """The questions ``item`` will read, sent ahead (pytest_spark.serving.client.prefetch)."""
    kind = KIND_OF.get(getattr(item, "originalname", item.name))
    turns: ReasoningTurns = request.getfixturevalue("reasoning_turns")
    if kind is None or turns.no_parser is not None:
        return
    turns.plan("thinking", False)  # every check may read it (its verdict, the skip)
    turns.plan(kind, item_params(item)["streamed"])
    turns.plan(kind, False)  # a streamed check's verdict is its plain twin


def _needs_reasoning(turns: ReasoningTurns, turn: Turn | None = None) -> None:
    """Skip, with the reason, where the profile does not expect a reasoning parser and the
    server shows none; where it does expect one and the server was started without it,
    skip citing test_server_has_reasoning_parser (one failure, not one per check)."""
    if turns.no_parser is not None:
        pytest.skip(turns.no_parser)
    if turns.expected:
        return
    if turn is None:
        try:
            turn = turns.turn("thinking", False)
        except ServingError:
            return  # test_reasoning_separated reports it
    if (turn.reasoning or "").strip() or "</think>" in (turn.content or ""):
        return
    pytest.skip(f"{NO_REASONING_FIELD} (profile {turns.profile} has reasoning.expected = false)")


def _full_reasoning(turns: ReasoningTurns) -> str | None:
    try:
        return turns.turn("thinking", False).reasoning
    except ServingError:
        return None


def test_server_has_reasoning_parser(
    spark_api: ApiEndpoint,
    spark_server_command: ServerCommand | None,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """The server was started with --reasoning-parser where the profile expects reasoning
    (read from the container's command, the vllm serve process or vLLM's non-default args
    line); the reasoning checks below skip citing this one when it fails."""
    profile = spark_settings.profile
    result = check_reasoning_parser(
        spark_server_command,
        expected=profile.reasoning.expected,
        profile=profile.name,
    )
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)


# The reasoning verdicts: the non-streaming answer of a behaviour. Where one fails, the
# checks that fail on the same parser (its streamed twin, the truncation and the
# reasoning-then-tool checks on separation) skip citing it: one broken parser, one failure.
SEPARATION_VERDICT = "test_reasoning_separated[plain]"
TRUNCATED_VERDICT = "test_truncated_inside_thinking[plain]"


def _verdict_check(turns: ReasoningTurns, verdict: str) -> Callable[[], Finding]:
    """How the verdict judges its own (cached, non-streaming) answer."""
    if verdict == SEPARATION_VERDICT:
        return lambda: check_reasoning(turns.turn("thinking", False))
    if verdict == DISABLED_VERDICT:
        return lambda: check_thinking_disabled(turns.turn("no-thinking", False))
    return lambda: check_truncated(
        turns.turn("truncated", False), turns.cut_tokens, full_reasoning=_full_reasoning(turns)
    )


def _skip_if_verdict_failed(
    request: pytest.FixtureRequest,
    turns: ReasoningTurns,
    finding: Finding,
    here: str,
    *verdicts: str,
) -> None:
    """A failed ``finding`` whose verdict (the first of ``verdicts`` that runs in this
    session, is not this check, and fails on its own answer) owns it: skip citing it."""
    cited = _cited_verdict(request, turns, finding, here, *verdicts)
    if cited is not None:
        pytest.skip(cited)


def _cited_verdict(
    request: pytest.FixtureRequest,
    turns: ReasoningTurns,
    finding: Finding,
    here: str,
    *verdicts: str,
) -> str | None:
    if finding.ok:
        return None
    for verdict in verdicts:
        if request.node.name == verdict or not verdict_in_session(request.session, verdict):
            continue
        try:
            owner = _verdict_check(turns, verdict)()
        except ServingError:
            continue  # its request failed: that check reports it
        if not owner.ok:
            return cited_verdict(verdict, here, owner)
    return None


@STREAMED
def test_reasoning_separated(
    request: pytest.FixtureRequest, turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """Thinking on: reasoning present and non-empty (field recorded), no <think>/</think>
    in content, the answer in content; streamed: reasoning deltas first, and the stream
    joins into the non-streaming texts. The plain one is the separation verdict."""
    turn = _ask(request, turns, spark_check, "thinking", streamed)
    _needs_reasoning(turns, turn)
    spark_check.attach("reasoning_field", turn.reasoning_field)
    here = f"reasoning ({turn.label})"
    finding = check_reasoning(turn, server=turns.client.server)
    _skip_if_verdict_failed(request, turns, finding, here, SEPARATION_VERDICT)
    spark_check.require(finding)
    if turn.finish_reason == "length" and not (turn.content or "").strip():
        spark_check.require(
            Finding.warned(
                finding.measured,
                finding.expected,
                message=f"reasoning ({turn.label}): thinking "
                f"did not finish within max_tokens={turns.max_tokens}, so the answer in content "
                "was not checked; raise reasoning.max_tokens",
                evidence=turn.exchange.evidence(),
            )
        )
    if streamed:
        order = check_order(turn, server=turns.client.server)
        _skip_if_verdict_failed(request, turns, order, here, SEPARATION_VERDICT)
        spark_check.require(order)
        try:
            plain = turns.turn("thinking", False)
        except ServingError:
            return  # reported by the non-streaming test
        server = turns.client.server
        same = confirmed_alone(
            request.getfixturevalue("serving_prefetch"),
            compare_stream(plain, turn, deterministic=True, server=server),
            lambda: compare_stream(
                turns.client.turn(turns.body("thinking"), False),
                turns.client.turn(turns.body("thinking"), True),
                deterministic=True,
                server=server,
            ),
        )
        _skip_if_verdict_failed(request, turns, same, here, SEPARATION_VERDICT)
        if not same.ok and (wrong := cited_wrong_model(request, here, same)):
            pytest.skip(wrong)
        spark_check.require(same)


@STREAMED
def test_thinking_disabled(
    request: pytest.FixtureRequest, turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """chat_template_kwargs enable_thinking false: no reasoning, the answer in content. The
    plain one is the verdict; the streamed one skips citing it when it fails the same."""
    _needs_reasoning(turns)
    turn = _ask(request, turns, spark_check, "no-thinking", streamed)
    finding = check_thinking_disabled(turn, server=turns.client.server)
    here = f"enable_thinking false ({turn.label})"
    _skip_if_verdict_failed(request, turns, finding, here, DISABLED_VERDICT)
    spark_check.require(finding)


@STREAMED
def test_truncated_inside_thinking(
    request: pytest.FixtureRequest, turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """Cut by max_tokens before the end of thinking: finish_reason length, reasoning only,
    nothing leaked into content. A parser that does not separate reasoning at all fails
    here too: then this skips citing the separation verdict."""
    _needs_reasoning(turns)
    turn = _ask(request, turns, spark_check, "truncated", streamed)
    finding = check_truncated(
        turn, turns.cut_tokens, full_reasoning=_full_reasoning(turns), server=turns.client.server
    )
    here = f"truncation inside thinking ({turn.label})"
    _skip_if_verdict_failed(request, turns, finding, here, SEPARATION_VERDICT, TRUNCATED_VERDICT)
    spark_check.require(finding)


@STREAMED
def test_reasoning_then_tool_call(
    request: pytest.FixtureRequest, turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """A thinking model asked to use a tool: reasoning first, then a valid tool call. A
    part that fails as its verdict does (separation; calls left in content or arguments
    never streamed) is that verdict's: when every failed part is, this skips citing them."""
    _needs_reasoning(turns)
    if turns.no_tools is not None:
        pytest.skip(turns.no_tools)
    turn = _ask(request, turns, spark_check, "tool", streamed)
    req = ToolRequest((WEATHER,), "auto", ("get_weather",), streamed)
    finding = check_reasoning_then_tool(turn, req, server=turns.client.server)
    if not finding.ok:
        here = f"reasoning then tool call ({turn.label})"
        reasons = []
        for part in (check_reasoning(turn), *([check_order(turn)] if streamed else [])):
            if not part.ok:
                reasons.append(_cited_verdict(request, turns, part, here, SEPARATION_VERDICT))
        tools = check_tool_calls(turn, req)
        if not tools.ok:
            tool_turns = request.getfixturevalue("tool_turns")
            reasons.append(
                cited_calls_in_content(request, tool_turns, turn, req)
                or cited_unstreamed_arguments(request, tool_turns, turn)
                or cited_wrong_model(request, here, tools)
            )
        if reasons and all(reasons):
            pytest.skip("; ".join(dict.fromkeys(r for r in reasons if r)))
    spark_check.require(finding)
