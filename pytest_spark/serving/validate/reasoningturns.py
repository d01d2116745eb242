"""The reasoning questions, asked once per session and shared by the raw reasoning checks
(tests_e2e/test_reasoning.py) and the SDK's (tests_e2e/test_via_sdk.py). Deterministic
(temperature 0, a fixed seed), so a streamed answer can be compared with its plain twin."""

from __future__ import annotations

from typing import Any

from pytest_spark.serving.client.chat import ServingClient, TurnCache
from pytest_spark.serving.client.prefetch import Prefetch
from pytest_spark.serving.client.turn import Turn
from pytest_spark.settings.resolve import Settings

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


class ReasoningTurns:
    """Asks each (kind, streaming) reasoning question once and keeps the answer: kind
    ``thinking`` (the question), ``no-thinking`` (enable_thinking false), ``truncated``
    (max_tokens inside the thinking), ``tool`` (reasoning then a tool call)."""

    def __init__(
        self,
        client: ServingClient,
        settings: Settings,
        no_parser: str | None = None,
        prefetch: Prefetch | None = None,
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
        self.cache = TurnCache(client, prefetch)

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

    def plan(self, kind: str, streamed: bool) -> None:
        self.cache.plan((kind, streamed), lambda: self.body(kind), streamed)
