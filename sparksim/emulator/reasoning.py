"""The qwen3 reasoning parser as vLLM applies it, and its known failure modes as faults.

Qwen3.5's template puts ``<think>`` in the prompt, so the model emits
``reasoning</think>\\n\\nanswer``. vLLM's parser splits at ``</think>``: the tag itself is
never streamed, and (vLLM source: ``content or None``) the answer keeps its leading
``\\n\\n`` (``SPARKSIM_EMU_THINK_NEWLINES=strip`` drops it). Cut before ``</think>``:
everything is reasoning, content null. Field names follow the emulated version.
"""

from __future__ import annotations

from . import tokens as tok
from .generation import Step

THINK_END = "</think>"


def think_prefix(reasoning_on: bool, thinking: bool) -> str:
    """What the chat template appends after ``<|im_start|>assistant\\n``."""
    if not reasoning_on:
        return ""
    return "<think>\n" if thinking else "<think>\n\n</think>\n\n"


def reasoning_delta(fields: tuple[str, ...], text: str) -> dict[str, str]:
    return {name: text for name in fields}


def reasoning_steps(
    text: str, fields: tuple[str, ...], faults: set[str], newline: str
) -> list[Step]:
    """Reasoning tokens, the ``</think>`` token and the ``\\n\\n`` that opens the answer:
    ``newline`` is "content" (streamed and kept, vLLM's behaviour), "hidden" (generated but
    dropped) or "none" (not generated: guided decoding starts right after the tag)."""
    leak = "reasoning-in-content" in faults
    steps = []
    for t in tok.tokenize(text):
        if leak:
            steps.append(Step(t, {"content": t}, content=t))
        else:
            steps.append(Step(t, reasoning_delta(fields, t), reasoning=t))
    if "think-in-content" in faults:
        steps.append(Step(THINK_END, {"content": THINK_END}, content=THINK_END))
    else:
        steps.append(Step(THINK_END, None))
    if newline == "content":
        steps.append(Step("\n\n", {"content": "\n\n"}, content="\n\n"))
    elif newline == "hidden":
        steps.append(Step("\n\n", None))
    return steps


def answer_into_reasoning(steps: list[Step], fields: tuple[str, ...]) -> list[Step]:
    """Fault answer-in-reasoning: with thinking disabled the answer lands in reasoning."""
    moved = []
    for s in steps:
        if s.content:
            moved.append(Step(s.text, reasoning_delta(fields, s.content), reasoning=s.content))
        else:
            moved.append(s)
    return moved
