"""Tokens/sec and latency against the profile: one closed-loop concurrency sweep (warm-up
first, fixed prompt and output lengths, tokens counted from the server's usage), then one
check per threshold. Every figure of the sweep goes into the JSON results (``extra.sweep``
of test_sweep_completes, ``extra.level`` of each threshold check), so a report can plot
tok/s against concurrency and the latency percentiles.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.checks.base import Finding
from pytest_spark.fixtures import SparkCheck, verdict_in_session
from pytest_spark.gathering.measure import measure_once
from pytest_spark.parsers.codec import dump, load_as
from pytest_spark.serving import LevelResult, LoadSpec, ServingError, SweepResult, run_sweep
from pytest_spark.serving.causes import DECODE_VERDICT, decode_explains_aggregate
from pytest_spark.settings.profiles import Profile
from pytest_spark.settings.resolve import Settings

pytestmark = pytest.mark.throughput

SWEEP_PROP = "sweep"


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


def measure_sweep(api: ApiEndpoint, spec: LoadSpec) -> SweepResult | ServingError:
    try:
        return run_sweep(api, spec)
    except ServingError as exc:
        return exc


def encode_sweep(outcome: SweepResult | ServingError) -> dict[str, Any]:
    if isinstance(outcome, ServingError):
        return {"error": outcome.to_json()}
    return {"result": dump(outcome)}


def decode_sweep(data: dict[str, Any]) -> SweepResult | ServingError:
    if "error" in data:
        return ServingError.from_json(data["error"])
    return load_as(SweepResult, data["result"])


class Sweep:
    """The sweep, run once per session; its failure (if any) is reported by every check."""

    def __init__(
        self,
        server: str,
        outcome: SweepResult | ServingError,
        wire_cited: Callable[[str, str], str | None] | None = None,
    ) -> None:
        self.server = server
        self.result = outcome if isinstance(outcome, SweepResult) else None
        self.error = outcome if isinstance(outcome, ServingError) else None
        # Why a request broken on the wire is the wire verdict's (None: report it here).
        self.wire_cited = wire_cited or (lambda kind, message: None)

    def cited_by(self, wire_cited: Callable[[str, str], str | None]) -> Sweep:
        """This sweep, for one check: its wire failures cite the wire verdict."""
        mine = copy.copy(self)
        mine.wire_cited = wire_cited
        return mine

    def require_warmed_up(self, spark_check: SparkCheck) -> SweepResult:
        """The sweep's result; its warm-up failure as this check's, or a skip citing the
        wire verdict when the stream is broken for every request (the canary's too)."""
        if self.error is not None:
            cited = self.wire_cited(self.error.kind, self.error.message)
            if cited is not None:
                pytest.skip(f"throughput warm-up: {cited}")
            spark_check.require(self.error.finding(f"{self.server}: throughput warm-up"))
        assert self.result is not None
        return self.result

    def level(self, spark_check: SparkCheck, concurrency: int, what: str) -> LevelResult:
        self.require_warmed_up(spark_check)
        assert self.result is not None
        level = self.result.level(concurrency)
        if level is None:
            pytest.skip(
                f"{what}: concurrency {concurrency} is not in the sweep "
                f"(throughput.concurrency = {list(self.result.spec.concurrency)})"
            )
        if not level.ok:
            first = level.failed[0]
            cited = self.wire_cited(first.error_kind or "", first.error or "")
            if cited is not None:
                pytest.skip(f"{what}: every request at concurrency {concurrency}: {cited}")
            spark_check.require(
                Finding.failed(
                    f"0 of {len(level.records)} requests",
                    "successful requests",
                    message=f"{self.server}: {what}: every request at concurrency {concurrency} "
                    f"failed: {first.error}",
                    evidence=first.evidence,
                )
            )
        return level


@pytest.fixture(scope="session")
def _sweep(
    request: pytest.FixtureRequest, spark_api: ApiEndpoint, spark_settings: Settings
) -> tuple[Sweep, dict[str, Any]]:
    spec = load_spec(spark_settings.profile, spark_api)
    # Once per session, alone on the cluster, also under xdist (pytest_spark.gathering.measure):
    # tok/s taken while other tests send requests would not be a measurement.
    measured = measure_once(
        request.config,
        "throughput-sweep",
        lambda: measure_sweep(spark_api, spec),
        encode=encode_sweep,
        decode=decode_sweep,
    )
    return Sweep(f"{spark_api.model} at {spark_api.base_url}", measured.value), measured.record


@pytest.fixture
def sweep(
    _sweep: tuple[Sweep, dict[str, Any]],
    spark_check: SparkCheck,
    wire_cited: Callable[[str, str], str | None],
) -> Sweep:
    spark_check.attach("measurement", _sweep[1])
    return _sweep[0].cited_by(wire_cited)


def _figures(spark_check: SparkCheck, level: LevelResult) -> dict[str, Any]:
    figures = level.to_dict()
    spark_check.attach("level", figures)
    return figures


def _evidence(figures: dict[str, Any]) -> dict[str, str]:
    """The level's figures, as the evidence of a threshold failure."""
    return {"figures": json.dumps(figures, indent=1)}


def test_sweep_completes(sweep: Sweep, spark_check: SparkCheck) -> None:
    """Every request of every level streamed to [DONE]; the whole sweep is recorded."""
    result = sweep.require_warmed_up(spark_check)
    doc = result.to_dict()
    spark_check.attach(SWEEP_PROP, doc)
    failed = [(lv.concurrency, r) for lv in result.levels for r in lv.failed]
    total = sum(len(lv.records) for lv in result.levels)
    per_level = {lv["concurrency"]: lv["output_tok_s"] for lv in doc["levels"]}
    if failed:
        c, first = failed[0]
        if all(sweep.wire_cited(r.error_kind or "", r.error or "") for _, r in failed):
            pytest.skip(
                f"load sweep: {len(failed)} of {total} requests failed: "
                f"{sweep.wire_cited(first.error_kind or '', first.error or '')}"
            )
        spark_check.require(
            Finding.failed(
                f"{len(failed)} of {total} requests failed",
                "every request completes",
                message=f"{sweep.server}: load sweep: {len(failed)} of {total} streamed requests "
                f"failed (first at concurrency {c}: {first.error})",
                evidence=first.evidence,
            )
        )
    dropped = result.dropped_params
    note = f"; the server refused {', '.join(dropped)} (sent without)" if dropped else ""
    spark_check.require(
        Finding.passed(
            per_level,
            "every request completes",
            "tok/s",
            message=f"{total} requests; output tok/s by concurrency {per_level}{note}",
        )
    )


def test_decode_single_stream(
    sweep: Sweep, spark_check: SparkCheck, spark_settings: Settings
) -> None:
    """Single-stream decode speed (1 / TPOT, median) >= throughput.min_decode_tok_s_1: the
    decode verdict (the aggregate check skips citing it when it accounts for the rest)."""
    level = sweep.level(spark_check, 1, "single-stream decode")
    floor = spark_settings.profile.throughput.min_decode_tok_s_1
    figures = _figures(spark_check, level)
    decode = figures["decode_tok_s"]["median"]
    if decode is None:
        pytest.fail(
            f"{sweep.server}: single-stream decode: no request produced 2 or more "
            "tokens, so decode speed cannot be measured",
            pytrace=False,
        )
    finding = Finding.passed(decode, floor, "tok/s", message=f"decode {decode:.1f} tok/s")
    if decode < floor:
        finding = Finding.failed(
            decode,
            floor,
            "tok/s",
            message=f"{sweep.server}: single-stream decode "
            f"{decode:.1f} tok/s (median 1/TPOT of {figures['requests']} requests, "
            f"{spark_settings.profile.throughput.output_tokens} output tokens "
            f"each), expected >= {floor:g} tok/s. Usually a degraded fabric (NCCL over TCP, "
            "one twin), GPU clocks throttled, or another process on a GPU; run the link and "
            "nccl checks",
            evidence=_evidence(figures),
        )
    spark_check.require(finding)


def test_ttft_p90_single_stream(
    sweep: Sweep, spark_check: SparkCheck, spark_settings: Settings
) -> None:
    """Time to first token at one stream, p90 <= throughput.max_ttft_p90_s_1."""
    level = sweep.level(spark_check, 1, "single-stream TTFT")
    ceiling = spark_settings.profile.throughput.max_ttft_p90_s_1
    figures = _figures(spark_check, level)
    p90 = figures["ttft_s"]["p90"]
    if p90 is None:
        pytest.fail(f"{sweep.server}: TTFT: no request produced a token", pytrace=False)
    finding = Finding.passed(p90, ceiling, "s", message=f"TTFT p90 {p90:.3f} s")
    if p90 > ceiling:
        finding = Finding.failed(
            p90,
            ceiling,
            "s",
            message=f"{sweep.server}: single-stream TTFT p90 {p90:.3f} s "
            f"(median {figures['ttft_s']['median']:.3f} s, {figures['requests']} requests), "
            f"expected <= {ceiling:g} s. Usually prefill slowed by a degraded fabric or a "
            "queue of other requests on the server (check vllm:num_requests_waiting)",
            evidence=_evidence(figures),
        )
    spark_check.require(finding)


def test_aggregate_four_streams(
    request: pytest.FixtureRequest, sweep: Sweep, spark_check: SparkCheck, spark_settings: Settings
) -> None:
    """Aggregate output tok/s at 4 concurrent streams >= throughput.min_agg_tok_s_4."""
    level = sweep.level(spark_check, 4, "aggregate throughput at 4 streams")
    floor = spark_settings.profile.throughput.min_agg_tok_s_4
    figures = _figures(spark_check, level)
    agg = figures["output_tok_s"]
    finding = Finding.passed(agg, floor, "tok/s", message=f"{agg:.1f} tok/s at 4 streams")
    if agg < floor and verdict_in_session(request.session, DECODE_VERDICT):
        _skip_if_decode_explains(sweep, spark_settings, agg, floor)
    if agg < floor:
        finding = Finding.failed(
            agg,
            floor,
            "tok/s",
            message=f"{sweep.server}: aggregate output {agg:.1f} tok/s "
            f"at 4 concurrent streams ({figures['output_tokens']} tokens in "
            f"{figures['wall_s']:.1f} s), expected >= {floor:g} tok/s. Usually a degraded "
            "fabric or GPU, or batching limited by --max-num-seqs / KV-cache size",
            evidence=_evidence(figures),
        )
    spark_check.require(finding)


def _skip_if_decode_explains(
    sweep: Sweep, spark_settings: Settings, aggregate: float, floor: float
) -> None:
    """A low aggregate at 4 streams that the slow single-stream decode accounts for (the
    streams scaled as the profile expects, each one slow) is the decode verdict's failure:
    skip citing it. Streams that did not scale are a cause of their own and fail here."""
    one = sweep.result.level(1) if sweep.result is not None else None
    if one is None:
        return
    decode = one.to_dict()["decode_tok_s"]["median"]
    decode_floor = spark_settings.profile.throughput.min_decode_tok_s_1
    if decode_explains_aggregate(aggregate, floor, decode, decode_floor):
        pytest.skip(
            f"aggregate output {aggregate:.1f} tok/s at 4 streams, expected >= {floor:g}: the "
            f"4 streams gave {aggregate / decode:.1f}x the single-stream decode (the profile "
            f"expects >= {floor / decode_floor:.2f}x), so the shortfall is each stream's "
            f"speed: single-stream decode {decode:.1f} tok/s, expected >= {decode_floor:g} "
            f"({DECODE_VERDICT} has the evidence)"
        )
