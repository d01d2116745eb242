"""The load specs built from a threshold profile: the closed-loop sweep ([throughput]), the
SLOs ([slo]), the open-loop sweep ([open_loop]) and the soak ([soak])."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.load.openloop import OpenLoopSpec
from pytest_spark.serving.load.slo import Slo
from pytest_spark.serving.load.soak import SoakSpec
from pytest_spark.serving.load.sweep import LoadSpec
from pytest_spark.settings.profiles import Profile


def _levels(raw: Any) -> tuple[int, ...]:
    """``[1, 4, 16]`` from the profile (``--spark-threshold throughput.concurrency=1;4``)."""
    items = raw if isinstance(raw, list | tuple) else re.findall(r"-?\d+", str(raw))
    levels = tuple(sorted({int(x) for x in items}))
    if not levels or min(levels) < 1:
        raise pytest.UsageError(
            f"throughput.concurrency={raw!r}: expected positive integers such as 1;4;16"
        )
    return levels


def load_spec(profile: Profile, api: ApiEndpoint) -> LoadSpec:
    sweep = profile.throughput
    return LoadSpec(
        concurrency=_levels(sweep.concurrency),
        prompt_tokens=sweep.prompt_tokens,
        output_tokens=sweep.output_tokens,
        requests_per_stream=sweep.requests_per_stream,
        min_requests=sweep.min_requests,
        warmup_requests=sweep.warmup_requests,
        level_budget_s=sweep.level_budget_s,
        request_timeout_s=sweep.request_timeout_s,
        idle_timeout_s=api.timeout,
    )


def slo_of(profile: Profile) -> Slo:
    s = profile.slo
    return Slo(s.ttft_s, s.tpot_s, s.e2e_s, s.ttft_pct, s.tpot_pct, s.e2e_pct, s.min_goodput_pct)


def open_loop_spec(profile: Profile) -> OpenLoopSpec:
    s = profile.open_loop
    return OpenLoopSpec(
        s.start_rate, s.rate_factor, s.max_levels, s.requests_per_level, s.seed, s.burstiness
    )


def soak_spec(profile: Profile, duration_s: float) -> SoakSpec:
    s = profile.soak
    return SoakSpec(duration_s, s.concurrency, s.window_s, s.max_drift_pct, s.max_waiting_growth)
