"""What the emulated model generates for a chat request, token by token: reasoning (qwen3
parser), then a text answer or tool calls on the wire path vLLM would use, with the
content-level faults applied."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import reasoning as rsn
from . import structured as so
from . import toolcalls as tc
from .faults import NATIVE_SHARE
from .generation import (
    Plan,
    Step,
    answer_text,
    content_steps,
    eos_step,
    exact_tokens,
    reasoning_text,
)
from .needle import beyond_native

if TYPE_CHECKING:
    from .engine import Engine


def thinking_enabled(engine: Engine, body: dict[str, Any]) -> bool:
    kwargs = dict(engine.args.default_chat_kwargs)
    kwargs.update(body.get("chat_template_kwargs") or {})
    return bool(kwargs.get("enable_thinking", True))


def build_chat_plan(engine: Engine, body: dict[str, Any], prompt: str) -> Plan:
    """The model's output for this request, token by token."""
    faults = engine.faults.names()
    messages = body["messages"]
    after_tool = (
        bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"
    )
    functions = tc.tool_functions(body.get("tools") or [])
    choice = body.get("tool_choice", "auto" if functions else "none")
    calls = tc.choose_calls(prompt, functions, choice, after_tool)
    guided = bool(calls) and (isinstance(choice, dict) or choice == "required")
    garble = engine.garbles(faults)
    # A broken model under auto writes its numbers as strings (the perturbed real model:
    # "$.days: "2" is a string"); guided decoding (required, named) keeps the schema's types.
    if "tool-args-strings" in faults or (garble and not guided):
        calls = [(n, tc.as_strings(a)) for n, a in calls]
    thinking = engine.reasoning_on and thinking_enabled(engine, body)
    fields = engine.reasoning_fields
    steps: list[Step] = []
    plan = Plan(steps=steps)
    if thinking:
        names = ", ".join(dict.fromkeys(n for n, _ in calls))
        hint = f"I should call the {names} tool." if calls else "I can answer this directly."
        text = reasoning_text(prompt, engine.knobs.reasoning_tokens, hint)
        newline = "none" if guided else ("content" if engine.keep_think_newlines else "hidden")
        steps += rsn.reasoning_steps(text, fields, faults, newline)
        plan.has_reasoning = True
    parser = engine.args.tool_call_parser or "qwen3_coder"
    if calls and "tool-in-content" in faults and not guided:
        # The tool parser's failure: only under auto. required and named calls come from
        # guided decoding (structured outputs), which no tool parser touches.
        markup = tc.hermes_markup(calls) if parser == "hermes" else tc.qwen3_coder_markup(calls)
        steps += content_steps(markup)
        steps.append(eos_step())
    elif calls and isinstance(choice, dict):
        name, args = calls[0]
        steps += tc.named_steps(name, args)
        if "tool-delta-no-type" in faults:
            tc.drop_header_type(steps)
        steps.append(eos_step({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]}))
        plan.empty_content = ""
    elif calls and choice == "required":
        steps += tc.required_steps(calls)
        steps.append(eos_step({}))
        plan.finish = "tool_calls"
        plan.empty_content = ""
    elif calls:
        steps += tc.hermes_steps(calls) if parser == "hermes" else tc.qwen3_coder_steps(calls)
        if "tool-param-leak" in faults:
            leak = "</parameter>"
            steps.append(Step(leak, {"content": leak}, content=leak))
        steps.append(eos_step())
        plan.finish = "tool_calls"
    else:
        lost = None
        if "context-beyond-native" in faults and not after_tool:
            lost = beyond_native(prompt, engine.args.max_model_len // NATIVE_SHARE)
        text = lost or answer_text(prompt, after_tool, garble)
        fmt = so.requested(body)
        if fmt is not None and "response-format-ignored" not in faults:
            text = so.answer(fmt, prompt, text)  # guided decoding: JSON the format allows
        elif engine.knobs.answer_tokens > 0:
            text = exact_tokens(text, engine.knobs.answer_tokens)
        stop = body.get("stop")
        for s in [stop] if isinstance(stop, str) else (stop or []):
            if isinstance(s, str) and s and s in text:
                text = text[: text.index(s)]
                plan.stop_reason = s
        answer = content_steps(text)
        if engine.reasoning_on and not thinking and "answer-in-reasoning" in faults:
            answer = rsn.answer_into_reasoning(answer, fields)
            plan.has_reasoning = True
        steps += answer
        steps.append(eos_step())
        plan.pad_text = text
    if calls and "tool-args-unstreamed" in faults:
        tc.drop_argument_fragments(steps)
    return plan
