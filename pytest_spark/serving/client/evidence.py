"""Raw evidence of one HTTP exchange (request, response or stream excerpt), key redacted."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REDACTED = "<redacted>"
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key"})
EXCERPT_CHARS = 6000
# Response headers worth keeping; the rest (date, vary...) are noise in a report.
KEPT_RESPONSE_HEADERS = (
    "content-type",
    "content-length",
    "transfer-encoding",
    "server",
    "x-request-id",
)


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers with every credential replaced, so evidence never shows an API key."""
    return {k: (REDACTED if k.lower() in SECRET_HEADERS else v) for k, v in headers.items()}


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` whole when short, else its head and tail around an omission marker."""
    if len(text) <= limit:
        return text
    head = text[: limit * 2 // 3]
    tail = text[-(limit // 3) :]
    return f"{head}\n... ({len(text) - len(head) - len(tail)} characters omitted) ...\n{tail}"


def short(value: Any, limit: int = 120) -> str:
    """One-line quotation of a value for a failure message."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


@dataclass(frozen=True)
class Exchange:
    """One request and what came back: status, headers and the raw body or SSE text.

    ``body`` is the text as received (for a stream: the ``data:`` lines as sent).
    ``status`` is None when no response arrived (connection refused, timeout).
    """

    method: str
    url: str
    request_body: Any = None
    request_headers: Mapping[str, str] = field(default_factory=dict)
    status: int | None = None
    reason: str = ""
    response_headers: Mapping[str, str] = field(default_factory=dict)
    body: str = ""
    streamed: bool = False
    elapsed_s: float | None = None

    def request_text(self) -> str:
        lines = [f"{self.method} {self.url}"]
        lines += [f"{k}: {v}" for k, v in redact_headers(self.request_headers).items()]
        if self.request_body is not None:
            lines += ["", json.dumps(self.request_body, indent=1, ensure_ascii=False)]
        return "\n".join(lines)

    def response_text(self, limit: int = EXCERPT_CHARS) -> str:
        if self.status is None:
            return "(no response)" + (f"\n{self.body}" if self.body else "")
        lines = [f"HTTP {self.status} {self.reason}".rstrip()]
        kept = {k.lower(): v for k, v in self.response_headers.items()}
        lines += [f"{k}: {kept[k]}" for k in KEPT_RESPONSE_HEADERS if k in kept]
        if self.elapsed_s is not None:
            lines.append(f"(elapsed {self.elapsed_s:.3f} s)")
        return "\n".join([*lines, "", excerpt(self.body, limit)])

    def evidence(self, **extra: str) -> dict[str, str]:
        """For ``Finding.evidence``: request (key redacted), response or stream excerpt."""
        key = "stream" if self.streamed else "response"
        return {"request": self.request_text(), key: self.response_text(), **extra}


def sse_lines(body: str, needles: tuple[str, ...], limit: int = 40) -> str:
    """The ``data:`` lines of a stream that contain any of ``needles`` (at most ``limit``,
    numbered as chunks), so a long stream's relevant deltas survive the excerpt."""
    out = []
    n = 0
    for line in body.splitlines():
        if not line.startswith("data:"):
            continue
        n += 1
        if any(needle in line for needle in needles):
            out.append(f"[chunk {n}] {line}")
    if len(out) > limit:
        out = [*out[: limit // 2], f"... ({len(out) - limit} more) ...", *out[-limit // 2 :]]
    return "\n".join(out)
