"""What the emulated model says (deterministic text) and when (token pacing).

A response is a ``Plan``: one ``Step`` per generated token, each with the streaming delta
it produces (``None`` when a parser holds the token back) and what it adds to the
non-streaming message. Pacing: the first token after a TTFT (prefill) delay, then one
token per decode step on an absolute schedule per stream, the step's length set by how many
sequences are decoding (``StepModel``: a memory-bound MoE engine); an optional aggregate cap
hands out engine slots at most ``max_agg_tok_s`` per second across all streams.
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
from .needle import needle_answer
from .solver import garbled, solve
from .specdecode import Drafts, SpecModel

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


def answer_text(prompt: str, after_tool: bool = False, garble: bool = False) -> str:
    """What the model says: a rule's answer (:mod:`.solver`), a needle's, a canned or a
    generic one; ``garble``: a numerically broken model's answer where a rule reads the
    question (the same shape, wrong)."""
    if after_tool:
        return "Based on the tool result, here is the answer you asked for."
    found = needle_answer(prompt)
    if found is not None:
        return found
    found = garbled(prompt) if garble else solve(prompt)
    if found is not None:
        return found
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


@dataclass(frozen=True)
class StepModel:
    """How long one decode step takes on a memory-bound MoE engine, by batch.

    Decode on a DGX Spark is memory-bound: a step reads the weights it needs once for the
    whole batch, plus each sequence's KV cache. For a mixture-of-experts model the weights
    a step needs grow with the batch, because each token routes to its own experts:

        t_step(n) = t_1 * ((1 - f) + f * u(n)) + kv_s * sum(context) + extra_s
        u(n) = (1 - (1 - p)**n) / p     (experts read, in units of one token's experts)

    - ``t_1 = 1 / rate``: the 1-stream step (``SPARKSIM_EMU_DECODE_TOK_S``, unchanged).
    - ``f`` (``STEP_EXPERT_SHARE``): the share of the 1-stream step that grows with the
      distinct routed experts the batch touches; the rest (attention and DeltaNet layers,
      the shared expert, embeddings, the TP all-reduces, launch overhead) is read or paid
      once per step whatever the batch.
    - ``p`` (``STEP_EXPERT_PICK``): routed experts per token over experts per layer. A
      token picks k of E experts, so n tokens touch E * (1 - (1 - k/E)**n) distinct ones
      (uniform routing): u grows almost linearly at small n and saturates at E/k once the
      batch reads every expert; the aggregate then bends (1.9x at 4 streams, 2.9x at 16).
    - ``kv_s`` (``STEP_KV_S_PER_TOKEN``): one context token's KV read per step.
    - ``extra_s``: a per-step cost independent of the batch (the slow-decode fault: a slow
      fabric's all-reduces, paid once per layer per step).
    - ``scale``: the GPU's slowdown (the heat-throttle fault, :mod:`.thermal`): the weight
      and KV reads take that many times as long.

    Defaults model Qwen3.5-122B-A10B-FP8 at TP=2 on two Sparks: p = 8/256 (8 routed
    experts of 256 per layer, plus one shared); f = 0.39 fits the published 4-stream to
    1-stream ratio (31.5 -> 59.7 tok/s, 1.90x: the bjk110 vllm-spark README, REFERENCE.md);
    kv_s = 4.5e-8 s: 12 full-attention layers of 48 (the others are DeltaNet, no KV),
    2 KV heads x 256 dims x K and V in bf16, half a token's KV per node (12 KiB) at
    273 GB/s. The model has no compute-bound regime: at the batches the suite drives
    (<= 64) the GB10's tensor throughput is far from the limit.
    """

    rate: float  # 1-stream decode tok/s
    expert_share: float = 0.0
    expert_pick: float = 1.0
    kv_s_per_token: float = 0.0
    extra_s: float = 0.0
    scale: float = 1.0

    def experts(self, running: int) -> float:
        """Distinct routed experts a batch of ``running`` reads, in one token's experts."""
        n, p = max(1, running), self.expert_pick
        return (1.0 - (1.0 - p) ** n) / p if 0.0 < p < 1.0 else float(n)

    def step_s(self, running: int, context_tokens: int = 0) -> float:
        """One decode step with ``running`` sequences holding ``context_tokens`` in all."""
        f = min(max(self.expert_share, 0.0), 1.0)
        t1 = 1.0 / max(self.rate, 1e-3)
        weights = t1 * ((1.0 - f) + f * self.experts(running))
        reads = weights + self.kv_s_per_token * max(0, context_tokens)
        return reads * self.scale + self.extra_s

    def aggregate_tok_s(self, running: int, context_each: int = 0) -> float:
        """Output tok/s of ``running`` sequences decoding together."""
        return running / self.step_s(running, running * context_each) if running > 0 else 0.0


class Pacer:
    """Token clock shared by all streams: the decode step at the current batch plus an
    optional aggregate cap. ``step`` gives the model in force (knobs and overrides)."""

    def __init__(
        self,
        step: Callable[[], StepModel],
        cap: Callable[[], float],
        ttft: Callable[[int], float],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        spec: Callable[[], SpecModel | None] = lambda: None,
        on_draft: Callable[[int], None] = lambda accepted: None,
    ) -> None:
        self._step = step
        self._spec = spec
        self._on_draft = on_draft
        self._drafts = Drafts()
        self._cap = cap
        self._ttft = ttft
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._next_slot = 0.0
        self.running = 0  # sequences decoding (first token out, not finished)
        self.context_tokens = 0  # their prompt and generated tokens, in all

    def join(self, context: int) -> None:
        with self._lock:
            self.running += 1
            self.context_tokens += context

    def leave(self, context: int) -> None:
        with self._lock:
            self.running -= 1
            self.context_tokens -= context

    def grow(self) -> None:
        with self._lock:
            self.context_tokens += 1

    def step_s(self) -> float:
        """The decode step at the batch decoding now."""
        return self._step().step_s(self.running, self.context_tokens)

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
    context: int = 0  # this sequence's tokens while it is in the batch; 0: not in it
    verified: int = 0  # accepted draft tokens of the last step, not yet sent

    def _sleep_until(self, when: float) -> None:
        while True:
            left = when - self.pacer._clock()
            if left <= 0:
                return
            self.pacer._sleep(left)

    def first(self, prompt_tokens: int) -> None:
        self._sleep_until(self.pacer._slot(self.pacer._clock() + self.pacer._ttft(prompt_tokens)))
        self.target = self.pacer._clock()  # decode runs on a schedule from the first token
        self.times.append(self.target)
        self.context = max(1, prompt_tokens + 1)
        self.pacer.join(self.context)

    def done(self) -> None:
        """The sequence leaves the batch (finished, aborted or failed); idempotent."""
        if self.context:
            self.pacer.leave(self.context)
            self.context = 0

    def next(self) -> None:
        """Next token on the stream's absolute schedule, one decode step at the batch
        decoding now after the last. A thread woken late (CPU contention) catches up, so
        the average rate holds; a slot pushed back by the aggregate cap moves the schedule
        instead (no burst after batching delays). With drafting (:mod:`.specdecode`) a step
        is longer and yields its accepted draft tokens at once after the first."""
        spec = self.pacer._spec()
        if spec is not None and self.verified > 0:
            self.verified -= 1
            if self.context:
                self.context += 1
                self.pacer.grow()
            self.times.append(self.pacer._clock())
            return
        step = self.pacer.step_s()
        if spec is not None:
            self.verified = self.pacer._drafts.draw(spec)
            self.pacer._on_draft(self.verified)
            step *= spec.step_factor
        target = self.target + step
        if self.context:
            self.context += 1
            self.pacer.grow()
        now = self.pacer._clock()
        if now - target > CATCH_UP_LIMIT_S:  # stalled (slow client, long pause): no burst
            target = now
        self.target = self.pacer._slot(target)
        self._sleep_until(self.target)
        self.times.append(self.pacer._clock())
