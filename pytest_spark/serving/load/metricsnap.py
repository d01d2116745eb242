"""vLLM's ``/metrics`` read with prometheus_client's text parser: samples with their labels,
snapshots of the figures the serving checks compare, and the pure checks on them.

Names (vLLM's ``vllm/v1/metrics/loggers.py``): counters ``vllm:prefix_cache_queries`` /
``vllm:prefix_cache_hits`` (tokens; ``vllm:gpu_prefix_cache_*`` in builds before ~0.9),
``vllm:num_preemptions``, ``vllm:request_success{finished_reason}``; gauges
``vllm:num_requests_waiting`` / ``vllm:num_requests_running``; the info gauge
``vllm:cache_config_info{enable_prefix_caching="True|False",...}``. Counters are sampled
as ``<name>_total``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from pytest_spark.access import body
from pytest_spark.serving.client.wire import samples

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
PREEMPTIONS = "vllm:num_preemptions_total"
CACHE_INFO = "vllm:cache_config_info"
SUCCESS = "vllm:request_success_total"
# (queries, hits) counter pairs, newest first.
PREFIX_COUNTERS = (
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
)
# Speculative decoding (vllm/v1/spec_decode/metrics.py SpecDecodingProm; registered only
# with a --speculative-config): counters, labels model_name and engine (+ position).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# request_success reasons that are not a success of the request.
FAILED_REASONS = ("error", "abort")


@dataclass(frozen=True)
class Snapshot:
    """The figures of one ``/metrics`` scrape the checks compare (JSON-ready)."""

    t: float  # the scrape's time (time.time())
    waiting: float | None
    running: float | None
    preemptions: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    failed_requests: float  # request_success{finished_reason=error|abort}
    prefix_caching: bool | None  # cache_config_info's enable_prefix_caching; None: not shown
    # spec decoding counters (drafts, draft tokens, accepted, accepted per position); None:
    # the server exports none (no --speculative-config)
    spec: dict[str, Any] | None = None

    @classmethod
    def of(cls, text: str, t: float) -> Snapshot:
        totals: dict[str, float] = {}
        failed = 0.0
        caching: bool | None = None
        per_pos: dict[int, float] = {}
        for s in samples(text):
            totals[s.name] = totals.get(s.name, 0.0) + s.value
            if s.name == SPEC_PER_POS and s.labels.get("position", "").isdigit():
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            if s.name == SUCCESS and s.labels.get("finished_reason") in FAILED_REASONS:
                failed += s.value
            if s.name == CACHE_INFO and "enable_prefix_caching" in s.labels:
                caching = s.labels["enable_prefix_caching"].lower() == "true"
        queries, hits = next(
            ((q, h) for q, h in PREFIX_COUNTERS if q in totals), PREFIX_COUNTERS[0]
        )
        return cls(
            t,
            totals.get(WAITING),
            totals.get(RUNNING),
            totals.get(PREEMPTIONS),
            totals.get(queries),
            totals.get(hits),
            failed,
            caching,
            _spec_counters(totals, per_pos),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "waiting": self.waiting,
            "running": self.running,
            "preemptions": self.preemptions,
            "prefix_queries": self.prefix_queries,
            "prefix_hits": self.prefix_hits,
            "failed_requests": self.failed_requests,
            "prefix_caching": self.prefix_caching,
            **({"spec": self.spec} if self.spec is not None else {}),
        }


def _spec_counters(
    totals: Mapping[str, float], per_pos: Mapping[int, float]
) -> dict[str, Any] | None:
    if SPEC_DRAFTS not in totals:
        return None
    return {
        "drafts": totals[SPEC_DRAFTS],
        "draft_tokens": totals.get(SPEC_DRAFT_TOKENS, 0.0),
        "accepted": totals.get(SPEC_ACCEPTED, 0.0),
        "per_pos": [per_pos[p] for p in sorted(per_pos)],
    }


def _delta(after: float | None, before: float | None) -> float | None:
    if after is None or before is None:
        return None
    return after - before


async def metrics_text(client: httpx.AsyncClient) -> str | None:
    """One ``GET /metrics``: its text, or None where the server has no vLLM metrics."""
    try:
        resp = await body.arequest(client, "GET", "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200 or resp.cut or "vllm:" not in resp.text:
        return None
    return resp.text


async def scrape(client: httpx.AsyncClient) -> Snapshot | None:
    """One ``GET /metrics`` as a Snapshot; None where the server has no vLLM metrics."""
    text = await metrics_text(client)
    return None if text is None else Snapshot.of(text, time.time())


async def level_metrics(
    client: httpx.AsyncClient, before: Snapshot | None, drain_cap_s: float, poll_s: float = 0.25
) -> dict[str, Any] | None:
    """After a load level: scrape until ``num_requests_waiting`` is 0 (at most
    ``drain_cap_s``), and record the level's server-side figures: ``before`` and ``after``
    snapshots and ``drained_s`` (seconds from the level's end until the queue was empty;
    None: not empty within the cap)."""
    if before is None:
        return None
    t0 = time.monotonic()
    after = await scrape(client)
    while after is not None and (after.waiting or 0) > 0 and time.monotonic() - t0 < drain_cap_s:
        await asyncio.sleep(poll_s)
        after = await scrape(client) or after
    if after is None:
        return None
    drained = round(time.monotonic() - t0, 3) if not after.waiting else None
    return {"before": before.to_dict(), "after": after.to_dict(), "drained_s": drained}


# --- checks (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class LevelHealth:
    """What /metrics said about one load level."""

    concurrency: int
    preemptions: float | None
    failed_requests: float | None
    drained_s: float | None
    waiting_after: float | None

    def problems(self, max_preemptions: float, max_drain_s: float) -> list[str]:
        out = []
        if self.preemptions is not None and self.preemptions > max_preemptions:
            out.append(
                f"vllm:num_preemptions +{self.preemptions:g} (expected <= {max_preemptions:g})"
            )
        if self.failed_requests:
            out.append(
                f"vllm:request_success{{finished_reason=error|abort}} "
                f"+{self.failed_requests:g} (expected 0)"
            )
        if self.drained_s is None:
            out.append(
                f"vllm:num_requests_waiting still {self.waiting_after:g} after the level "
                f"(expected 0 within {max_drain_s:g} s)"
            )
        elif self.drained_s > max_drain_s:
            out.append(
                f"vllm:num_requests_waiting took {self.drained_s:.1f} s to drain "
                f"(expected 0 within {max_drain_s:g} s)"
            )
        return out


def level_health(concurrency: int, metrics: Mapping[str, Any]) -> LevelHealth:
    """``LevelResult.metrics`` (see :func:`level_metrics`) as the figures the check reads."""
    before, after = metrics["before"], metrics["after"]
    return LevelHealth(
        concurrency,
        _delta(after.get("preemptions"), before.get("preemptions")),
        _delta(after.get("failed_requests"), before.get("failed_requests")),
        metrics.get("drained_s"),
        after.get("waiting"),
    )


@dataclass(frozen=True)
class PrefixCacheRun:
    """Two requests sharing a long prefix: their TTFTs and the server's counters around."""

    prefix_tokens: int
    ttft_cold_s: float
    ttft_warm_s: float
    before: Snapshot
    after: Snapshot

    @property
    def hits(self) -> float | None:
        return _delta(self.after.prefix_hits, self.before.prefix_hits)

    @property
    def queries(self) -> float | None:
        return _delta(self.after.prefix_queries, self.before.prefix_queries)

    def figures(self) -> str:
        hits = "n/a" if self.hits is None else f"+{self.hits:g}"
        queries = "n/a" if self.queries is None else f"+{self.queries:g}"
        return (
            f"TTFT cold {self.ttft_cold_s:.3f} s, warm {self.ttft_warm_s:.3f} s; "
            f"vllm:prefix_cache_hits {hits} of {queries} queried tokens "
            f"({self.prefix_tokens} shared prefix tokens)"
        )


def prefix_cache_problem(run: PrefixCacheRun) -> tuple[str, str] | None:
    """None when the second request hit the cache and was faster; else (measured, fix)."""
    figures = run.figures()
    if run.after.prefix_caching is False or (run.hits == 0 and run.after.prefix_caching is None):
        shown = (
            "vllm:cache_config_info enable_prefix_caching=False"
            if run.after.prefix_caching is False
            else "no prefix-cache hits"
        )
        return (
            f"prefix caching is off ({shown}): {figures}",
            "the server runs with --no-enable-prefix-caching (or a build/attention backend "
            "without it); drop the flag from the serve arguments",
        )
    if run.hits is None:
        return (
            f"the server exports no prefix-cache counters: {figures}",
            "a vLLM build without vllm:prefix_cache_hits; upgrade or set "
            "prefix_cache.expected = false",
        )
    if run.hits <= 0:
        return (
            f"the shared prefix was not served from the cache: {figures}",
            "the cache is enabled but evicts at once (KV cache too small for the prefix: "
            "raise --gpu-memory-utilization or lower --max-num-seqs) or the prompts differ "
            "before the prefix ends (a chat template adding a date or id)",
        )
    if run.ttft_warm_s >= run.ttft_cold_s:
        return (
            f"the cached request was not faster: {figures}",
            "prefill is not the TTFT's bulk here (a queue ahead of the request, or "
            "a slow first decode step); check vllm:num_requests_waiting and the fabric",
        )
    return None


_FIXES = (
    (
        PREEMPTIONS.removesuffix("_total"),
        "preemptions mean the KV cache is too small for the batch (raise "
        "--gpu-memory-utilization, lower --max-num-seqs or --max-model-len)",
    ),
    (
        SUCCESS.removesuffix("_total"),
        "requests the engine finished by error or abort: its log says why (an exception, a "
        "client timeout)",
    ),
    (
        WAITING,
        "a queue that does not drain means requests the server still holds after the "
        "clients left (stuck or aborted without being freed)",
    ),
)


def health_fixes(problems: list[str]) -> str:
    """What usually fixes the problems :meth:`LevelHealth.problems` gave (only theirs)."""
    text = "; ".join(fix for metric, fix in _FIXES if any(metric in p for p in problems))
    return text[:1].upper() + text[1:]
