"""Serving checks: tool calls, reasoning, throughput against an OpenAI-compatible API.

Three parts, one way: ``client`` (talk to the API, read SSE exactly, keep the evidence) <-
``load`` (sweeps, soak, SLOs, /metrics) <- ``validate`` (turn what the server sent into
``Finding``s). This module is the public surface the suite imports (``__all__``).

May import: checks, facts, parsers, access, settings.
"""

from pytest_spark.serving.client.chat import ServingClient, TurnCache
from pytest_spark.serving.client.evidence import Exchange, redact_headers
from pytest_spark.serving.client.stream import (
    ServingError,
    SSEDecoder,
    StreamResult,
    astream_chat,
    post_json,
    stream_chat,
)
from pytest_spark.serving.client.turn import ToolCall, Turn, assemble, from_response, from_stream
from pytest_spark.serving.client.wire import (
    MISCONFIGURED_TOOLS,
    ErrorBody,
    kv_cache_metric,
    parse_error_body,
    parse_metrics,
    reasoning_of,
)
from pytest_spark.serving.load.stats import Summary, percentile
from pytest_spark.serving.load.sweep import (
    LevelResult,
    LoadClient,
    LoadSpec,
    SweepResult,
    run_sweep,
)
from pytest_spark.serving.validate.reasoning import (
    NO_REASONING_FIELD,
    check_order,
    check_reasoning,
    check_reasoning_then_tool,
    check_thinking_disabled,
    check_truncated,
    compare_stream,
)
from pytest_spark.serving.validate.schema import validate
from pytest_spark.serving.validate.tools import (
    ToolRequest,
    auto_declined,
    check_auto_refused,
    check_tool_calls,
    compare_arguments,
)

__all__ = [
    "MISCONFIGURED_TOOLS",
    "NO_REASONING_FIELD",
    "ErrorBody",
    "Exchange",
    "LevelResult",
    "LoadClient",
    "LoadSpec",
    "SSEDecoder",
    "ServingClient",
    "ServingError",
    "StreamResult",
    "Summary",
    "SweepResult",
    "ToolCall",
    "ToolRequest",
    "Turn",
    "TurnCache",
    "assemble",
    "astream_chat",
    "auto_declined",
    "check_auto_refused",
    "check_order",
    "check_reasoning",
    "check_reasoning_then_tool",
    "check_thinking_disabled",
    "check_tool_calls",
    "check_truncated",
    "compare_arguments",
    "compare_stream",
    "from_response",
    "from_stream",
    "kv_cache_metric",
    "parse_error_body",
    "parse_metrics",
    "percentile",
    "post_json",
    "reasoning_of",
    "redact_headers",
    "run_sweep",
    "stream_chat",
    "validate",
]
