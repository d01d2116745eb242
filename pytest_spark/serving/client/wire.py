"""Version-dependent wire facts, detected from what the server sends (never configured).

- reasoning text: ``reasoning_content`` (vLLM <= 0.11.0), both (~0.11.1-0.15), ``reasoning``
  (>= 0.16);
- error body: nested ``{"error": {...}}`` (>= 0.10.1) or flat ``{"object": "error", ...}``;
- KV-cache metric: ``vllm:kv_cache_usage_perc`` or, before ~0.12, ``vllm:gpu_cache_usage_perc``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

REASONING_FIELDS = ("reasoning", "reasoning_content")
KV_CACHE_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")

# vLLM's 400 for tool_choice "auto" on a server without the tool flags (serving_chat.py).
_AUTO_REFUSED = re.compile(
    r'"?auto"?\s+tool choice requires\s+--enable-auto-tool-choice\s+and\s+--tool-call-parser', re.I
)
MISCONFIGURED_TOOLS = "server started without --enable-auto-tool-choice --tool-call-parser"


def samples(text: str) -> Iterator[Sample]:
    """Every sample of a Prometheus text exposition (prometheus_client's ``Sample``: name,
    labels, value). A text the parser refuses as a whole (one bad line) is parsed line by
    line, leaving out the lines it refuses."""
    try:
        parsed = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError:
        parsed = []
        for line in text.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            try:
                parsed.extend(
                    s
                    for family in text_string_to_metric_families(line + "\n")
                    for s in family.samples
                )
            except ValueError:
                continue
    yield from parsed


@dataclass(frozen=True)
class Reasoning:
    """The reasoning text of a message or delta and the field(s) that carried it."""

    text: str | None
    fields: tuple[str, ...]  # fields present with a non-null value
    null_fields: tuple[str, ...]  # fields present but null (the server knows the name)

    @property
    def field(self) -> str | None:
        """``reasoning``, ``reasoning_content`` or ``reasoning+reasoning_content``."""
        return "+".join(self.fields) or None


def reasoning_of(obj: Mapping[str, Any]) -> Reasoning:
    present = tuple(f for f in REASONING_FIELDS if obj.get(f) is not None)
    nulls = tuple(f for f in REASONING_FIELDS if f in obj and obj[f] is None)
    text = None
    for name in present:
        value = obj[name]
        text = value if isinstance(value, str) else json.dumps(value)
        break
    return Reasoning(text, present, nulls)


ErrorShape = Literal["nested", "flat", "other", "not-json", "empty"]


@dataclass(frozen=True)
class ErrorBody:
    """An error response body, whichever shape the server version uses."""

    shape: ErrorShape
    message: str
    type: str | None = None
    code: Any = None
    param: Any = None

    @property
    def auto_tool_choice_refused(self) -> bool:
        """The 400 a server without ``--enable-auto-tool-choice`` gives ``auto``."""
        return bool(_AUTO_REFUSED.search(self.message))


def parse_error_body(text: str) -> ErrorBody:
    if not text.strip():
        return ErrorBody("empty", "")
    try:
        data = json.loads(text)
    except ValueError:
        return ErrorBody("not-json", text.strip()[:500])
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return ErrorBody(
            "nested",
            str(err.get("message", "")),
            _opt(err.get("type")),
            err.get("code"),
            err.get("param"),
        )
    if isinstance(data, dict) and data.get("object") == "error":
        return ErrorBody(
            "flat",
            str(data.get("message", "")),
            _opt(data.get("type")),
            data.get("code"),
            data.get("param"),
        )
    if isinstance(data, dict):
        for key in ("error", "detail", "message"):
            if key in data:
                value = data[key]
                msg = value if isinstance(value, str) else json.dumps(value)
                return ErrorBody("other", msg)
    return ErrorBody("other", text.strip()[:500])


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: sample name (no labels) -> sum over its label sets.

    Parsed by prometheus_client's own text parser (``pytest_spark.serving.load.metricsnap``); a
    line it refuses is left out and the rest still counts, as a scrape keeps going."""
    out: dict[str, float] = {}
    for sample in samples(text):
        out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def kv_cache_metric(metrics: Mapping[str, float]) -> str | None:
    """The KV-cache usage metric name this server version exports, or None."""
    return next((name for name in KV_CACHE_METRICS if name in metrics), None)
