"""The canary chat completion, plain and streamed, each sent once per session (per xdist
worker): the wire verdicts (tests_e2e/test_readiness.py) judge its two answers, and a
dependent check whose own request broke on the wire asks it whether the wire itself is
broken (``causes.wire_cause``)."""

from __future__ import annotations

from typing import Any

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.client.chat import CHAT_PATH
from pytest_spark.serving.client.stream import (
    Reply,
    ServingError,
    StreamResult,
    post_json,
    stream_chat,
)

Outcome = Reply | StreamResult | ServingError
CANARY = {"max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "Say OK."}]}


class WireProbe:
    """Sends the canary (once per kind) and keeps what came back, or the ServingError."""

    def __init__(self, api: ApiEndpoint) -> None:
        self.api = api
        self._got: dict[bool, Outcome] = {}

    @property
    def server(self) -> str:
        """How failure messages name the endpoint: ``MODEL at URL``."""
        return f"{self.api.model} at {self.api.base_url}"

    def _send(self, streamed: bool) -> Outcome:
        body: dict[str, Any] = {"model": self.api.model, **CANARY}
        timeout = max(self.api.timeout, 60.0)
        try:
            with self.api.client() as client:
                if not streamed:
                    return post_json(client, CHAT_PATH, body, timeout=timeout)
                body["stream"] = True
                return stream_chat(
                    client, CHAT_PATH, body, timeout=timeout, idle_timeout=self.api.timeout
                )
        except ServingError as exc:
            return exc

    def outcome(self, streamed: bool) -> Outcome:
        if streamed not in self._got:
            self._got[streamed] = self._send(streamed)
        return self._got[streamed]

    def error(self, streamed: bool) -> ServingError | None:
        got = self.outcome(streamed)
        return got if isinstance(got, ServingError) else None
