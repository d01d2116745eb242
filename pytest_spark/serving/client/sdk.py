"""The ``openai`` SDK as the applications' client: one request through
``OpenAI().chat.completions.create`` -> one ``Turn`` built from the SDK's typed objects
(or a ``ServingError`` naming the field the SDK could not parse and quoting the bytes).

The client honours the suite's settings: the endpoint's base URL (the tunnel's, when the
suite tunnels), its API key, the request timeout, no retries (a retry would hide a
failure), and it is closed with its connections. Responses are validated strictly
(``_strict_response_validation``): the SDK's pydantic models check every field's type, so
a server whose answer the SDK cannot type fails here with the field's path, instead of an
application failing later on an attribute. Reasoning is not an OpenAI field: the SDK keeps
vLLM's ``reasoning`` / ``reasoning_content`` in ``model_extra``, which is where it is read.

A stream's typed chunks also go through the SDK's own accumulator,
``ChatCompletionStreamState`` (what ``client.chat.completions.stream()`` runs, and what its
docstring tells ``create(stream=True)`` users to feed): which tool calls it typed, which it
reported done with ``tool_calls.function.arguments.done``, and what its
``get_final_completion()`` holds (``SdkTurn.helper``). It types a call from its first
delta's ``type``, which OpenAI's chunk schema leaves optional: a server that omits it
streams valid bytes that applications on the helper never see as a call.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import openai
from openai.lib.streaming.chat import (
    ChatCompletionStreamState,
    FunctionToolCallArgumentsDoneEvent,
)

from pytest_spark.access.api import ApiEndpoint, tls_context
from pytest_spark.access.body import capped_transport
from pytest_spark.serving.client.evidence import Exchange, short
from pytest_spark.serving.client.stream import ServingError
from pytest_spark.serving.client.turn import Turn, assemble, from_response

if TYPE_CHECKING:  # a name for typing only (openai >= 1.99)
    from openai.types.chat import ChatCompletionToolUnionParam

CHAT_PATH = "/v1/chat/completions"
# create()'s own parameters; the rest of a body goes in extra_body (vLLM's extensions).
SDK_PARAMS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "seed",
        "max_tokens",
        "response_format",
        "stop",
        "top_p",
        "stream_options",
        "parallel_tool_calls",
    }
)
NO_KEY = "EMPTY"  # vLLM without --api-key ignores the key; the SDK insists on one


def sdk_version() -> str:
    return str(getattr(openai, "__version__", "?"))


@dataclass(frozen=True)
class HelperCall:
    """One streamed tool call as the SDK's stream helper left it, and its first delta as
    the SDK read it (``to_dict()``: the keys the server sent, nothing filled in)."""

    index: int
    type: str | None  # get_final_completion()'s tool_calls[i].type
    name: str | None
    arguments: str | None
    done: bool  # a tool_calls.function.arguments.done event came for it
    header: str  # the call's first delta, as JSON
    header_chunk: int  # its chunk number (1-based)


@dataclass(frozen=True)
class StreamHelper:
    """What ``ChatCompletionStreamState`` made of a stream: its calls, or why it broke."""

    calls: tuple[HelperCall, ...] = ()
    error: str | None = None


@dataclass
class SdkTurn(Turn):
    """A ``Turn`` read through the SDK; streamed, with what its stream helper made of it."""

    helper: StreamHelper | None = None


def stream_helper(chunks: list[Any], tools: list[dict[str, Any]]) -> StreamHelper:
    """Feed typed ``ChatCompletionChunk``s to the SDK's ``ChatCompletionStreamState`` as
    ``client.chat.completions.stream()`` does, and read back its tool calls."""
    params = cast("list[ChatCompletionToolUnionParam]", tools)  # the request's own tools
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(input_tools=params)
    done: set[int] = set()
    headers: dict[int, tuple[str, int]] = {}
    try:
        for n, chunk in enumerate(chunks, 1):
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or ():
                    headers.setdefault(tc.index, (_dumps(tc.to_dict()), n))
            for event in state.handle_chunk(chunk):
                if isinstance(event, FunctionToolCallArgumentsDoneEvent):
                    done.add(event.index)
        if not chunks:
            return StreamHelper()
        # get_final_completion() less its parsing (which refuses any finish_reason length)
        final = state.current_completion_snapshot
    except Exception as exc:  # the helper's own failure is the finding
        return StreamHelper(error=f"{type(exc).__name__}: {exc}")
    calls = []
    for choice in final.choices[:1]:
        for i, tc in enumerate(choice.message.tool_calls or ()):
            fn = getattr(tc, "function", None)
            header, at = headers.get(i, ("", 0))
            calls.append(
                HelperCall(
                    i,
                    getattr(tc, "type", None),
                    getattr(fn, "name", None),
                    getattr(fn, "arguments", None),
                    i in done,
                    header,
                    at,
                )
            )
    return StreamHelper(tuple(calls))


def sdk_http_client() -> Any:
    """The SDK's own HTTP client (``openai.DefaultHttpxClient``: its defaults, the shared TLS
    context) whose bodies are read up to 16 MiB: the SDK reads them itself. Its transport
    is built from the httpx-compatible package the SDK's client comes from."""
    client_class = next(c for c in openai.DefaultHttpxClient.__mro__[1:] if c.__name__ == "Client")
    hx = importlib.import_module(client_class.__module__.split(".")[0])
    transport = capped_transport(hx, hx.HTTPTransport(verify=tls_context()))
    return openai.DefaultHttpxClient(transport=transport)


class SdkClient:
    """Chat completions through ``openai.OpenAI`` against one endpoint."""

    def __init__(self, api: ApiEndpoint, *, timeout: float) -> None:
        self.api = api
        self.url = api.base_url.rstrip("/") + CHAT_PATH
        self._client = openai.OpenAI(
            base_url=api.base_url.rstrip("/") + "/v1",
            api_key=api.api_key or NO_KEY,
            timeout=timeout,
            max_retries=0,
            _strict_response_validation=True,
            http_client=sdk_http_client(),
        )

    @property
    def server(self) -> str:
        return f"{self.api.model} at {self.api.base_url}"

    def close(self) -> None:
        self._client.close()

    def _exchange(self, body: dict[str, Any], streamed: bool) -> Exchange:
        headers = {"Authorization": "Bearer <redacted>"} if self.api.api_key else {}
        return Exchange("POST", self.url, body, headers, streamed=streamed)

    def turn(self, body: dict[str, Any], streamed: bool) -> Turn:
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        kwargs = {k: v for k, v in body.items() if k in SDK_PARAMS}
        extra = {k: v for k, v in body.items() if k not in SDK_PARAMS}
        exchange = self._exchange({**body, **({"stream": True} if streamed else {})}, streamed)
        chat = self._client.chat.completions
        try:
            if not streamed:
                completion = chat.create(**kwargs, extra_body=extra or None)
                data = completion_data(completion)
                seen = replace(exchange, status=200, body=_dumps(data))
                return from_response(data, seen)
            chunks: list[dict[str, Any]] = []
            typed: list[Any] = []
            try:
                with chat.create(**kwargs, extra_body=extra or None, stream=True) as stream:
                    for chunk in stream:
                        typed.append(chunk)
                        chunks.append(chunk_data(chunk))
            except openai.APIConnectionError as exc:
                if not chunks:
                    raise
                raise self._error(
                    "truncated",
                    f"the connection broke after {len(chunks)} chunks "
                    f"({type(exc.__cause__ or exc).__name__}: {exc.__cause__ or exc}): the "
                    "stream was cut short",
                    exchange,
                    chunks,
                ) from None
            except ValueError as exc:
                raise self._decode_error(exc, exchange, chunks, streamed=True) from None
            seen = replace(exchange, status=200, body=_sse(chunks))
            turn = SdkTurn(**vars(assemble(chunks, seen)))
            turn.helper = stream_helper(typed, list(body.get("tools") or ()))
            if turn.finish_reason is None:
                raise self._error(
                    "truncated",
                    f"the stream ended after {len(chunks)} chunks without a finish_reason "
                    "(the SDK stops without data: [DONE]): the stream was cut short",
                    exchange,
                    chunks,
                )
            return turn
        except openai.APIResponseValidationError as exc:
            raise self._validation_error(exc, exchange, streamed) from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            kind = "http-5xx" if status >= 500 else "auth" if status == 401 else "http-4xx"
            quoted = short(exc.response.text, 300)
            raise self._error(kind, f"HTTP {status}: {quoted}", exchange, status=status) from None
        except openai.APITimeoutError as exc:
            raise self._error("timeout", f"no answer in time: {exc}", exchange) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            if getattr(cause, "body_too_large", False):
                raise self._error("oversized", str(cause), exchange) from None
            raise self._error("connect", f"{type(cause).__name__}: {cause}", exchange) from None
        except ValueError as exc:  # the body did not decode (json.JSONDecodeError)
            raise self._decode_error(exc, exchange, [], streamed=False) from None

    def _error(
        self,
        kind: str,
        message: str,
        exchange: Exchange,
        chunks: list[dict[str, Any]] | None = None,
        *,
        status: int | None = None,
        body: str | None = None,
    ) -> ServingError:
        text = body if body is not None else _sse(chunks or [])
        seen = replace(exchange, status=status or 200, body=text)
        where = f"POST {self.url} through the openai SDK {sdk_version()}"
        where += " (stream)" if exchange.streamed else ""
        return ServingError(kind, f"{where}: {message}", seen, chunks=len(chunks or []))

    def _decode_error(
        self, exc: ValueError, exchange: Exchange, chunks: list[dict[str, Any]], *, streamed: bool
    ) -> ServingError:
        doc = getattr(exc, "doc", None)
        quoted = short(doc, 200) if isinstance(doc, str) else "(not kept by the SDK)"
        if streamed:
            return self._error(
                "malformed-sse",
                f"SSE data line {len(chunks) + 1} is not valid JSON ({exc}): the SDK cannot "
                f"decode {quoted}",
                exchange,
                chunks,
                body=_sse(chunks) + (f"data: {doc}\n\n" if isinstance(doc, str) else ""),
            )
        return self._error(
            "not-json",
            f"HTTP 200 but the body is not JSON ({exc}): the SDK cannot decode {quoted}",
            exchange,
            body=doc if isinstance(doc, str) else "",
        )

    def _validation_error(
        self, exc: openai.APIResponseValidationError, exchange: Exchange, streamed: bool
    ) -> ServingError:
        fields = validation_fields(exc.__cause__)
        what = "a stream chunk" if streamed else "the chat completion"
        quoted = exc.body if isinstance(exc.body, str) else _dumps(exc.body)
        if not streamed:
            with contextlib.suppress(Exception):  # not read: keep the data the SDK had
                quoted = exc.response.text  # the bytes as received
        return self._error(
            "sdk-parse",
            f"the SDK cannot parse {what}: {fields}; the bytes: {short(quoted, 400)}",
            exchange,
            body=f"data: {quoted}\n\n" if streamed else quoted,
        )


def validation_fields(cause: BaseException | None) -> str:
    """``field choices.0.message.tool_calls.0.function.arguments: Input should be a valid
    string (got {"city": "Paris"})`` for each error pydantic found (at most 3)."""
    errors = getattr(cause, "errors", None)
    if not callable(errors):
        return f"{type(cause).__name__}: {cause}" if cause else "data returned invalid"
    out = []
    for error in errors()[:3]:
        loc = ".".join(str(p) for p in error.get("loc", ()))
        out.append(f"field {loc}: {error.get('msg')} (got {short(error.get('input'), 80)})")
    return "; ".join(out) or "data returned invalid"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _sse(chunks: list[dict[str, Any]]) -> str:
    return "".join(f"data: {_dumps(c)}\n\n" for c in chunks)


def _extra(obj: Any) -> dict[str, Any]:
    """The fields the SDK does not model (vLLM's reasoning among them)."""
    extra = getattr(obj, "model_extra", None)
    return dict(extra) if isinstance(extra, dict) else {}


def _call(tc: Any, *, delta: bool) -> dict[str, Any]:
    fn = tc.function
    out: dict[str, Any] = {
        "id": tc.id,
        "type": tc.type,
        "function": None if fn is None else {"name": fn.name, "arguments": fn.arguments},
    }
    if delta:
        out["index"] = tc.index
    return out


def completion_data(completion: Any) -> dict[str, Any]:
    """A ``ChatCompletion`` as the SDK typed it, read attribute by attribute (not its raw
    JSON): what an application sees."""
    choices = []
    for choice in completion.choices:
        message = choice.message
        msg: dict[str, Any] = {
            **_extra(message),
            "role": message.role,
            "content": message.content,
            "tool_calls": [_call(tc, delta=False) for tc in message.tool_calls or []],
        }
        choices.append(
            {"index": choice.index, "message": msg, "finish_reason": choice.finish_reason}
        )
    usage = completion.usage.model_dump() if completion.usage is not None else None
    return {"id": completion.id, "choices": choices, "usage": usage}


def chunk_data(chunk: Any) -> dict[str, Any]:
    """A ``ChatCompletionChunk`` as the SDK typed it (typed tool-call deltas, reasoning in
    ``model_extra``)."""
    choices = []
    for choice in chunk.choices:
        delta = choice.delta
        d: dict[str, Any] = {**_extra(delta), "role": delta.role, "content": delta.content}
        if delta.tool_calls:
            d["tool_calls"] = [_call(tc, delta=True) for tc in delta.tool_calls]
        choices.append({"index": choice.index, "delta": d, "finish_reason": choice.finish_reason})
    usage = chunk.usage.model_dump() if getattr(chunk, "usage", None) is not None else None
    return {"id": chunk.id, "choices": choices, "usage": usage}
