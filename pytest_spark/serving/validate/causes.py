"""Which one verdict a serving check's failure belongs to (one root cause, one failure).

Pure: requests' outcomes and findings in, a ``Finding`` or a skip reason out. The wire
verdicts own a broken wire (a stream whose framing is not ``data: {json}`` events ending in
``data: [DONE]``, a JSON body that does not parse): a dependent request that failed the same
way skips citing them. The single-stream decode verdict owns a slow decode: the aggregate
check at several streams skips citing it when the streams scaled as the profile expects.
The goodput gate (the closed-loop sweep at ``slo.concurrency``, run every time) owns SLOs
that break under load: the open-loop knee (run by option) skips citing it when the knee
is under its floor and the closed loop already broke the same SLOs.
"""

from __future__ import annotations

from dataclasses import replace

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.client.stream import ServingError, StreamResult
from pytest_spark.serving.load.slo import LABELS, Goodput

# The wire verdicts (tests_e2e/test_readiness.py): the canary request, streamed and not.
STREAM_VERDICT = "test_stream_wire"
BODY_VERDICT = "test_canary_completion"
DECODE_VERDICT = "test_decode_single_stream"
GOODPUT_VERDICT = "test_goodput"
# ServingError kinds that are the wire's (tests_e2e's requests all read it the same way).
STREAM_KINDS = frozenset({"malformed-sse", "truncated", "not-sse"})
BODY_KINDS = frozenset({"not-json"})
SSE_EXPECTED = "text/event-stream of data: {json} events, each a JSON object, then data: [DONE]"
STREAM_FIX = (
    "Every streaming check (tool calls, reasoning, throughput) reads this framing. Usually "
    "a proxy between the suite and vLLM that rewrites, buffers or cuts the stream (nginx "
    "proxy_buffering, an idle or body-size limit): ask the server's port directly; else a "
    "vLLM bug in its streaming path: upgrade vLLM (or pin a build without it)"
)
BODY_FIX = (
    "Every non-streaming check reads this body. Usually a proxy between the suite and vLLM "
    "that cuts or rewrites responses (a body-size or gzip setting): ask the server's port "
    "directly; else a vLLM bug: upgrade vLLM (or pin a build without it)"
)


def wire_verdict(kind: str) -> str | None:
    """The verdict that owns a failure of this ``ServingError`` kind, if it is the wire's."""
    if kind in STREAM_KINDS:
        return STREAM_VERDICT
    if kind in BODY_KINDS:
        return BODY_VERDICT
    return None


def check_stream_wire(outcome: StreamResult | ServingError, *, server: str) -> Finding:
    """The canary stream is SSE: ``data:`` events, each a JSON object, ended by
    ``data: [DONE]`` (``stream.stream_chat`` reads it exactly and raises on the rest)."""
    if isinstance(outcome, ServingError):
        fix = STREAM_FIX if outcome.kind in STREAM_KINDS else "read the head's container log"
        return Finding.failed(
            outcome.kind,
            SSE_EXPECTED,
            message=f"{server}: streamed canary chat completion: {outcome.message}; expected "
            f"{SSE_EXPECTED}. {fix}",
            evidence=outcome.exchange.evidence(failure=outcome.kind),
        )
    return Finding.passed(
        outcome.count,
        SSE_EXPECTED,
        "events",
        message=f"{server}: {outcome.count} SSE events, each a JSON object, ended by data: [DONE]",
    )


def body_failure(error: ServingError, *, server: str) -> Finding:
    """The plain canary's failure: a JSON body that does not parse is the wire's."""
    finding = error.finding(f"{server}: canary chat completion", "a JSON chat completion")
    if error.kind not in BODY_KINDS:
        return finding
    return replace(finding, message=f"{finding.message}. {BODY_FIX}")


def wire_cause(kind: str, message: str, probe: ServingError | None) -> str | None:
    """The skip reason of a dependent request that failed with ``kind`` when the wire
    verdict's own canary failed the same way (``probe``); None when the failure is not
    the wire's or the canary got through (then the dependent reports it)."""
    verdict = wire_verdict(kind)
    if verdict is None or probe is None or wire_verdict(probe.kind) != verdict:
        return None
    what = "SSE stream" if verdict == STREAM_VERDICT else "JSON body"
    return (
        f"{trim(message, 200)}: the server's {what} is broken for every request, the "
        f"canary's too: {trim(probe.message, 160)} ({verdict} has the evidence)"
    )


def decode_explains_aggregate(
    aggregate: float, aggregate_floor: float, decode: float | None, decode_floor: float
) -> bool:
    """Whether a low aggregate tok/s at several streams is the slow single-stream decode's
    consequence: the decode is under its floor and the streams scaled at least as well as
    the profile expects of them (aggregate / decode >= aggregate_floor / decode_floor).
    Streams that did not scale (batching limited, a queue) are a cause of their own."""
    if decode is None or decode <= 0 or decode >= decode_floor or decode_floor <= 0:
        return False
    return aggregate < aggregate_floor and aggregate / decode >= aggregate_floor / decode_floor


def decode_explains_goodput(worst: str | None, decode: float | None, decode_floor: float) -> bool:
    """Whether goodput lost to slow decode steps (TPOT broken most, or the E2E latency they
    make) is the slow single-stream decode's consequence: the decode is under its floor."""
    return worst in ("tpot", "e2e") and decode is not None and decode < decode_floor


def knee_cause(
    closed: Goodput | None,
    concurrency: int,
    min_goodput_pct: float,
    decode: float | None,
    decode_floor: float,
    *,
    decode_verdict: bool = True,
) -> str | None:
    """Why an open-loop knee under its floor is not its own failure: the closed-loop sweep's
    level at ``slo.concurrency`` (its goodput ``closed``) already broke the same SLOs, so the
    goodput gate owns the cause, or the decode verdict where the goodput gate itself cites it
    (goodput lost to a slow decode; ``decode_verdict``: that verdict runs). None when the
    closed loop met the SLOs or has no such level: the knee reports the capacity itself."""
    if closed is None or closed.meets(min_goodput_pct):
        return None
    worst = closed.worst()
    said = (
        f"the SLOs already break in the closed loop: goodput {closed.share_pct:.1f}% at "
        f"{concurrency} streams, expected >= {min_goodput_pct:g}%, most broken: "
        f"{LABELS.get(worst or '', 'request errors')}"
    )
    if decode_verdict and decode_explains_goodput(worst, decode, decode_floor):
        return (
            f"{said}, each stream slow: single-stream decode {decode:.1f} tok/s, expected >= "
            f"{decode_floor:g} ({DECODE_VERDICT} has the evidence)"
        )
    return f"{said} ({GOODPUT_VERDICT} has the evidence)"


def cited_verdict(verdict: str, here: str, finding: Finding) -> str:
    """The skip reason of a check whose failure is the verdict's (the verdict's own finding
    ``finding``, failed): what it says, and where the evidence is."""
    return (
        f"{here}: the same failure as {verdict}: {trim(finding.message, 240)} "
        f"({verdict} has the evidence)"
    )


def trim(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters (a message quoted inside another)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
