"""Retrieval from a long prompt: "What is the <key>?" answered from "The <key> is <value>."
found anywhere in the prompt (the needle-in-a-haystack question a long-context check asks).
A prompt without such a fact gets no answer here and falls through to the canned replies.

``beyond_native``: what a model served past its native context answers (the fault
context-beyond-native). Qwen3's card gives a native 32768 tokens and YaRN factor 4 for
131072; served at the longer ``--max-model-len`` without that rope scaling (vLLM refuses a
max_model_len above ``max_position_embeddings`` unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``,
"may lead to incorrect model outputs"), positions past the native length are out of the
model's range and what lies further back stops reaching the answer: the request succeeds,
and a needle question is answered confidently and wrongly."""

from __future__ import annotations

import re
import zlib

from . import tokens as tok

_QUESTION = re.compile(r"\bwhat is the ([a-z][a-z0-9 -]{2,60}?)\s*\?", re.I)


def needle_answer(prompt: str) -> str | None:
    for key in reversed(_QUESTION.findall(prompt)):
        fact = re.search(
            r"\bthe " + re.escape(key) + r" is ([^\s,;]+?)[.,;]?(?:\s|$)", prompt, re.I
        )
        if fact:
            return f"The {key} is {fact.group(1)}."
    return None


def native_window(prompt: str, native_tokens: int) -> str:
    """The prompt's last ``native_tokens`` tokens: what still reaches the answer."""
    pieces = tok.tokenize(prompt)
    return prompt if len(pieces) <= native_tokens else "".join(pieces[-native_tokens:])


def beyond_native(prompt: str, native_tokens: int) -> str | None:
    """A made-up answer when the needle lies beyond the native window (the question, at the
    end, is still read); None when the window still holds it or there is no needle."""
    found = needle_answer(prompt)
    if found is None or needle_answer(native_window(prompt, native_tokens)) is not None:
        return None
    key = _QUESTION.findall(prompt)[-1]
    made_up = str(1000 + zlib.crc32(prompt.encode("utf-8")) % 9000)
    if made_up in found:
        made_up = str(int(made_up) % 9000 + 1001)
    return f"The {key} is {made_up}."
