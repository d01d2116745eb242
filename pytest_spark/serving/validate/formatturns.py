"""The structured-output questions, asked once per session and shared by the raw checks
(tests_e2e/test_structured_output.py) and the SDK's (tests_e2e/test_via_sdk.py); and the
one verdict on a server that ignores ``response_format``."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark.serving.client.chat import ServingClient, TurnCache
from pytest_spark.serving.client.prefetch import Prefetch
from pytest_spark.serving.client.stream import ServingError
from pytest_spark.serving.client.turn import Turn
from pytest_spark.serving.validate.causes import cited_verdict
from pytest_spark.serving.validate.structured import (
    QUESTION,
    FormatKind,
    FormatRequest,
    check_structured,
    ignored,
    reasoning_leak,
    request_for,
)
from pytest_spark.settings.resolve import Settings

# The one verdict on response_format ignored: json_schema, non-streaming. The other
# structured checks whose own answer is not JSON either skip citing it.
IGNORED_VERDICT = "test_structured_output[json_schema-plain]"


class FormatTurns:
    """Asks each (format, streaming) question once and keeps the answer."""

    def __init__(
        self, client: ServingClient, settings: Settings, prefetch: Prefetch | None = None
    ) -> None:
        section = settings.profile.structured_output
        self.client = client
        self.expected = section.expected
        self.max_tokens = section.max_tokens
        self.profile = settings.profile.name
        self.cache = TurnCache(client, prefetch)

    def request(self, kind: FormatKind, streamed: bool) -> FormatRequest:
        return request_for(kind, streamed)

    def body(self, kind: FormatKind) -> dict[str, Any]:
        return self.client.body(QUESTION, **request_for(kind, False).params(self.max_tokens))

    def turn(self, kind: FormatKind, streamed: bool) -> Turn:
        return self.cache.turn((kind, streamed), lambda: self.body(kind), streamed)

    def plan(self, kind: FormatKind, streamed: bool) -> None:
        self.cache.plan((kind, streamed), lambda: self.body(kind), streamed)

    def skip_unless_expected(self) -> None:
        if not self.expected:
            pytest.skip(
                f"profile {self.profile} has structured_output.expected = false: the server "
                "is not asked to honour response_format"
            )


# The one verdict on a reasoning parser that leaves the thinking in content.
SEPARATION_VERDICT = "test_reasoning_separated[plain]"
DISABLED_VERDICT = "test_thinking_disabled[plain]"  # an answer in reasoning with thinking off


def cited_reasoning_leak(request: pytest.FixtureRequest, turn: Turn, label: str) -> str | None:
    """The skip reason of a structured check whose own answer shows the model's thinking
    left in content before the JSON, when the reasoning verdict runs in this session (it
    reports the parser once); None otherwise."""
    leak = reasoning_leak(turn)
    if leak is None or not any(item.name == SEPARATION_VERDICT for item in request.session.items):
        return None
    return f"{label}: {leak} ({SEPARATION_VERDICT} has the evidence)"


def cited_ignored(request: pytest.FixtureRequest, turns: FormatTurns, turn: Turn) -> str | None:
    """The skip reason of a structured check whose answer is not JSON when the verdict's
    own answer (json_schema, non-streaming) shows the same (one failure, there)."""
    if request.node.name == IGNORED_VERDICT or not ignored(turn):
        return None
    if not any(item.name == IGNORED_VERDICT for item in request.session.items):
        return None
    try:
        verdict_turn = turns.turn("json_schema", False)
    except ServingError:
        return None
    if not ignored(verdict_turn):
        return None
    here = f"{turns.client.server}: {request.node.name}"
    finding = check_structured(verdict_turn, request_for("json_schema", False))
    return cited_verdict(IGNORED_VERDICT, here, finding)
