"""A small deterministic tokenizer and the chat prompt it counts.

Words with their leading space, digit groups of up to three, runs of punctuation, newline
runs and the special tags are one token each ("Hello world" -> 2 tokens, as real BPE
tokenizers give). The same function counts usage, /tokenize and streamed chunks.
"""

from __future__ import annotations

import json
import re
import threading
import zlib
from typing import Any

SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<think>": 151667,
    "</think>": 151668,
}
VOCAB_SIZE = 151643

_TOKEN_RE = re.compile(
    r"<\|[a-z_]+\|>|</?think>|</?tool_call>"  # special tokens
    r"|'(?:s|t|re|ve|m|ll|d)\b"  # contractions
    r"| ?[^\W\d_]+"  # words
    r"| ?\d{1,3}"  # digit groups
    r"| ?(?:[^\s\w]|_)+"  # punctuation runs
    r"|\n+"  # newline runs
    r"|[^\S\n]+(?=\S)|[^\S\n]+"  # other whitespace
    r"|.",
    re.DOTALL,
)

_id_to_text: dict[int, str] = {v: k for k, v in SPECIAL_IDS.items()}
_id_lock = threading.Lock()


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def count(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def token_id(token: str) -> int:
    special = SPECIAL_IDS.get(token)
    if special is not None:
        return special
    tid = zlib.crc32(token.encode("utf-8")) % VOCAB_SIZE
    with _id_lock:
        _id_to_text.setdefault(tid, token)
    return tid


def ids(text: str) -> list[int]:
    return [token_id(t) for t in tokenize(text)]


def detokenize(token_ids: list[int]) -> str:
    with _id_lock:
        return "".join(_id_to_text.get(t, "") for t in token_ids)


def message_text(content: Any) -> str:
    """OpenAI content: a string, null, or a list of parts (only text parts count)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    think_prefix: str,
) -> str:
    """A ChatML prompt as Qwen's template renders it (tools block in the system turn)."""
    out = []
    system = ""
    rest = messages
    if messages and messages[0].get("role") == "system":
        system = message_text(messages[0].get("content"))
        rest = messages[1:]
    if tools:
        block = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        system = (
            (system + "\n\n" if system else "")
            + "# Tools\n\nYou may call one or more functions to assist with the user query."
            + "\n\nYou are provided with function signatures within <tools></tools> XML tags:"
            + f"\n<tools>\n{block}\n</tools>\n\nFor each function call, return a <tool_call>"
            + " block with the function name and its parameters."
        )
    if system:
        out.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    for msg in rest:
        role = str(msg.get("role", "user"))
        text = message_text(msg.get("content"))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            text += f"\n<tool_call>\n{json.dumps(fn, ensure_ascii=False)}\n</tool_call>"
        out.append(f"<|im_start|>{role}\n{text}<|im_end|>\n")
    out.append(f"<|im_start|>assistant\n{think_prefix}")
    return "".join(out)
