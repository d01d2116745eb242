"""The tool-call questions the e2e checks ask, asked once per session and shared: the
tool-call checks and the reasoning-then-tool check read the same answers (so a model that
leaves its calls in content is found once, by one verdict)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark.infra.servecmd import ServerCommand
from pytest_spark.serving.client.chat import ServingClient, TurnCache
from pytest_spark.serving.client.prefetch import Prefetch
from pytest_spark.serving.client.stream import ServingError
from pytest_spark.serving.client.turn import Turn
from pytest_spark.serving.validate.tools import (
    Mode,
    ToolRequest,
    calls_in_content,
    unstreamed_arguments,
)
from pytest_spark.settings.resolve import Settings

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

    def __init__(
        self,
        client: ServingClient,
        settings: Settings,
        server: ServerCommand | None = None,
        prefetch: Prefetch | None = None,
    ) -> None:
        self.client = client
        # What the server was started with (its --tool-call-parser), when it could be read.
        self.server_command = server
        profile = settings.profile
        self.max_tokens = profile.tool_calls.max_tokens
        self.strict_streaming = profile.tool_calls.require_streamed_arguments
        self.expected = profile.tool_calls.expected
        # False for a model too small to choose a tool by itself (real vLLM on CPU): under
        # auto a plain-text answer is then the model's choice, skipped with the reason.
        self.auto_emits_calls = profile.tool_calls.auto_emits_calls
        self.profile = profile.name
        self.cache = TurnCache(client, prefetch)

    def request(self, mode: Mode, streamed: bool, parallel: bool = False) -> ToolRequest:
        names = ("get_weather", "get_weather") if parallel else ("get_weather",)
        return ToolRequest(
            TOOLS,
            mode,
            names,
            streamed,
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

    def plan(self, mode: str, streamed: bool, parallel: bool = False) -> None:
        """Send :meth:`turn`'s request ahead (the module's checks read it later)."""
        key = (mode, streamed, parallel)
        self.cache.plan(key, lambda: self.body(mode, parallel), streamed)

    @property
    def parser(self) -> str | None:
        cmd = self.server_command
        return cmd.args.tool_call_parser if cmd is not None else None

    def calls_in_content(self) -> str | None:
        """Whether the model leaves its calls in content under auto (the verdict's turn:
        auto, non-streaming, one call): the formats of the model and of the parser, or
        None when the call was parsed (or the request failed: its check reports that)."""
        try:
            turn = self.turn("auto", False)
        except ServingError:
            return None
        return calls_in_content(turn, self.request("auto", False), parser=self.parser)


# The one verdict on a model whose calls stay in content under auto; the other auto checks
# skip citing it (tests_e2e/test_reasoning.py's reasoning-then-tool check too).
CONTENT_VERDICT = "test_tool_call[auto-plain]"


def content_verdict_runs(session: pytest.Session) -> bool:
    return any(item.name == CONTENT_VERDICT for item in session.items)


def cited_calls_in_content(
    request: pytest.FixtureRequest, turns: ToolTurns, turn: Turn, req: ToolRequest
) -> str | None:
    """The skip reason of an auto check whose call stayed in content when the verdict's
    turn shows the same (one failure, there); None otherwise (this check reports it)."""
    if req.mode != "auto" or request.node.name == CONTENT_VERDICT:
        return None
    if calls_in_content(turn, req) is None or not content_verdict_runs(request.session):
        return None
    leak = turns.calls_in_content()
    return None if leak is None else f"{leak} ({CONTENT_VERDICT} has the evidence)"


# The one verdict on streamed tool-call arguments that never come: the first streamed call
# (auto). The other streamed calls (required, named, parallel, reasoning then tool) that
# lose theirs the same way skip citing it.
STREAM_ARGS_VERDICT = "test_tool_call[auto-stream]"


def cited_unstreamed_arguments(
    request: pytest.FixtureRequest, turns: ToolTurns, turn: Turn
) -> str | None:
    """The skip reason of a streamed check whose call arguments never came when the
    verdict's turn (auto, streamed, one call) lost them too (one failure, there); None
    otherwise (this check reports it)."""
    if request.node.name == STREAM_ARGS_VERDICT or unstreamed_arguments(turn) is None:
        return None
    if not any(item.name == STREAM_ARGS_VERDICT for item in request.session.items):
        return None
    try:
        lost = unstreamed_arguments(turns.turn("auto", True))
    except ServingError:
        return None
    return None if lost is None else f"{lost} ({STREAM_ARGS_VERDICT} has the evidence)"
