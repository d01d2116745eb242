"""One request on the engine: admission, token pacing, death checks, metrics, and the
SSE stream with its wire-level faults (malformed line, truncated stream, bad JSON body)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol

from . import errors as err
from .generation import Step

if TYPE_CHECKING:
    from .engine import Engine


class Responder(Protocol):
    """What the HTTP layer offers a handler."""

    def json(self, status: int, obj: Any) -> None: ...
    def raw(self, status: int, body: bytes, content_type: str) -> None: ...
    def sse_start(self) -> None: ...
    def sse_send(self, data: str) -> bool: ...
    def sse_end(self) -> None: ...
    def abort(self) -> None: ...
    def gone(self) -> bool: ...


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def send_body(engine: Engine, out: Responder, response: dict[str, Any]) -> None:
    data = dumps(response).encode("utf-8")
    if engine.faults.active("invalid-json-body"):
        out.raw(200, data[: max(1, len(data) // 2)], "application/json")
        return
    out.raw(200, data, "application/json")


class Job:
    """One request on the engine: admission, pacing, metrics, death checks."""

    def __init__(
        self,
        engine: Engine,
        rid: str,
        model: str,
        prompt_tokens: int,
        max_tokens: int | None,
        prompt_ids: list[int] | None = None,
    ):
        self.engine = engine
        self.rid = rid
        self.model = model
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.start = time.monotonic()
        self.queue_s = 0.0
        self.clock = engine.pacer.stream()
        self.done = 0
        self.prompt_ids = prompt_ids or []
        self.cached_tokens = 0  # served from the prefix cache: not prefilled again

    def _tokens(self, n: int, gone: Callable[[], bool] | None = None) -> Generator[int, None, None]:
        """Yield token indexes at their pacing times; raise EngineDead if the engine dies,
        and BrokenPipeError when ``gone()`` says the client left (queued or running)."""
        engine = self.engine
        self.queue_s = engine.admit(self.prompt_tokens, gone)
        self.cached_tokens = engine.prefix_cache.lookup_and_store(self.prompt_ids)
        engine.metrics.prefix(self.prompt_tokens, self.cached_tokens)
        try:
            for i in range(n):
                if i == 0:
                    self.clock.first(self.prompt_tokens - self.cached_tokens)
                else:
                    self.clock.next()
                if engine.dead:
                    raise err.engine_dead()
                if gone is not None and gone():
                    raise BrokenPipeError("the client left")
                engine.metrics.token()
                self.done = i + 1
                yield i
        except BaseException:
            self.clock.done()
            engine.release(self.prompt_tokens, self.done, aborted=True)
            raise
        self.clock.done()

    def run_silent(self, steps: list[Step], gone: Callable[[], bool] | None = None) -> None:
        """A non-streamed answer's tokens, paced. A client that leaves aborts it, queued or
        running, as vLLM's API server does (``with_cancellation`` on its completion routes
        listens for the disconnect and aborts the request in the engine)."""
        gen = self._tokens(len(steps), gone)
        try:
            for _ in gen:
                pass
        finally:
            gen.close()

    def finish(self, reason: str, completion_tokens: int) -> None:
        self.engine.release(self.prompt_tokens, 0, aborted=False)
        self.engine.metrics.finish(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion_tokens,
            max_tokens=self.max_tokens,
            reason=reason,
            queue_s=self.queue_s,
            token_times=list(self.clock.times),
            start=self.start,
            cached_tokens=self.cached_tokens,
        )

    def run_stream(
        self,
        out: Responder,
        steps: list[Step],
        first: dict[str, Any] | None,
        step_chunk: Callable[[int, Step, bool], dict[str, Any] | None],
        usage_chunk: dict[str, Any] | None,
        finish: str,
    ) -> None:
        faults = self.engine.faults
        out.sse_start()
        sent = 0
        cut_at = max(2, len(steps) // 2) if faults.active("truncated-stream") else -1
        gen = self._tokens(len(steps))
        try:
            for i in gen:
                if i == 0 and first is not None and not out.sse_send(dumps(first)):
                    raise BrokenPipeError
                obj = step_chunk(i, steps[i], i == len(steps) - 1)
                if obj is None:
                    continue
                data = dumps(obj)
                if sent == 1 and faults.active("malformed-sse"):
                    data = data[: len(data) // 2]
                if sent == cut_at or (cut_at >= 0 and i == len(steps) - 1):
                    out.abort()
                    raise BrokenPipeError
                if not out.sse_send(data):
                    raise BrokenPipeError
                sent += 1
        except err.ApiError as exc:
            out.sse_send(json.dumps(exc.body()))
            out.sse_send("[DONE]")
            out.sse_end()
            return
        except BrokenPipeError:
            return
        finally:
            gen.close()
        # Counted before the last chunks go out, as vLLM's engine counts a request when it
        # finishes, before its API server streams the end: a client that read [DONE] and
        # then /metrics finds the request there (counted after, a quick reader missed it).
        self.finish(finish, len(steps))
        if usage_chunk is not None:
            out.sse_send(dumps(usage_chunk))
        out.sse_send("[DONE]")
        out.sse_end()
