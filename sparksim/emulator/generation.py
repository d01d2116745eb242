"""What the emulated model says (deterministic text) and when (token pacing).

A response is a ``Plan``: one ``Step`` per generated token, each with the streaming delta
it produces (``None`` when a parser holds the token back) and what it adds to the
non-streaming message. Pacing: the first token after a TTFT (prefill) delay, then one
token per ``1/decode_tok_s`` on an absolute schedule per stream; an optional aggregate cap
hands out engine slots at most ``max_agg_tok_s`` per second across all streams (batching).
"""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import tokens as tok

EOS = "<|im_end|>"
CATCH_UP_LIMIT_S = 1.0


@dataclass
class Step:
    text: str  # the model's token
    delta: dict[str, Any] | None  # what a stream sends for it; None: the parser holds it
    reasoning: str = ""  # non-streaming: added to message reasoning
    content: str = ""  # non-streaming: added to message content
    markup: str = ""  # raw tool markup (lands in content when its call never completes)
    call_index: int = -1  # which tool call the markup belongs to
    call: dict[str, Any] | None = None  # a tool call completed at this token


@dataclass
class Plan:
    steps: list[Step]
    finish: str = "stop"  # when not cut by max_tokens: "stop" or "tool_calls"
    empty_content: str | None = None  # content when nothing landed there
    stop_reason: str | None = None  # the stop string that ended the answer, if any
    has_reasoning: bool = False
    pad_text: str = ""  # continuation used when ignore_eos asks for more tokens

    def fit(self, max_tokens: int, ignore_eos: bool) -> str:
        """Cut to max_tokens or, with ignore_eos, pad to exactly max_tokens; the finish reason."""
        if ignore_eos:
            if self.steps and self.steps[-1].text == EOS:
                self.steps.pop()
            filler = tok.tokenize(self.pad_text or FILLER)
            i = 0
            while len(self.steps) < max_tokens:
                t = filler[i % len(filler)]
                self.steps.append(Step(t, {"content": t}, content=t))
                i += 1
        if len(self.steps) > max_tokens:
            del self.steps[max_tokens:]
            return "length"
        if ignore_eos:
            return "length"
        return self.finish

    def message_parts(self) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """(reasoning, content, tool_calls) of the non-streaming message."""
        reasoning = "".join(s.reasoning for s in self.steps)
        content = "".join(s.content for s in self.steps)
        calls = [s.call for s in self.steps if s.call is not None]
        done = {i for i, s in enumerate(self.steps) if s.call is not None}
        done_idx = {self.steps[i].call_index for i in done}
        leftover = "".join(
            s.markup for s in self.steps if s.markup and s.call_index not in done_idx
        )
        content += leftover
        return (
            reasoning if reasoning else None,
            content if content else self.empty_content,
            calls,
        )


def content_steps(text: str) -> list[Step]:
    return [Step(t, {"content": t}, content=t) for t in tok.tokenize(text)]


def eos_step(delta: dict[str, Any] | None = None) -> Step:
    return Step(EOS, {"content": ""} if delta is None else delta)


FILLER = (
    " The cluster keeps serving requests while the benchmark measures steady decode speed,"
    " and every token arrives on schedule so the numbers stay easy to check."
)

_STORY = (
    "Once upon a time, in a data center humming with fans, two small computers shared one"
    " long cable. Every night they passed numbers back and forth, faster than rain on a"
    " tin roof, and every morning the engineers checked that nothing had been lost."
)

_CANNED: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bstory\b", re.I), _STORY + _STORY.replace("Once upon a time,", " Later,")),
    (re.compile(r"\b(?:say )?(?:hello|hi)\b", re.I), "Hello! How can I assist you today?"),
    (re.compile(r"capital of france", re.I), "The capital of France is Paris."),
    (re.compile(r"\b2 ?\+ ?2\b"), "2 + 2 = 4."),
]

_GENERIC = [
    "Here is a short answer. The request was received, processed and answered by the model,"
    " which is running normally on both nodes.",
    "Sure. The model read your message and produced this reply; everything on the serving"
    " path looks healthy from here.",
    "Thanks for the question. This reply comes from the model served with tensor parallelism"
    " across two nodes, and it finished normally.",
]


def seed_of(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def answer_text(prompt: str, after_tool: bool = False) -> str:
    if after_tool:
        return "Based on the tool result, here is the answer you asked for."
    for pattern, text in _CANNED:
        if pattern.search(prompt):
            return text
    return _GENERIC[seed_of(prompt) % len(_GENERIC)]


def exact_tokens(text: str, n: int, filler: str = FILLER) -> str:
    """``text`` cut or extended (with filler) to exactly n tokens."""
    toks = tok.tokenize(text)
    pad = tok.tokenize(filler)
    i = 0
    while len(toks) < n:
        toks.append(pad[i % len(pad)])
        i += 1
    return "".join(toks[:n])


def reasoning_text(prompt: str, n_tokens: int, plan_hint: str) -> str:
    short = " ".join(prompt.split())[:80]
    base = (
        f'Okay. {plan_hint} The user wrote: "{short}". Let me make sure the answer is'
        " correct and clear before replying."
    )
    return exact_tokens(base, n_tokens, " I will double-check the details once more.")


class Pacer:
    """Token clock shared by all streams: per-stream rate plus an optional aggregate cap."""

    def __init__(
        self,
        rate: Callable[[], float],
        cap: Callable[[], float],
        ttft: Callable[[int], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = rate
        self._cap = cap
        self._ttft = ttft
        self._clock = clock
        self._lock = threading.Lock()
        self._next_slot = 0.0

    def _slot(self, earliest: float) -> float:
        cap = self._cap()
        if cap <= 0:
            return earliest
        with self._lock:
            slot = max(earliest, self._next_slot)
            self._next_slot = slot + 1.0 / cap
            return slot

    def stream(self) -> StreamClock:
        return StreamClock(self)


@dataclass
class StreamClock:
    pacer: Pacer
    target: float = 0.0
    times: list[float] = field(default_factory=list)

    def _sleep_until(self, when: float) -> None:
        while True:
            left = when - self.pacer._clock()
            if left <= 0:
                return
            time.sleep(left)

    def first(self, prompt_tokens: int) -> None:
        self._sleep_until(self.pacer._slot(self.pacer._clock() + self.pacer._ttft(prompt_tokens)))
        self.target = self.pacer._clock()  # decode runs on a schedule from the first token
        self.times.append(self.target)

    def next(self) -> None:
        """Next token on the stream's absolute schedule. A thread woken late (CPU
        contention) catches up, so the average rate holds; a slot pushed back by the
        aggregate cap moves the schedule instead (no burst after batching delays)."""
        rate = max(self.pacer._rate(), 1e-3)
        target = self.target + 1.0 / rate
        now = self.pacer._clock()
        if now - target > CATCH_UP_LIMIT_S:  # stalled (slow client, long pause): no burst
            target = now
        self.target = self.pacer._slot(target)
        self._sleep_until(self.target)
        self.times.append(self.pacer._clock())
