"""Synchronous client the serving checks use: one request -> one ``Turn`` (or a
``ServingError`` whose message and evidence say what went wrong)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

import httpx

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.access.body import Body
from pytest_spark.access.body import get as capped_get
from pytest_spark.serving.client.evidence import Exchange
from pytest_spark.serving.client.prefetch import Planned, Prefetch
from pytest_spark.serving.client.stream import (
    Reply,
    ServingError,
    StreamResult,
    post_json,
    stream_chat,
)
from pytest_spark.serving.client.turn import Turn, from_response, from_stream

CHAT_PATH = "/v1/chat/completions"


class ServingClient:
    """Chat completions against one endpoint, streaming or not, with bounded time."""

    def __init__(self, api: ApiEndpoint, *, timeout: float, idle_timeout: float) -> None:
        self.api = api
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self._http = api.client()

    @property
    def server(self) -> str:
        """How failure messages name the endpoint: ``MODEL at URL``."""
        return f"{self.api.model} at {self.api.base_url}"

    def body(self, messages: list[dict[str, Any]] | str, **params: Any) -> dict[str, Any]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return {"model": self.api.model, "messages": messages, **params}

    def chat(self, body: dict[str, Any]) -> Turn:
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        reply = post_json(self._http, CHAT_PATH, body, timeout=self.timeout)
        return from_response(reply.data, reply.exchange)

    def chat_stream(self, body: dict[str, Any]) -> Turn:
        return from_stream(self.stream(body))

    def stream(self, body: dict[str, Any]) -> StreamResult:
        """A streamed chat completion as it came (chunks with their arrival times)."""
        body = {**body, "stream": True}
        return stream_chat(
            self._http, CHAT_PATH, body, timeout=self.timeout, idle_timeout=self.idle_timeout
        )

    def post(self, path: str, body: dict[str, Any]) -> Reply:
        """POST a JSON body to another endpoint (``/tokenize``); a ServingError otherwise."""
        return post_json(self._http, path, body, timeout=self.timeout)

    def turn(self, body: dict[str, Any], streamed: bool) -> Turn:
        return self.chat_stream(body) if streamed else self.chat(body)

    def get(self, path: str) -> Body:
        """A GET, its body read up to ``MAX_BODY_BYTES`` (``cut`` says there was more)."""
        try:
            return capped_get(self._http, path, timeout=self.idle_timeout)
        except httpx.HTTPError as exc:
            raise ServingError(
                "transport",
                f"GET {self.api.base_url}{path}: {type(exc).__name__}: {exc}",
                Exchange("GET", self.api.base_url + path),
            ) from None

    def close(self) -> None:
        self._http.close()


class TurnCache:
    """Sends each distinct request once and keeps its answer, or the ``ServingError`` it
    raised, under a key: the checks that read one turn (a streamed answer compared with
    the plain one, several verdicts on one reply) share a single request. With a
    ``Prefetch``, :meth:`plan` sends a request ahead (on the pool, beside the other
    functional checks' planned ones) and :meth:`turn` waits for its answer; ``client`` is
    anything with ``turn(body, streamed)`` (the raw client, the openai SDK's)."""

    def __init__(self, client: Any, prefetch: Prefetch | None = None) -> None:
        self.client = client
        self.prefetch = prefetch
        self._turns: dict[Hashable, Turn | ServingError] = {}
        self._planned = Planned()
        self._lock = threading.Lock()

    def _ask(self, body: dict[str, Any], streamed: bool) -> Turn | ServingError:
        try:
            turn: Turn = self.client.turn(body, streamed)
        except ServingError as exc:
            return exc
        return turn

    def plan(self, key: Hashable, body: Callable[[], dict[str, Any]], streamed: bool) -> None:
        """Send this request ahead, if there is a pool and it was not asked yet."""
        if self.prefetch is None or not self.prefetch.concurrent:
            return
        with self._lock:
            if key in self._turns:
                return
        made = body()
        self._planned.plan(key, self.prefetch, lambda: self._ask(made, streamed))

    def turn(self, key: Hashable, body: Callable[[], dict[str, Any]], streamed: bool) -> Turn:
        with self._lock:
            got = self._turns.get(key)
        if got is None:
            future = self._planned.take(key)
            planned = future.result() if future is not None else None
            assert planned is None or isinstance(planned, (Turn, ServingError))
            if planned is None:
                answer = self._ask(body(), streamed)
            elif isinstance(planned, ServingError) and self.prefetch is not None:
                # out of time beside the others: judged on its answer alone
                answer = self.prefetch.alone_again(planned, lambda: self._ask(body(), streamed))
            else:
                answer = planned
            with self._lock:
                got = self._turns.setdefault(key, answer)
        if isinstance(got, ServingError):
            raise got
        return got
