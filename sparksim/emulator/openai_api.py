"""``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/tokenize``: request
checks, response shapes and the SSE stream, as the vLLM 0.32 transcripts show them.

Shapes to keep: compact JSON; message keys ``role, content, refusal, annotations, audio,
function_call, [tool_calls], reasoning``; first stream chunk ``{"role":"assistant",
"content":""}`` with top-level ``prompt_token_ids``/``prompt_text``; later chunks carry
``token_ids: null``; the finishing chunk adds ``stop_reason``; ``system_fingerprint`` goes on
the usage chunk (``choices: []``) or, without ``include_usage``, on the finishing chunk.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import TYPE_CHECKING, Any

from . import errors as err
from . import logprobs as lp
from . import reasoning as rsn
from . import structured as so
from . import tokens as tok
from . import toolcalls as tc
from .config import version_tuple
from .generation import Plan, Step, answer_text, content_steps, eos_step
from .jobs import Job, Responder, send_body
from .plans import build_chat_plan, thinking_enabled

if TYPE_CHECKING:
    from .engine import Engine


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw.decode("utf-8") if raw else "")
    except (ValueError, UnicodeDecodeError) as exc:
        pos = getattr(exc, "pos", 0)
        msg = getattr(exc, "msg", "Expecting value")
        raise err.validation(
            "json_invalid", f"body.{pos}", "JSON decode error", {}, {"error": msg}
        ) from None
    if not isinstance(body, dict):
        raise err.validation(
            "model_attributes_type",
            "body",
            "Input should be a valid dictionary or object to extract fields from",
            body,
        )
    return body


def request_id(engine: Engine, headers: dict[str, str], prefix: str) -> str:
    given = headers.get("x-request-id")
    if given:
        return f"{prefix}-{given}"
    width = 8 if version_tuple(engine.knobs.version) >= (0, 12, 0) else 16
    return f"{prefix}-{secrets.token_hex(width)}"


def resolve_model(engine: Engine, body: dict[str, Any]) -> str:
    model = body.get("model")
    served = engine.args.served_names
    if model is None or model == "":
        return served[0]
    if model not in served:
        error = err.model_not_found(str(model), served)
        engine.log.error(
            engine.api_prefix,
            "serving.py:274",
            f"Error with model error=ErrorInfo(message={error.message!r}, type='NotFoundError',"
            " param='model', code=404)",
        )
        raise error
    return str(model)


def models(engine: Engine) -> dict[str, Any]:
    now = int(time.time())
    data = []
    for name in engine.args.served_names:
        data.append(
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "vllm",
                "root": engine.args.model,
                "parent": None,
                "max_model_len": engine.args.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{secrets.token_hex(8)}",
                        "object": "model_permission",
                        "created": now,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        )
    return {"object": "list", "data": data}


def tokenize(engine: Engine, raw: bytes) -> dict[str, Any]:
    body = parse_body(raw)
    resolve_model(engine, body)
    if "messages" in body:
        thinking = thinking_enabled(engine, body)
        text = tok.render_chat(
            body["messages"], body.get("tools"), rsn.think_prefix(engine.reasoning_on, thinking)
        )
    else:
        text = str(body.get("prompt", ""))
    pieces = tok.tokenize(text)
    return {
        "count": len(pieces),
        "max_model_len": engine.args.max_model_len,
        "tokens": [tok.token_id(p) for p in pieces],
        "token_strs": pieces if body.get("return_token_strs") else None,
    }


def detokenize(engine: Engine, raw: bytes) -> dict[str, Any]:
    body = parse_body(raw)
    resolve_model(engine, body)
    ids = body.get("tokens") or []
    return {"prompt": tok.detokenize([int(i) for i in ids])}


def _usage(p: int, c: int, details: bool) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}
    if details:
        usage["prompt_tokens_details"] = None
        usage["completion_tokens_details"] = None
    return usage


def _check_common(body: dict[str, Any]) -> tuple[int | None, bool, bool, bool, bool]:
    max_tokens = err.check_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = err.check_int(body, "max_tokens", 1)
    stream = err.check_bool(body, "stream")
    ignore_eos = err.check_bool(body, "ignore_eos")
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    continuous = include_usage and bool(opts.get("continuous_usage_stats"))
    return max_tokens, stream, ignore_eos, include_usage, continuous


def chat_completions(engine: Engine, raw: bytes, headers: dict[str, str], out: Responder) -> None:
    body = parse_body(raw)
    if "messages" not in body:
        raise err.validation("missing", "body.messages", "Field required", body)
    messages = body["messages"]
    if not isinstance(messages, list):
        raise err.validation("list_type", "body.messages", "Input should be a valid list", messages)
    model = resolve_model(engine, body)
    max_tokens, stream, ignore_eos, include_usage, continuous = _check_common(body)
    functions = tc.tool_functions(body.get("tools") or [])
    choice = body.get("tool_choice", "auto" if functions else "none")
    if (
        functions
        and choice == "auto"
        and not (engine.args.auto_tool_choice and engine.args.tool_call_parser)
    ):
        raise err.bad_request(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in {f["name"] for f in functions}:
            raise err.validation(
                "value_error",
                "body",
                f"Value error, Tool '{name}' has not been passed in `tools`.",
                body,
            )
    so.requested(body)  # vLLM's 400 for a bad response_format, before any scheduling
    thinking = engine.reasoning_on and thinking_enabled(engine, body)
    rendered = tok.render_chat(
        messages, body.get("tools"), rsn.think_prefix(engine.reasoning_on, thinking)
    )
    prompt_tokens = tok.count(rendered)
    budget = err.context_errors(prompt_tokens, max_tokens, engine.args.max_model_len)
    prompt = ""
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            prompt = tok.message_text(msg.get("content"))
            break
    engine.check_serving()
    plan = build_chat_plan(engine, body, prompt)
    finish = plan.fit(budget, ignore_eos)
    auto_parser = bool(functions) and choice == "auto" and engine.args.tool_call_parser is not None
    job = Job(
        engine,
        request_id(engine, headers, "chatcmpl"),
        model,
        prompt_tokens,
        max_tokens,
        tok.ids(rendered),
    )
    if not stream:
        job.run_silent(plan.steps, out.gone)
        reasoning, content, calls = plan.message_parts()
        if auto_parser:
            engine.metrics.tool_parser_call("non_streaming", bool(calls))
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if calls:
            message["tool_calls"] = calls
        for field in engine.reasoning_fields:
            message[field] = reasoning
        if finish == "tool_calls" and not calls:
            finish = "stop"
        response = {
            "id": job.rid,
            "object": "chat.completion",
            "created": job.created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": plan.stop_reason,
                    "token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": engine.fingerprint,
            "usage": _usage(prompt_tokens, len(plan.steps), True),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
        job.finish(finish, len(plan.steps))
        send_body(engine, out, response)
        return

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        base = {
            "id": job.rid,
            "object": "chat.completion.chunk",
            "created": job.created,
            "model": model,
        }
        base["choices"] = choices
        base.update(extra)
        return base

    first = chunk(
        [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        prompt_token_ids=None,
        prompt_text=None,
    )

    def step_chunk(i: int, step: Step, last: bool) -> dict[str, Any] | None:
        if auto_parser:
            engine.metrics.tool_parser_call("streaming", step.markup != "")
        if step.delta is None and not last:
            return None
        delta = step.delta if step.delta is not None else {}
        if last:
            choice_obj = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": plan.stop_reason,
                "token_ids": None,
            }
        else:
            choice_obj = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": None,
                "token_ids": None,
            }
        extra: dict[str, Any] = {}
        if continuous:
            extra["usage"] = _usage(prompt_tokens, i + 1, False)
        if last and not include_usage:
            extra["system_fingerprint"] = engine.fingerprint
        return chunk([choice_obj], **extra)

    usage_chunk = None
    if include_usage:
        usage_chunk = chunk(
            [],
            usage=_usage(prompt_tokens, len(plan.steps), False),
            system_fingerprint=engine.fingerprint,
        )
    job.run_stream(out, plan.steps, first, step_chunk, usage_chunk, finish)


def _k(body: dict[str, Any], key: str) -> bool:
    """A logprobs count asked for (an integer >= 0; vLLM refuses other values with a 400)."""
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise err.validation("int_type", f"body.{key}", "Input should be a valid integer", value)
    return True


def completions(engine: Engine, raw: bytes, headers: dict[str, str], out: Responder) -> None:
    body = parse_body(raw)
    if "prompt" not in body:
        raise err.validation("missing", "body.prompt", "Field required", body)
    model = resolve_model(engine, body)
    max_tokens, stream, ignore_eos, include_usage, _ = _check_common(body)
    if max_tokens is None:
        max_tokens = 16  # the completions API default
    prompt = body["prompt"]
    if isinstance(prompt, list):
        prompt = (
            "".join(str(p) for p in prompt)
            if all(isinstance(p, str) for p in prompt)
            else " ".join(map(str, prompt))
        )
    prompt_tokens = tok.count(str(prompt))
    budget = err.context_errors(prompt_tokens, max_tokens, engine.args.max_model_len)
    engine.check_serving()
    faults = engine.faults.names()
    garble = engine.garbles(faults)
    text = " " + answer_text(str(prompt), garble=garble)
    plan = Plan(steps=[*content_steps(text), eos_step()], pad_text=text)
    scored_prompt = (
        lp.prompt_logprobs(str(prompt), faults, garble) if _k(body, "prompt_logprobs") else None
    )
    echo = bool(body.get("echo")) and _k(body, "logprobs")
    finish = plan.fit(budget, ignore_eos)
    job = Job(
        engine,
        request_id(engine, headers, "cmpl"),
        model,
        prompt_tokens,
        max_tokens,
        tok.ids(str(prompt)),
    )
    if not stream:
        job.run_silent(plan.steps, out.gone)
        response = {
            "id": job.rid,
            "object": "text_completion",
            "created": job.created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": (str(prompt) if echo else "") + "".join(s.content for s in plan.steps),
                    "logprobs": lp.echo_logprobs(str(prompt), faults, garble) if echo else None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": None,
                    "prompt_logprobs": scored_prompt,
                    "prompt_token_ids": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": engine.fingerprint,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + len(plan.steps),
                "completion_tokens": len(plan.steps),
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
        }
        job.finish(finish, len(plan.steps))
        send_body(engine, out, response)
        return

    def step_chunk(i: int, step: Step, last: bool) -> dict[str, Any] | None:
        return {
            "id": job.rid,
            "object": "text_completion",
            "created": job.created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": step.content,
                    "logprobs": None,
                    "finish_reason": finish if last else None,
                    "stop_reason": None,
                }
            ],
        }

    usage_chunk = None
    if include_usage:
        usage_chunk = {
            "id": job.rid,
            "object": "text_completion",
            "created": job.created,
            "model": model,
            "choices": [],
            "usage": _usage(prompt_tokens, len(plan.steps), False),
        }
    job.run_stream(out, plan.steps, None, step_chunk, usage_chunk, finish)
