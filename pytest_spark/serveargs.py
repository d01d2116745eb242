"""What a ``vllm serve ...`` command line promises: model, served name, limits, parsers."""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class ServeArgs:
    model: str | None
    served_names: tuple[str, ...]
    max_model_len: int | None
    tensor_parallel_size: int
    reasoning_parser: str | None
    tool_call_parser: str | None
    auto_tool_choice: bool
    api_key_set: bool

    @property
    def served_name(self) -> str | None:
        return self.served_names[0] if self.served_names else self.model


def _length(value: str) -> int:
    text = value.strip().lower()
    for suffix, factor in (("k", 1024), ("m", 1024 * 1024)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * factor)
    return int(text)


def parse_serve_args(command: str) -> ServeArgs:
    """Parse ``vllm serve MODEL --flag value ...`` (``--flag=value`` too)."""
    argv = shlex.split(command)
    if argv[:2] == ["vllm", "serve"]:
        argv = argv[2:]
    elif argv and argv[0].endswith(("vllm", "api_server")):
        argv = argv[1:]
    model: str | None = None
    names: list[str] = []
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, eq, val = arg[2:].partition("=")
            if eq:
                values[key] = val
            elif key == "served-model-name":
                while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    names.append(argv[i + 1])
                    i += 1
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                values[key] = argv[i + 1]
                i += 1
            else:
                flags.add(key)
        elif model is None:
            model = arg
        i += 1
    if "served-model-name" in values:
        names = [values["served-model-name"]]
    model = model or values.get("model")
    return ServeArgs(
        model=model,
        served_names=tuple(names),
        max_model_len=_length(values["max-model-len"]) if "max-model-len" in values else None,
        tensor_parallel_size=int(values.get("tensor-parallel-size", values.get("tp", "1"))),
        reasoning_parser=values.get("reasoning-parser"),
        tool_call_parser=values.get("tool-call-parser"),
        auto_tool_choice="enable-auto-tool-choice" in flags,
        api_key_set="api-key" in values,
    )
