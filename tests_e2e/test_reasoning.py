"""Reasoning end to end: the server's --reasoning-parser keeps the model's thinking out of
``content`` (in ``reasoning`` or ``reasoning_content``, whichever the version sends).

Whether the deployment must separate reasoning comes from the profile
(``reasoning.expected``): where it must, a missing reasoning field is the bug; where it
need not, the checks skip with the reason. Requests are deterministic (temperature 0,
fixed seed) so streamed and non-streamed answers can be compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.checks.base import Finding
from pytest_spark.checks.preflight import Skip
from pytest_spark.checks.server import (
    REASONING_VERDICT,
    TOOLS_VERDICT,
    check_reasoning_parser,
    missing_reasoning_parser,
    missing_tool_parser,
)
from pytest_spark.facts.server import ServerCommand
from pytest_spark.fixtures import SparkCheck, verdict_in_session
from pytest_spark.serving import (
    MISCONFIGURED_TOOLS,
    NO_REASONING_FIELD,
    ServingClient,
    ServingError,
    ToolRequest,
    Turn,
    TurnCache,
    check_auto_refused,
    check_order,
    check_reasoning,
    check_reasoning_then_tool,
    check_thinking_disabled,
    check_truncated,
    compare_stream,
)
from pytest_spark.serving.toolturns import cited_calls_in_content
from pytest_spark.settings.resolve import Settings

pytestmark = pytest.mark.reasoning

QUESTION = "What is 17 + 25? Think it through, then reply with the number only."
TOOL_QUESTION = "What is the weather in Paris for the next 2 days? Use the get_weather tool."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city, for a number of days",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
SEED = 1234
STREAMED = pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])


class ReasoningTurns:
    def __init__(
        self, client: ServingClient, settings: Settings, no_parser: str | None = None
    ) -> None:
        profile = settings.profile
        self.client = client
        self.expected = profile.reasoning.expected
        # Why every reasoning check skips: the server has no --reasoning-parser and
        # test_server_has_reasoning_parser reports it, quoting the command line.
        self.no_parser = no_parser
        self.no_tools: str | None = None  # the same for the tool flags (reasoning then tool)
        self.max_tokens = profile.reasoning.max_tokens
        self.cut_tokens = profile.reasoning.truncate_tokens
        self.profile = profile.name
        self.cache = TurnCache(client)

    def body(self, kind: str) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": 0, "seed": SEED, "max_tokens": self.max_tokens}
        question = QUESTION
        if kind == "no-thinking":
            params["chat_template_kwargs"] = {"enable_thinking": False}
        elif kind == "truncated":
            params["max_tokens"] = self.cut_tokens
        elif kind == "tool":
            question = TOOL_QUESTION
            params.update(tools=[WEATHER], tool_choice="auto")
        return self.client.body(question, **params)

    def turn(self, kind: str, streamed: bool) -> Turn:
        return self.cache.turn((kind, streamed), lambda: self.body(kind), streamed)


@pytest.fixture(scope="module")
def turns(
    request: pytest.FixtureRequest,
    spark_api: ApiEndpoint,
    spark_settings: Settings,
    spark_server_command: ServerCommand | None,
) -> Iterator[ReasoningTurns]:
    timeout = spark_settings.profile.reasoning.request_timeout_s
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    expected = spark_settings.profile.reasoning.expected
    no_parser = missing_reasoning_parser(spark_server_command, expected=expected)
    if not verdict_in_session(request.session, REASONING_VERDICT):
        no_parser = None  # nothing else reports it: the checks below do
    reasoning = ReasoningTurns(client, spark_settings, no_parser)
    if verdict_in_session(request.session, TOOLS_VERDICT):
        tools_expected = spark_settings.profile.tool_calls.expected
        reasoning.no_tools = missing_tool_parser(spark_server_command, expected=tools_expected)
    try:
        yield reasoning
    finally:
        client.close()


def _ask(turns: ReasoningTurns, spark_check: SparkCheck, kind: str, streamed: bool) -> Turn:
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
        spark_check.require(exc.finding(f"{turns.client.server}: {LABELS[kind]} ({label})"))
        raise AssertionError("unreachable") from exc


LABELS = {
    "thinking": "reasoning",
    "no-thinking": "enable_thinking false",
    "truncated": "truncation inside thinking",
    "tool": "reasoning then tool call",
}


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


@STREAMED
def test_reasoning_separated(
    turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """Thinking on: reasoning present and non-empty (field recorded), no <think>/</think>
    in content, the answer in content; streamed: reasoning deltas first, and the stream
    joins into the non-streaming texts."""
    turn = _ask(turns, spark_check, "thinking", streamed)
    _needs_reasoning(turns, turn)
    spark_check.attach("reasoning_field", turn.reasoning_field)
    finding = spark_check.require(check_reasoning(turn, server=turns.client.server))
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
        spark_check.require(check_order(turn, server=turns.client.server))
        try:
            plain = turns.turn("thinking", False)
        except ServingError:
            return  # reported by the non-streaming test
        spark_check.require(
            compare_stream(plain, turn, deterministic=True, server=turns.client.server)
        )


@STREAMED
def test_thinking_disabled(turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool) -> None:
    """chat_template_kwargs enable_thinking false: no reasoning, the answer in content."""
    _needs_reasoning(turns)
    turn = _ask(turns, spark_check, "no-thinking", streamed)
    spark_check.require(check_thinking_disabled(turn, server=turns.client.server))


@STREAMED
def test_truncated_inside_thinking(
    turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """Cut by max_tokens before the end of thinking: finish_reason length, reasoning only,
    nothing leaked into content."""
    _needs_reasoning(turns)
    turn = _ask(turns, spark_check, "truncated", streamed)
    spark_check.require(
        check_truncated(
            turn,
            turns.cut_tokens,
            full_reasoning=_full_reasoning(turns),
            server=turns.client.server,
        )
    )


@STREAMED
def test_reasoning_then_tool_call(
    request: pytest.FixtureRequest, turns: ReasoningTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """A thinking model asked to use a tool: reasoning first, then a valid tool call."""
    _needs_reasoning(turns)
    if turns.no_tools is not None:
        pytest.skip(turns.no_tools)
    turn = _ask(turns, spark_check, "tool", streamed)
    req = ToolRequest((WEATHER,), "auto", ("get_weather",), streamed)
    finding = check_reasoning_then_tool(turn, req, server=turns.client.server)
    if not finding.ok:
        # The call left in content is the tool parser's failure: one verdict, there.
        cited = cited_calls_in_content(request, request.getfixturevalue("tool_turns"), turn, req)
        if cited is not None:
            pytest.skip(cited)
    spark_check.require(finding)
