"""HTTP bodies read with a ceiling: a server that answers with gigabytes (a runaway
``/v1/models``, a stream that never ends) costs the run at most ``MAX_BODY_BYTES`` of
memory, and whoever reports the answer says that it was cut."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

MAX_BODY_BYTES = 16 * 1024 * 1024  # far above any answer the suite asks for


def size_text(n: int) -> str:
    """``16 MiB``, ``64 KiB``, ``300 B``."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:g} {unit}"
    return f"{n} B"


def cut_note(cap: int) -> str:
    return f"(body cut at {size_text(cap)}: the server sent more than any answer asked for)"


@dataclass(frozen=True)
class Body:
    """A response's status, headers and at most ``cap`` bytes of its body (``cut``: there
    was more, left unread)."""

    status_code: int
    reason_phrase: str
    headers: httpx.Headers
    content: bytes
    cut: bool = False
    cap: int = MAX_BODY_BYTES

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not (a cut body never is)."""
        if self.cut:
            raise ValueError(cut_note(self.cap))
        return json.loads(self.content)

    @property
    def content_type(self) -> str:
        kind: str = self.headers.get("content-type", "")
        return kind.split(";", 1)[0].strip().lower()

    def excerpt(self, limit: int = 300) -> str:
        """The start of the body on one line (whitespace collapsed), and whether it was cut."""
        flat = " ".join(self.text[: limit * 4].split())
        shown = flat if len(flat) <= limit else flat[: limit - 3] + "..."
        return f"{shown} {cut_note(self.cap)}" if self.cut else shown


def take(parts: Iterator[bytes], cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of ``parts``; True when there was more."""
    buf = bytearray()
    for part in parts:
        room = cap - len(buf)
        if len(part) > room:
            buf += part[:room]
            return bytes(buf), True
        buf += part
    return bytes(buf), False


async def atake(parts: AsyncIterator[bytes], cap: int) -> tuple[bytes, bool]:
    buf = bytearray()
    async for part in parts:
        room = cap - len(buf)
        if len(part) > room:
            buf += part[:room]
            return bytes(buf), True
        buf += part
    return bytes(buf), False


def request(
    client: httpx.Client, method: str, path: str, *, cap: int = MAX_BODY_BYTES, **kwargs: Any
) -> Body:
    """``client.request`` that reads at most ``cap`` bytes of the body."""
    with client.stream(method, path, **kwargs) as resp:
        content, cut = take(resp.iter_bytes(), cap)
        return Body(resp.status_code, resp.reason_phrase, resp.headers, content, cut, cap)


def get(client: httpx.Client, path: str, *, cap: int = MAX_BODY_BYTES, **kwargs: Any) -> Body:
    return request(client, "GET", path, cap=cap, **kwargs)


async def arequest(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    *,
    cap: int = MAX_BODY_BYTES,
    **kwargs: Any,
) -> Body:
    async with client.stream(method, path, **kwargs) as resp:
        content, cut = await atake(resp.aiter_bytes(), cap)
        return Body(resp.status_code, resp.reason_phrase, resp.headers, content, cut, cap)


def capped_transport(hx: Any, inner: Any, cap: int = MAX_BODY_BYTES) -> Any:
    """``inner``, a transport of the httpx-compatible module ``hx`` (httpx, or the httpx2
    the openai SDK is built on), whose response bodies end in ``hx.ReadError`` (with
    ``body_too_large`` set) past ``cap`` bytes: the ceiling for a client that reads the
    bodies itself."""
    note = (
        f"the response body passed {size_text(cap)} and was cut there (more than any "
        "answer the suite asks for)"
    )

    class CappedStream(hx.SyncByteStream):
        def __init__(self, stream: Any, request: Any) -> None:
            self._stream = stream
            self._request = request

        def __iter__(self) -> Iterator[bytes]:
            seen = 0
            for part in self._stream:
                seen += len(part)
                if seen > cap:
                    error = hx.ReadError(note, request=self._request)
                    error.body_too_large = True
                    raise error
                yield part

        def close(self) -> None:
            self._stream.close()

    class CappedTransport(hx.BaseTransport):
        def handle_request(self, request: Any) -> Any:
            response = inner.handle_request(request)
            response.stream = CappedStream(response.stream, request)
            return response

        def close(self) -> None:
            inner.close()

    return CappedTransport()
