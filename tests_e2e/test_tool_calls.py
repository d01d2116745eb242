"""Tool calls end to end: the server's --tool-call-parser turns the model's calls into
``tool_calls`` (auto, required, named; non-streaming and streaming; parallel calls).

Runs against any OpenAI-compatible server (``--spark-api-url``). Every failure names the
behaviour that broke and carries the request and the response or stream excerpt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pytest_spark.api import ApiEndpoint
from pytest_spark.checks.base import Finding
from pytest_spark.fixtures import SparkCheck
from pytest_spark.serving import (
    MISCONFIGURED_TOOLS,
    ServingClient,
    ServingError,
    ToolRequest,
    Turn,
    TurnCache,
    auto_declined,
    check_auto_refused,
    check_tool_calls,
    compare_arguments,
)
from pytest_spark.settings import Settings

pytestmark = pytest.mark.tool_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city, for a number of days",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "days": {"type": "integer", "description": "Number of forecast days"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "days"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
TOOLS = (WEATHER, TIME)
ONE_CALL = "What is the weather in Paris for the next 2 days? Use the get_weather tool."
TWO_CALLS = (
    "What is the weather in Paris and in Tokyo for the next 3 days? "
    "Call get_weather once for each city, in parallel."
)
SEED = 1234


class ToolTurns:
    """Asks each question once per (mode, streaming) and remembers the answer, so the
    streaming test can compare with the non-streaming one."""

    def __init__(self, client: ServingClient, settings: Settings) -> None:
        self.client = client
        profile = settings.profile
        self.max_tokens = int(profile.get("tool_calls.max_tokens", 1024))
        self.strict_streaming = bool(profile.get("tool_calls.require_streamed_arguments", True))
        self.expected = bool(profile.get("tool_calls.expected", True))
        # False for a model too small to choose a tool by itself (real vLLM on CPU): under
        # auto a plain-text answer is then the model's choice, skipped with the reason.
        self.auto_emits_calls = bool(profile.get("tool_calls.auto_emits_calls", True))
        self.profile = profile.name
        self.cache = TurnCache(client)

    def request(self, mode: str, streamed: bool, parallel: bool = False) -> ToolRequest:
        names = ("get_weather", "get_weather") if parallel else ("get_weather",)
        return ToolRequest(
            TOOLS,
            mode,
            names,
            streamed,  # type: ignore[arg-type]
            self.strict_streaming,
        )

    def body(self, mode: str, parallel: bool) -> dict[str, Any]:
        choice: Any = mode
        if mode == "named":
            choice = {"type": "function", "function": {"name": "get_weather"}}
        return self.client.body(
            TWO_CALLS if parallel else ONE_CALL,
            tools=list(TOOLS),
            tool_choice=choice,
            temperature=0,
            seed=SEED,
            max_tokens=self.max_tokens,
        )

    def turn(self, mode: str, streamed: bool, parallel: bool = False) -> Turn:
        key = (mode, streamed, parallel)
        return self.cache.turn(key, lambda: self.body(mode, parallel), streamed)


@pytest.fixture(scope="module")
def tool_turns(spark_api: ApiEndpoint, spark_settings: Settings) -> Iterator[ToolTurns]:
    timeout = float(spark_settings.profile.get("tool_calls.request_timeout_s", 180.0))
    client = ServingClient(spark_api, timeout=timeout, idle_timeout=spark_api.timeout)
    try:
        yield ToolTurns(client, spark_settings)
    finally:
        client.close()


def _ask(
    turns: ToolTurns, spark_check: SparkCheck, mode: str, streamed: bool, parallel: bool = False
) -> Turn:
    """The turn, or the right verdict when there is none: misconfiguration (skip here,
    reported once by test_auto_tool_choice_enabled) or a request failure (fail)."""
    req = turns.request(mode, streamed, parallel)
    try:
        return turns.turn(mode, streamed, parallel)
    except ServingError as exc:
        if exc.error is not None and exc.status is not None:
            refused = check_auto_refused(exc.status, exc.error, exc.exchange.evidence())
            if refused is not None:
                pytest.skip(
                    f"{MISCONFIGURED_TOOLS}: tool_choice=auto refused with HTTP 400 "
                    "(reported by test_auto_tool_choice_enabled)"
                )
        spark_check.require(exc.finding(f"{turns.client.server}: {req.label}"))
        raise AssertionError("unreachable") from exc


def _skip_if_model_declined(turns: ToolTurns, turn: Turn, req: ToolRequest) -> None:
    """Under auto the model decides: where the profile says this model does not emit tool
    calls, a plain-text answer (no markup, no JSON call: not a parser failure) is skipped
    with the reason. Raw markup in content still fails."""
    if turns.auto_emits_calls:
        return
    why = auto_declined(turn, req)
    if why is not None:
        pytest.skip(
            f"model does not emit tool calls under auto: {why}; profile {turns.profile} has "
            "tool_calls.auto_emits_calls = false"
        )


def test_auto_tool_choice_enabled(tool_turns: ToolTurns, spark_check: SparkCheck) -> None:
    """tool_choice auto is accepted: a 400 about the server flags is a misconfiguration
    (not a model failure) and says which flags are missing."""
    try:
        tool_turns.turn("auto", False)
    except ServingError as exc:
        if exc.error is not None:
            spark_check.attach("error_body_shape", exc.error.shape)
        refused = (
            check_auto_refused(
                exc.status, exc.error, exc.exchange.evidence(), server=tool_turns.client.server
            )
            if exc.error is not None and exc.status is not None
            else None
        )
        if refused is None:
            spark_check.require(exc.finding(f"{tool_turns.client.server}: tool_choice=auto"))
            return
        if not tool_turns.expected:
            spark_check.record(refused)
            pytest.skip(
                f"{MISCONFIGURED_TOOLS} (profile {tool_turns.profile} has "
                "tool_calls.expected = false)"
            )
        spark_check.require(refused)
        return
    spark_check.require(
        Finding.passed("accepted", "accepted", message="tool_choice=auto accepted by the server")
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("mode", ["auto", "required", "named"])
def test_tool_call(
    tool_turns: ToolTurns, spark_check: SparkCheck, mode: str, streamed: bool
) -> None:
    """One call of get_weather: type function, right name, arguments a JSON string valid
    against the schema (days an integer), finish_reason by mode, no markup in content;
    streamed: fragments join into the same JSON with stable ids and indexes."""
    req = tool_turns.request(mode, streamed)
    turn = _ask(tool_turns, spark_check, mode, streamed)
    _skip_if_model_declined(tool_turns, turn, req)
    spark_check.require(check_tool_calls(turn, req, server=tool_turns.client.server))
    if streamed:
        try:
            plain = tool_turns.turn(mode, False)
        except ServingError:
            return  # the non-streaming test reports it
        if check_tool_calls(plain, tool_turns.request(mode, False)).ok:
            spark_check.require(
                compare_arguments(plain, turn, req, server=tool_turns.client.server)
            )


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
def test_parallel_tool_calls(
    tool_turns: ToolTurns, spark_check: SparkCheck, streamed: bool
) -> None:
    """Two cities, one tool: two calls come back (parallel tool calls), each valid, with
    distinct ids and indexes 0 and 1."""
    req = tool_turns.request("auto", streamed, parallel=True)
    turn = _ask(tool_turns, spark_check, "auto", streamed, parallel=True)
    _skip_if_model_declined(tool_turns, turn, req)
    spark_check.require(check_tool_calls(turn, req, server=tool_turns.client.server))
