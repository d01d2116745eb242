"""Prefix cache and long context (issue #16 section 6): the prompts, the requests and the
pure reading of what came back.

- Prefix cache: two chat requests share a long system prompt (unique to the run, so the
  first is cold) and differ in the question; the second's TTFT must be lower and the
  server's ``vllm:prefix_cache_hits`` must grow (:mod:`pytest_spark.serving.load.metricsnap`).
- Long context: ``max_model_len`` from ``/v1/models``; a prompt filled to a share of it,
  measured with the server's own ``/tokenize`` (its tokenizer and chat template), holding
  a needle fact; and a prompt just over ``max_model_len`` itself, which every vLLM
  refuses with a 400 in its own words. vLLM 0.32 (``vllm/renderers/params.py``,
  ``TokenizeParams._token_len_check``; recorded in
  fixtures/vllm/vllm-0.32.0-cpu/error_prompt_too_long.txt)::

      This model's maximum context length is {L} tokens. However, your prompt contains
      at least {P} input tokens, which exceeds this limit even without any output tokens.
      Please reduce the length of the input prompt.

  (the tokenizer stops at L + 1 tokens, hence "at least"; ``VLLMValidationError`` appends
  `` (parameter=input_tokens, value=P)``). 0.32 serves a prompt that fits with
  ``max_tokens`` cut to what is left (``get_max_tokens``), so a prompt that fits but
  leaves no room for ``max_tokens`` is no refusal there. Earlier renderer builds (~0.12 to
  0.2x) said ``You passed {P} input tokens and requested {M} output tokens. However, the
  model's context length is only {L} tokens, resulting in a maximum input length of {L-M}
  tokens.``; builds before the renderer (``serving_engine._validate_input``, <= ~0.11)
  ``This model's maximum context length is {L} tokens. However, you requested {P+M} tokens
  ({P} in the messages, {M} in the completion).`` All three are read.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_spark.serving.client.chat import ServingClient
from pytest_spark.serving.client.stream import ServingError
from pytest_spark.serving.load.metricsnap import PrefixCacheRun, Snapshot

_TOO_LONG = re.compile(
    r"You passed (?P<prompt>\d+) input tokens and requested (?P<output>\d+) output tokens\. "
    r"However, the model's context length is only (?P<limit>\d+) tokens, resulting in a "
    r"maximum input length of (?P<max_input>\d+) tokens\. Please reduce the length of the "
    r"input prompt\."
)
_TOO_LONG_PROMPT = re.compile(
    r"This model's maximum context length is (?P<limit>\d+) tokens\. However, your prompt "
    r"contains (?P<at_least>at least )?(?P<prompt>\d+) input tokens, which exceeds this limit "
    r"even without any output tokens\. Please reduce the length of the input prompt\."
)
_TOO_LONG_OLD = re.compile(
    r"This model's maximum context length is (?P<limit>\d+) tokens\. However, you requested "
    r"(?P<total>\d+) tokens \((?P<prompt>\d+) in the messages, (?P<output>\d+) in the "
    r"completion\)\. Please reduce the length of the messages or completion\."
)
_WORDS = (
    "The archive keeps its records in numbered boxes along the north wall of the hall.",
    "Each morning the keeper walks the rows and notes the temperature in a small book.",
    "Visitors sign the ledger at the door and leave their coats on the wooden hooks.",
    "Rain on the roof is the only sound in the reading room after the bells have rung.",
)
NEEDLE_KEY = "vault code"


@dataclass(frozen=True)
class TooLong:
    """vLLM's refusal of an over-long prompt, read from its message."""

    prompt_tokens: int
    output_tokens: int
    limit: int
    wording: str  # "prompt" (0.32), "renderer" (~0.12 to 0.2x) or "legacy"
    at_least: bool = False  # the server's tokenizer stopped counting at limit + 1


def parse_too_long(message: str) -> TooLong | None:
    m = _TOO_LONG_PROMPT.search(message)
    if m:
        return TooLong(int(m["prompt"]), 0, int(m["limit"]), "prompt", bool(m["at_least"]))
    m = _TOO_LONG.search(message)
    if m:
        return TooLong(int(m["prompt"]), int(m["output"]), int(m["limit"]), "renderer")
    m = _TOO_LONG_OLD.search(message)
    if m:
        return TooLong(int(m["prompt"]), int(m["output"]), int(m["limit"]), "legacy")
    return None


def filler(sentences: int, start: int = 0) -> str:
    return " ".join(_WORDS[(start + i) % len(_WORDS)] for i in range(max(0, sentences)))


def haystack(sentences: int, code: str) -> str:
    """Filler with the needle fact in the middle and the question at the end."""
    half = sentences // 2
    return (
        f"{filler(half)} The {NEEDLE_KEY} is {code}. {filler(sentences - half, half)}\n\n"
        f"Answer from the text above. What is the {NEEDLE_KEY}?"
    )


def fit(count: Callable[[int], int], target: int) -> tuple[int, int]:
    """The largest ``n`` with ``count(n) <= target``, for a ``count`` that grows about
    linearly with ``n`` (sentences of filler -> prompt tokens): a slope from two
    measurements, then exact steps. Returns (n, count(n)); n = 0 when even that is over."""
    base, probe = count(0), 16
    slope = max(1.0, (count(probe) - base) / probe)
    n = max(0, int((target - base) / slope))
    got = count(n)
    while got > target and n > 0:
        n = max(0, n - max(1, int((got - target) / slope)))
        got = count(n)
    while True:
        nxt = count(n + 1)
        if nxt > target:
            return n, got
        n, got = n + 1, nxt


def max_model_len(models: dict[str, Any], model: str) -> int | None:
    for entry in models.get("data") or ():
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("max_model_len")
            return int(value) if isinstance(value, int) else None
    return None


def tokenize_count(client: ServingClient, messages: list[dict[str, Any]]) -> int:
    """The server's count of a chat prompt (``POST /tokenize``, chat template applied)."""
    body = {"model": client.api.model, "messages": messages, "add_generation_prompt": True}
    return int(client.post("/tokenize", body).data["count"])


def first_token_s(chunks: list[dict[str, Any]], times: list[float]) -> float | None:
    """Seconds from the request to the first chunk carrying text (content or reasoning)."""
    for chunk, t in zip(chunks, times, strict=False):
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content"):
                return t
    return None


def prefix_messages(prefix_words: int, question: str, nonce: str) -> list[dict[str, Any]]:
    sentences = max(1, prefix_words // 16)  # each filler sentence is ~16 words
    system = f"Session {nonce}. Reference text follows. {filler(sentences)}"
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def snapshot(client: ServingClient) -> Snapshot | None:
    """The server's ``/metrics`` now; None where it has no vLLM metrics."""
    try:
        resp = client.get("/metrics")
    except ServingError:
        return None
    if resp.status_code != 200 or resp.cut or "vllm:" not in resp.text:
        return None
    return Snapshot.of(resp.text, time.time())


def run_prefix_pair(client: ServingClient, prefix_tokens: int) -> PrefixCacheRun | str:
    """Cold then warm request sharing the prefix; a str says why no comparison was made."""
    nonce = uuid.uuid4().hex[:12]
    before = snapshot(client)
    if before is None:
        return "the server has no vLLM /metrics to read the prefix-cache counters from"
    ttfts = []
    for question in ("Name one thing the keeper notes.", "Where do visitors leave coats?"):
        body = client.body(
            prefix_messages(prefix_tokens, question, nonce),
            max_tokens=8,
            temperature=0.0,
            stream=True,
        )
        result = client.stream(body)
        t = first_token_s(result.chunks, result.times)
        if t is None:
            raise ServingError(
                "no-tokens",
                f"{client.server}: a prefix-cache request streamed no token",
                result.exchange,
            )
        ttfts.append(t)
        time.sleep(0.05)  # the first request's blocks are committed when it finishes
    after = snapshot(client)
    if after is None:
        return "/metrics stopped answering during the prefix-cache requests"
    return PrefixCacheRun(prefix_tokens, ttfts[0], ttfts[1], before, after)


@dataclass(frozen=True)
class LongPrompt:
    """A chat prompt filled to a token count measured by the server's ``/tokenize``."""

    messages: list[dict[str, Any]]
    tokens: int
    code: str


def long_prompt(client: ServingClient, target_tokens: int) -> LongPrompt:
    """The needle prompt with the most filler that stays within ``target_tokens``."""
    code = str(1000 + uuid.uuid4().int % 9000)

    def messages(n: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": haystack(n, code)}]

    n, tokens = fit(lambda k: tokenize_count(client, messages(k)), target_tokens)
    return LongPrompt(messages(n), tokens, code)


def needle_problem(content: str | None, reasoning: str | None, code: str) -> str | None:
    """None when the answer names the code; else what the answer said instead (and the
    code it named, when it named another)."""
    if content and code in content:
        return None
    if not content and reasoning and code in reasoning:
        return None  # a reasoning model that ran out of tokens after finding it
    said = (content or "").strip() or "(no content)"
    other = re.findall(r"\b\d{4}\b", content or "")
    named = f"it names {other[0]} instead" if other else "it names no code"
    return f"the answer does not name the code {code}, {named}: {said[:200]!r}"


FIX_NATIVE = (
    "Usually --max-model-len above the model's native context (config.json "
    "max_position_embeddings) without the rope scaling its model card prescribes: vLLM "
    "takes that only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and what lies further back than "
    "the native length stops reaching the answer. Add the card's scaling (YaRN: "
    '--hf-overrides \'{"rope_scaling": {"rope_type": "yarn", "factor": F, '
    '"original_max_position_embeddings": NATIVE}}\', --rope-scaling on older vLLM) or serve '
    "--max-model-len at the native length"
)
FIX_NO_RETRIEVAL = (
    "the model does not retrieve the fact at this length either: a chat template that "
    "drops or truncates the user turn, or a model too small for the question "
    "(long_context.needle = false)"
)


def needle_verdict(long: int, short: int | None, short_ok: bool | None) -> str:
    """What a shorter prompt's answer says about a needle lost at ``long`` tokens: context
    lost beyond some length (and the fix), or no retrieval at all."""
    if short is None or short_ok is None:
        return (
            "Usually a context shorter in effect than served (rope scaling missing, a "
            "truncating chat template) or KV-cache corruption at long lengths"
        )
    if short_ok:
        return (
            f"A {short}-token prompt answered it: the context is lost between {short} and "
            f"{long} tokens, shorter in effect than served. {FIX_NATIVE}"
        )
    return f"A {short}-token prompt did not answer it either: {FIX_NO_RETRIEVAL}"


def too_long_problem(status: int | None, message: str, limit: int, prompt: int) -> str | None:
    """None when the over-long request got vLLM's 400 in vLLM's words, with the counts
    the request had; else what differs."""
    if status != 400:
        return f"HTTP {status}, expected 400"
    parsed = parse_too_long(message)
    if parsed is None:
        return f"the 400's message is not vLLM's context-length error: {message[:300]!r}"
    counted = parsed.prompt_tokens <= prompt if parsed.at_least else parsed.prompt_tokens == prompt
    if parsed.limit != limit or not counted:
        return (
            f"the 400 names {parsed.prompt_tokens} input tokens and a context length of "
            f"{parsed.limit}; the request had {prompt} (/tokenize) and /v1/models says "
            f"max_model_len {limit}"
        )
    return None


def over_limit_prompt(client: ServingClient, limit: int) -> LongPrompt:
    """The needle prompt grown word by word until it is just over ``limit`` tokens (one
    over with a tokenizer that gives a common word one token). With ``limit`` =
    ``max_model_len`` the prompt alone does not fit: refused by every vLLM version."""
    fitted = long_prompt(client, limit)
    text = fitted.messages[0]["content"]
    count = fitted.tokens
    for _ in range(64):
        if count > limit:
            break
        text += " again"
        count = tokenize_count(client, [{"role": "user", "content": text}])
    return LongPrompt([{"role": "user", "content": text}], count, fitted.code)
