"""SLOs and goodput, as ``vllm bench serve --goodput ttft:MS tpot:MS e2el:MS`` defines them
(vllm/benchmarks/serve.py, ``calculate_metrics``): a request is *good* when it completed
and meets every SLO given (``ttft <= slo``, ``tpot <= slo``, ``e2el <= slo``); the request
goodput is the good requests per second of the benchmark's duration. Here the share of the
level's requests that are good is gated too (a failed request is never good), and each SLO
is also read at its percentile (``TTFT p99 <= 2 s``), which is how an operator states it.

Pure functions over RequestRecords: the goodput of the closed-loop sweep's levels costs no
request of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_spark.serving.load.stats import percentile
from pytest_spark.serving.load.sweep import RequestRecord

METRICS = ("ttft", "tpot", "e2e")
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E latency"}


@dataclass(frozen=True)
class Slo:
    """Per-request ceilings (seconds; None: that SLO is not set) and the percentile each is
    read at, and the share of requests that must meet all of them."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    ttft_pct: float = 99.0
    tpot_pct: float = 99.0
    e2e_pct: float = 99.0
    min_goodput_pct: float = 99.0

    def limits(self) -> dict[str, float]:
        given = {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}
        return {name: value for name, value in given.items() if value is not None}

    def pct(self, metric: str) -> float:
        return float(getattr(self, f"{metric}_pct"))

    def text(self) -> str:
        """``TTFT <= 2 s, TPOT <= 0.1 s`` (the SLOs set)."""
        return ", ".join(f"{LABELS[m]} <= {v:g} s" for m, v in self.limits().items())


def _value(record: RequestRecord, metric: str) -> float | None:
    if metric == "tpot":
        return record.tpot
    value: float | None = getattr(record, metric)
    return value


def broken(record: RequestRecord, slo: Slo) -> list[str]:
    """The SLOs this request broke (``["ttft"]``); ``["error"]`` for a failed request. A
    request of one token has no TPOT and cannot break it (vLLM counts its TPOT as 0)."""
    if record.error is not None:
        return ["error"]
    out = []
    for metric, limit in slo.limits().items():
        value = _value(record, metric)
        if metric == "tpot" and value is None:
            continue
        if value is None or value > limit:
            out.append(metric)
    return out


@dataclass(frozen=True)
class Goodput:
    """The goodput of one level (a concurrency or a request rate)."""

    requests: int  # sent, failed included
    good: int
    wall_s: float
    broken: dict[str, int]  # SLO (or "error") -> requests that broke it
    at_pct: dict[str, float | None]  # SLO -> measured value at its percentile
    limits: dict[str, float]
    pcts: dict[str, float]

    @property
    def share_pct(self) -> float:
        return 100.0 * self.good / self.requests if self.requests else 0.0

    @property
    def rate(self) -> float:
        """Good requests per second (vLLM's ``request_goodput``)."""
        return self.good / self.wall_s if self.wall_s > 0 else 0.0

    def worst(self) -> str | None:
        """The SLO the failing requests broke most (ties: the order of METRICS)."""
        if not self.broken:
            return None
        order = [*METRICS, "error"]
        return max(self.broken, key=lambda m: (self.broken[m], -order.index(m)))

    def percentiles_met(self) -> dict[str, bool]:
        """Each SLO read at its percentile: ``TTFT p99 <= limit``."""
        return {m: (v is not None and v <= self.limits[m]) for m, v in self.at_pct.items()}

    def meets(self, min_share_pct: float) -> bool:
        return self.requests > 0 and self.share_pct >= min_share_pct

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "good": self.good,
            "goodput_pct": round(self.share_pct, 2),
            "goodput_req_s": round(self.rate, 4),
            "broken": dict(self.broken),
            "slo_s": dict(self.limits),
            "at_percentile": {
                m: {"pct": self.pcts[m], "value_s": v, "met": self.percentiles_met()[m]}
                for m, v in self.at_pct.items()
            },
        }

    def breakdown(self) -> str:
        """``TTFT broken by 7, E2E latency by 2, 1 failed`` (most first)."""
        parts = []
        for metric, n in sorted(self.broken.items(), key=lambda kv: -kv[1]):
            parts.append(f"{n} failed" if metric == "error" else f"{LABELS[metric]} broken by {n}")
        return ", ".join(parts) or "none broken"


def goodput(records: Sequence[RequestRecord], slo: Slo, wall_s: float) -> Goodput:
    limits = slo.limits()
    counts: Counter[str] = Counter()
    good = 0
    for record in records:
        hit = broken(record, slo)
        counts.update(hit)
        good += not hit
    ok = [r for r in records if r.error is None]
    at_pct: dict[str, float | None] = {}
    for metric in limits:
        values = [v for r in ok if (v := _value(r, metric)) is not None]
        at_pct[metric] = round(percentile(values, slo.pct(metric)), 6) if values else None
    return Goodput(
        len(records),
        good,
        wall_s,
        dict(counts),
        at_pct,
        limits,
        {m: slo.pct(m) for m in limits},
    )


FIXES = {
    "ttft": "TTFT grows with the queue: requests wait for a batch slot or prefill is slow. "
    "Check vllm:num_requests_waiting; raise --max-num-seqs or --max-num-batched-tokens, or "
    "lower the load",
    "tpot": "each decode step is slow at this batch: a degraded fabric or GPU (run the link, "
    "nccl and gpu-health checks), or a batch too large for the memory bandwidth",
    "e2e": "the requests take too long end to end: see which of TTFT and TPOT grew",
    "error": "requests failed: see the load sweep's errors (test_sweep_completes)",
}


def failure_text(where: str, level: str, g: Goodput, expected_pct: float) -> str:
    """The goodput failure: level, measured share, expected share, the SLO broken most and
    the fix."""
    worst = g.worst()
    fix = FIXES.get(worst or "", "")
    at = ", ".join(
        f"{LABELS[m]} p{g.pcts[m]:g} {v:.3f} s (n={g.requests}, SLO {g.limits[m]:g} s)"
        for m, v in g.at_pct.items()
        if v is not None
    )
    most = f"; most broken: {LABELS.get(worst or '', 'request errors')}" if worst else ""
    return (
        f"{where}: goodput at {level}: {g.good} of {g.requests} requests "
        f"({g.share_pct:.1f}%, {g.rate:.2f} req/s) met every SLO, expected >= "
        f"{expected_pct:g}% ({g.breakdown()}{most}; {at}). {fix}"
    )
