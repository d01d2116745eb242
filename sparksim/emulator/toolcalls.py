"""Tool calls: which tool the emulated model calls, with what arguments, on which wire path.

Decision rules (deterministic, documented in the emulator README section of the report):

* A tool *matches* when a keyword of its name (split on ``_``, ``-`` and camelCase, minus
  verbs such as get/set/list/fetch) or the whole name appears as a word in the last user
  message. A conversation ending in a ``tool`` message is answered in text under ``auto``.
* ``auto``: the matching tools are called (none matching: a text answer). ``required``:
  the matching tools, or the first tool. Named ``tool_choice``: that tool.
* Parallel calls: two or more matching tools -> one call each; one matching tool whose
  first required string parameter has two or more candidates joined by "and"
  ("Paris and London") -> one call per candidate (at most 4).
* Arguments follow the tool's JSON schema: enum -> a value named in the prompt, else the
  first; string -> a capitalised word from the prompt not opening a sentence (query-like
  names get the whole message); integer/number -> numbers from the prompt in order;
  boolean -> true. Required fields always; optional ones only when the prompt supplies a
  value.

Wire paths, as vLLM 0.32 sends them (see the transcripts): ``required`` and named choices
go through guided decoding (ids ``chatcmpl-tool-<16 hex>``, content ``""``);
``auto`` goes through the server's tool parser (qwen3_coder: ids ``call_<24 hex>``,
header delta carrying ``arguments: "{"``, one fragment per parameter; hermes: per-token
argument fragments).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from . import tokens as tok
from .generation import Step

_VERBS = {
    "get",
    "set",
    "list",
    "fetch",
    "do",
    "run",
    "make",
    "call",
    "create",
    "update",
    "read",
    "query",
    "retrieve",
    "check",
    "find",
    "lookup",
    "the",
    "for",
    "and",
    "current",
    "info",
}
_NOT_NAMES = {
    "I",
    "What",
    "Whats",
    "Please",
    "Tell",
    "Can",
    "Could",
    "Would",
    "How",
    "Which",
    "When",
    "Where",
    "Who",
    "Why",
    "Is",
    "Are",
    "Do",
    "Does",
    "The",
    "A",
    "An",
    "And",
    "Also",
    "Then",
    "Use",
    "Call",
    "Get",
    "Give",
    "Show",
    "Find",
    "Check",
    "Look",
    "Search",
}
_QUERY_NAMES = {"query", "q", "text", "prompt", "message", "input", "question", "search"}


def tool_functions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            out.append(fn)
    return out


def _keywords(name: str) -> set[str]:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    words = {w.lower() for w in re.split(r"[_\-\s.]+", spaced) if w}
    return {w for w in words if len(w) >= 3 and w not in _VERBS}


def _mentions(prompt: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word)}(?:s|es)?\b", prompt, re.I) is not None


def matching(prompt: str, functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hits = []
    for fn in functions:
        name = str(fn["name"])
        if _mentions(prompt, name) or any(_mentions(prompt, k) for k in _keywords(name)):
            hits.append(fn)
    return hits


def _candidates(prompt: str) -> list[str]:
    found = []
    for m in re.finditer(r"[A-Z][a-zA-Z]+(?: [A-Z][a-zA-Z]+)*", prompt):
        word = m.group(0)
        before = prompt[: m.start()].rstrip()
        if not before or before[-1] in ".!?":
            _first, _, rest = word.partition(" ")
            if not rest:
                continue
            word = rest  # "What Paris" can't happen, but "Is New York" -> "New York"
        if word.split(" ")[0] in _NOT_NAMES or word in found:
            continue
        found.append(word)
    return found


def _numbers(prompt: str) -> list[str]:
    return re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?", prompt)


def synth_args(
    fn: dict[str, Any], prompt: str, pinned: dict[str, Any] | None = None
) -> dict[str, Any]:
    params = fn.get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or [])
    strings = _candidates(prompt)
    numbers = _numbers(prompt)
    args: dict[str, Any] = {}
    for name, schema in props.items():
        schema = schema if isinstance(schema, dict) else {}
        if pinned and name in pinned:
            args[name] = pinned[name]
            continue
        kind = schema.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        enum = schema.get("enum")
        value: Any = None
        if enum:
            named = [e for e in enum if isinstance(e, str) and _mentions(prompt, e)]
            value = named[0] if named else (enum[0] if name in required else None)
        elif kind == "string":
            if name.lower() in _QUERY_NAMES:
                value = prompt.strip() or None
            elif strings:
                value = strings.pop(0)
            elif name in required:
                value = "example"
        elif kind in ("integer", "number"):
            if numbers:
                raw = numbers.pop(0)
                value = int(float(raw)) if kind == "integer" else float(raw)
                if kind == "number" and float(value).is_integer():
                    value = int(value)  # qwen3_coder's parser turns 20.0 into 20
            elif name in required:
                value = 1
        elif kind == "boolean":
            value = True if name in required else None
        elif kind == "array":
            value = [] if name in required else None
        elif kind == "object":
            value = {} if name in required else None
        if value is not None:
            args[name] = value
    return args


def choose_calls(
    prompt: str,
    functions: list[dict[str, Any]],
    choice: Any,
    after_tool: bool,
) -> list[tuple[str, dict[str, Any]]]:
    """[(name, arguments)] the model calls; [] means it answers in text."""
    if isinstance(choice, dict):
        name = str((choice.get("function") or {}).get("name", ""))
        fn = next(f for f in functions if f["name"] == name)
        return [(name, synth_args(fn, prompt))]
    if choice == "none" or not functions:
        return []
    hits = [] if (after_tool and choice == "auto") else matching(prompt, functions)
    if not hits:
        if choice != "required":
            return []
        hits = functions[:1]
    if len(hits) >= 2:
        return [(str(fn["name"]), synth_args(fn, prompt)) for fn in hits]
    fn = hits[0]
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    first_str = next(
        (
            n
            for n in params.get("required") or []
            if isinstance(props.get(n), dict)
            and props[n].get("type", "string") == "string"
            and not props[n].get("enum")
            and n.lower() not in _QUERY_NAMES
        ),
        None,
    )
    cands = _candidates(prompt)
    if first_str and len(cands) >= 2 and re.search(r"\band\b", prompt):
        return [(str(fn["name"]), synth_args(fn, prompt, {first_str: c})) for c in cands[:4]]
    return [(str(fn["name"]), synth_args(fn, prompt))]


def as_strings(args: dict[str, Any]) -> dict[str, Any]:
    """Fault tool-args-strings: every value typed as a string."""
    out: dict[str, Any] = {}
    for k, v in args.items():
        if isinstance(v, str):
            out[k] = v
        elif isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (dict, list)):
            out[k] = json.dumps(v)
        else:
            out[k] = str(v)
    return out


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def guided_id() -> str:
    return "chatcmpl-tool-" + secrets.token_hex(8)


def _swallow(text: str, index: int) -> list[Step]:
    return [Step(t, None, markup=t, call_index=index) for t in tok.tokenize(text)]


def required_steps(calls: list[tuple[str, dict[str, Any]]]) -> list[Step]:
    """tool_choice "required": guided JSON ``[{"name": ..., "parameters": {...}}]``."""
    steps: list[Step] = []
    for i, (name, args) in enumerate(calls):
        call_id = guided_id()
        arguments = json.dumps(args, ensure_ascii=False)
        prefix = ("[" if i == 0 else ", ") + f'{{"name": "{name}", "parameters": '
        head = _swallow(prefix, i)
        head[-1].delta = {
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "index": i, "function": {"name": name}}
            ],
        }
        steps += head
        for t in tok.tokenize(arguments):
            delta = {"content": None, "tool_calls": [{"index": i, "function": {"arguments": t}}]}
            steps.append(Step(t, delta, markup=t, call_index=i))
        tail = _swallow("}" + ("]" if i == len(calls) - 1 else ""), i)
        tail[-1].call = _call(call_id, name, arguments)
        steps += tail
    return steps


def named_steps(name: str, args: dict[str, Any]) -> list[Step]:
    """Named tool_choice: guided JSON of the arguments; the first delta carries the name."""
    call_id = guided_id()
    arguments = json.dumps(args, ensure_ascii=False)
    steps = []
    for j, t in enumerate(tok.tokenize(arguments)):
        if j == 0:
            entry: dict[str, Any] = {
                "id": call_id,
                "type": "function",
                "index": 0,
                "function": {"name": name, "arguments": t},
            }
        else:
            entry = {"index": 0, "function": {"arguments": t}}
        steps.append(Step(t, {"tool_calls": [entry]}, markup=t, call_index=0))
    steps[-1].call = _call(call_id, name, arguments)
    return steps


def _xml_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False)


def qwen3_coder_markup(calls: list[tuple[str, dict[str, Any]]]) -> str:
    blocks = []
    for name, args in calls:
        params = "".join(
            f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in args.items()
        )
        blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
    return "\n".join(blocks)


def hermes_markup(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": n, "arguments": a}, ensure_ascii=False)
        + "\n</tool_call>"
        for n, a in calls
    )


def qwen3_coder_steps(calls: list[tuple[str, dict[str, Any]]]) -> list[Step]:
    """The qwen3_coder parser: header at ``<function=NAME>`` with ``arguments: "{"``, one
    fragment per complete parameter, ``}`` at ``</function>``."""
    steps: list[Step] = []
    for i, (name, args) in enumerate(calls):
        call_id = "call_" + secrets.token_hex(12)
        head = _swallow(("\n" if i else "") + f"<tool_call>\n<function={name}>", i)
        head[-1].delta = {
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "index": i,
                    "function": {"name": name, "arguments": "{"},
                }
            ]
        }
        steps += head
        for j, (k, v) in enumerate(args.items()):
            part = _swallow(f"\n<parameter={k}>\n{_xml_value(v)}\n</parameter>", i)
            frag = (
                "" if j == 0 else ", "
            ) + f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
            part[-1].delta = {"tool_calls": [{"index": i, "function": {"arguments": frag}}]}
            steps += part
        close = _swallow("\n</function>", i)
        close[-1].delta = {"tool_calls": [{"index": i, "function": {"arguments": "}"}}]}
        steps += close
        tail = _swallow("\n</tool_call>", i)
        tail[-1].call = _call(call_id, name, json.dumps(args, ensure_ascii=False))
        steps += tail
    return steps


def hermes_steps(calls: list[tuple[str, dict[str, Any]]]) -> list[Step]:
    """The hermes parser: header once the name is complete, then argument fragments."""
    steps: list[Step] = []
    for i, (name, args) in enumerate(calls):
        call_id = guided_id()
        arguments = json.dumps(args, ensure_ascii=False)
        head = _swallow(("\n" if i else "") + f'<tool_call>\n{{"name": "{name}", "arguments": ', i)
        head[-1].delta = {
            "tool_calls": [
                {"id": call_id, "type": "function", "index": i, "function": {"name": name}}
            ]
        }
        steps += head
        for t in tok.tokenize(arguments):
            delta = {"tool_calls": [{"index": i, "function": {"arguments": t}}]}
            steps.append(Step(t, delta, markup=t, call_index=i))
        tail = _swallow("}\n</tool_call>", i)
        tail[-1].call = _call(call_id, name, arguments)
        steps += tail
    return steps


def drop_argument_fragments(steps: list[Step]) -> None:
    """Fault tool-args-unstreamed: the header arrives (arguments empty), fragments never do."""
    for step in steps:
        calls = (step.delta or {}).get("tool_calls")
        if not calls:
            continue
        function = calls[0].get("function", {})
        if "name" in function:
            if "arguments" in function:
                function["arguments"] = ""
        else:
            step.delta = None


def drop_header_type(steps: list[Step]) -> None:
    """Fault tool-delta-no-type: the streamed header delta of a call carries no ``type``.

    vLLM's named tool_choice streaming path built its first ``DeltaToolCall`` without
    ``type="function"``, and chunks are serialised with ``exclude_unset=True``, so the key
    never reached the wire (vllm-project/vllm#16340, "Missing "type":"function" in
    OpenAI-Compatible Streaming Tool Calls with specific tool_choice", vLLM 0.8.x, Qwen2.5
    with --tool-call-parser hermes)::

        data: {..."delta":{"tool_calls":[{"id":"chatcmpl-tool-...","index":0,
               "function":{"name":"get_weather","arguments":"{\\""}}]}...}

    OpenAI's chunk schema makes ``type`` optional (only ``index`` is required), so the
    bytes are valid; but the openai SDK's stream helper (``ChatCompletionStreamState``,
    behind ``client.chat.completions.stream()``) types a call from its first delta's
    ``type``: the call stays untyped, no ``tool_calls.function.arguments.*`` event is
    emitted, and ``get_final_completion()`` gives ``type=None``. The non-streaming
    message keeps its ``type`` (that path was right)."""
    for step in steps:
        for call in (step.delta or {}).get("tool_calls") or ():
            if "name" in (call.get("function") or {}):
                call.pop("type", None)
