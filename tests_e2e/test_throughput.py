"""Tokens/sec and latency against the profile: one closed-loop concurrency sweep (warm-up
first, fixed prompt and output lengths, tokens counted from the server's usage), then one
check per threshold, and the goodput gate under the profile's [slo] (from the same
requests: it sends none of its own). Every figure of the sweep goes into the JSON results
(``extra.sweep`` of test_sweep_completes, with each level's goodput; ``extra.level`` of each
threshold check), so a report can plot tok/s against concurrency and the latency
percentiles.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from pytest_spark import Finding, Settings, SparkCheck, verdict_in_session
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.infra.servecmd import ServerCommand
from pytest_spark.report.samples import enough_for, min_samples
from pytest_spark.serving import LevelResult
from pytest_spark.serving.load import specdec
from pytest_spark.serving.load.closedloop import Sweep
from pytest_spark.serving.load.metricsnap import health_fixes, level_health
from pytest_spark.serving.load.roofline import roofline_of
from pytest_spark.serving.load.slo import failure_text, goodput
from pytest_spark.serving.load.specs import slo_of
from pytest_spark.serving.validate.causes import (
    DECODE_VERDICT,
    decode_explains_aggregate,
    decode_explains_goodput,
)

pytestmark = pytest.mark.throughput
# The checks read the one sweep (``_sweep``: measured alone, after draining what was sent
# ahead): the functional modules around this one share one plan (serving.client.prefetch).
plan_spans = True

SWEEP_PROP = "sweep"
SPEC_VERDICT = "test_spec_decode_acceptance"


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


def test_sweep_completes(sweep: Sweep, spark_check: SparkCheck, spark_settings: Settings) -> None:
    """Every request of every level streamed to [DONE]; the whole sweep is recorded, each
    level with its goodput under the profile's SLOs."""
    result = sweep.require_warmed_up(spark_check)
    doc = result.to_dict()
    slo = slo_of(spark_settings.profile)
    if slo.limits():
        for lv, figures in zip(result.levels, doc["levels"], strict=True):
            figures["goodput"] = goodput(lv.records, slo, lv.wall_s).to_dict()
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


def _roofline_text(
    spark_check: SparkCheck,
    spark_settings: Settings,
    api: ApiEndpoint,
    command: ServerCommand | None,
    config: dict[str, Any] | None,
    decode: float,
) -> str:
    """`` (58% of the 54.6 tok/s roofline ...)`` beside the decode figure (attached as
    ``extra.roofline``); empty when the model's active parameters or bytes are unknown."""
    args = command.args if command is not None else None
    section = spark_settings.profile.roofline
    roof = roofline_of(
        (args.model if args is not None else None) or api.model,
        config,
        args.quantization if args is not None else None,
        args.dtype if args is not None else None,
        args.tensor_parallel_size if args is not None else 1,
        section.active_params_b,
    )
    if roof is None and args is not None and args.model != api.model:
        tp = args.tensor_parallel_size
        roof = roofline_of(api.model, config, args.quantization, args.dtype, tp, None)
    if roof is None:
        return ""
    roof = dataclasses.replace(roof, bandwidth_gbs=section.bandwidth_gbs)
    spark_check.attach("roofline", roof.to_dict(decode))
    return f" ({roof.text(decode)})"


def _spec_of(sweep: Sweep, concurrency: int | None = None) -> specdec.SpecFigures | None:
    result = sweep.result
    if result is None:
        return None
    levels = [lv for lv in result.levels if concurrency in (None, lv.concurrency)]
    return specdec.total(specdec.level_spec(lv.metrics) for lv in levels)


def _no_draft(spark_settings: Settings) -> tuple[float, str]:
    """Single-stream tok/s expected without drafting, and where the figure comes from."""
    section = spark_settings.profile.spec_decode
    if section.no_draft_tok_s is not None:
        return section.no_draft_tok_s, "spec_decode.no_draft_tok_s"
    return spark_settings.profile.throughput.min_decode_tok_s_1, "the decode floor"


def test_decode_single_stream(
    request: pytest.FixtureRequest,
    sweep: Sweep,
    spark_check: SparkCheck,
    spark_settings: Settings,
    spark_api: ApiEndpoint,
    spark_server_command: ServerCommand | None,
    spark_model_config: dict[str, Any] | None,
) -> None:
    """Single-stream decode speed (1 / TPOT, median) >= throughput.min_decode_tok_s_1: the
    decode verdict (the aggregate check skips citing it when it accounts for the rest),
    shown as a fraction of the memory-bandwidth roofline. A floor missed because
    speculative decoding collapsed is the spec-decode verdict's failure: skipped citing it."""
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
    roof = _roofline_text(
        spark_check, spark_settings, spark_api, spark_server_command, spark_model_config, decode
    )
    finding = Finding.passed(decode, floor, "tok/s", message=f"decode {decode:.1f} tok/s{roof}")
    spec = _spec_of(sweep, 1)
    if decode < floor and spec is not None and verdict_in_session(request.session, SPEC_VERDICT):
        no_draft, source = _no_draft(spark_settings)
        verdict = specdec.judge(
            spec, decode, no_draft, spark_settings.profile.spec_decode.min_acceptance, source
        )
        if verdict.kind == "collapse":
            pytest.skip(
                f"single-stream decode {decode:.1f} tok/s, expected >= {floor:g}: "
                f"{verdict.measured} ({SPEC_VERDICT} has the evidence)"
            )
    if decode < floor:
        finding = Finding.failed(
            decode,
            floor,
            "tok/s",
            message=f"{sweep.server}: single-stream decode "
            f"{decode:.1f} tok/s (median 1/TPOT of {figures['requests']} requests, "
            f"{spark_settings.profile.throughput.output_tokens} output tokens "
            f"each){roof}, expected >= {floor:g} tok/s. Usually a degraded fabric (NCCL over TCP, "
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
    n = figures["ttft_s"].get("count")
    # with fewer than 10 samples the p90 is the slowest request, interpolated: said so
    few = "" if enough_for("p90", n) else f"; too few for a p90 (needs >= {min_samples(90)})"
    shown = f"TTFT p90 {p90:.3f} s (n={n}{few})"
    finding = Finding.passed(p90, ceiling, "s", message=shown, bound="<=")
    if p90 > ceiling:
        finding = Finding.failed(
            p90,
            ceiling,
            "s",
            bound="<=",
            message=f"{sweep.server}: single-stream {shown} "
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


def test_goodput(
    request: pytest.FixtureRequest, sweep: Sweep, spark_check: SparkCheck, spark_settings: Settings
) -> None:
    """At the sweep's level ``slo.concurrency``, the share of requests meeting every SLO of
    the profile's [slo] (vllm bench serve's goodput) >= slo.min_goodput_pct. Requests that
    broke TPOT or E2E most while the single-stream decode is below its floor are the decode
    verdict's failure: skipped citing it."""
    slo = slo_of(spark_settings.profile)
    c = spark_settings.profile.slo.concurrency
    if not slo.limits():
        pytest.skip("goodput: the profile sets no SLO ([slo] ttft_s, tpot_s, e2e_s)")
    level = sweep.level(spark_check, c, f"goodput at {c} streams")
    g = goodput(level.records, slo, level.wall_s)
    figures = {**_figures(spark_check, level), "goodput": g.to_dict()}
    spark_check.attach("goodput", figures["goodput"])
    expected = slo.min_goodput_pct
    shown = f"goodput {g.share_pct:.1f}% ({g.rate:.2f} req/s) at {c} streams under {slo.text()}"
    finding = Finding.passed(round(g.share_pct, 2), expected, "%", message=shown)
    if not g.meets(expected) and verdict_in_session(request.session, DECODE_VERDICT):
        _skip_if_decode_is_slow(sweep, spark_settings, g.worst(), shown)
    if not g.meets(expected):
        finding = Finding.failed(
            round(g.share_pct, 2),
            expected,
            "%",
            message=failure_text(sweep.server, f"{c} streams", g, expected),
            evidence=_evidence(figures),
        )
    spark_check.require(finding)


def _skip_if_decode_is_slow(
    sweep: Sweep, spark_settings: Settings, worst: str | None, shown: str
) -> None:
    """Goodput lost to slow decode steps (TPOT, or the E2E latency they make) when the
    single-stream decode is below its floor: one cause, the decode verdict's."""
    one = sweep.result.level(1) if sweep.result is not None else None
    if one is None:
        return
    decode = one.to_dict()["decode_tok_s"]["median"]
    floor = spark_settings.profile.throughput.min_decode_tok_s_1
    if decode_explains_goodput(worst, decode, floor):
        pytest.skip(
            f"{shown}, most broken: {'TPOT' if worst == 'tpot' else 'E2E latency'}, so "
            f"the shortfall is each stream's speed: single-stream decode {decode:.1f} tok/s, "
            f"expected >= {floor:g} ({DECODE_VERDICT} has the evidence)"
        )


def test_metrics_health_during_sweep(
    sweep: Sweep, spark_check: SparkCheck, spark_settings: Settings
) -> None:
    """/metrics around each level of the sweep (issue #16 section 7): no preemptions
    (metrics_health.max_preemptions), no requests finished by error or abort, and
    vllm:num_requests_waiting back to 0 within metrics_health.max_drain_s of the level's end."""
    result = sweep.require_warmed_up(spark_check)
    section = spark_settings.profile.metrics_health
    levels = [lv for lv in result.levels if lv.metrics is not None]
    if not levels:
        pytest.skip(f"{sweep.server}: no vLLM /metrics to read around the sweep's levels")
    figures = {lv.concurrency: lv.metrics for lv in levels}
    spark_check.attach("level_metrics", figures)
    problems = []
    for lv in levels:
        health = level_health(lv.concurrency, lv.metrics or {})
        if lv.failed:  # the server's count of them is test_sweep_completes's failure
            health = dataclasses.replace(health, failed_requests=None)
        problems += [
            f"concurrency {lv.concurrency}: {p}"
            for p in health.problems(section.max_preemptions, section.max_drain_s)
        ]
    if not problems:
        spark_check.require(
            Finding.passed(
                0,
                0,
                message=f"levels {sorted(figures)}: no preemptions, no failed requests, "
                "the waiting queue drained",
            )
        )
        return
    spark_check.require(
        Finding.failed(
            problems,
            f"no preemptions (<= {section.max_preemptions}), no failed requests, waiting "
            f"back to 0 within {section.max_drain_s:g} s",
            message=f"{sweep.server}: /metrics during the load sweep: "
            + "; ".join(problems)
            + f". {health_fixes(problems)}",
            evidence={"level_metrics": json.dumps(figures, indent=1)},
        )
    )


def test_spec_decode_acceptance(
    sweep: Sweep,
    spark_check: SparkCheck,
    spark_settings: Settings,
    spark_server_command: ServerCommand | None,
) -> None:
    """Speculative decoding (issue #27 part 1), when the server drafts: from vLLM's
    spec-decode counters around the sweep's levels, the acceptance rate (accepted / draft
    tokens) >= spec_decode.min_acceptance, with the mean accepted length, the per-position
    acceptance and the effective tok/s recorded (``extra.spec_decode``). Below the minimum
    with fewer single-stream tok/s than decode without drafting (spec_decode.no_draft_tok_s,
    else the decode floor) is a collapse, named as one."""
    result = sweep.require_warmed_up(spark_check)
    args = spark_server_command.args if spark_server_command is not None else None
    config = specdec.spec_config(args.speculative_config if args is not None else None)
    spec = _spec_of(sweep)
    if spec is None:
        said = "" if config is None else f" although served with --speculative-config {config}"
        pytest.skip(
            f"{sweep.server}: no speculative decoding (no vllm:spec_decode_* counters on "
            f"/metrics{said})"
        )
    if spec.drafts <= 0:
        pytest.skip(f"{sweep.server}: the spec-decode counters did not move during the sweep")
    section = spark_settings.profile.spec_decode
    one = result.level(1)
    decode = one.to_dict()["decode_tok_s"]["median"] if one is not None else None
    no_draft, source = _no_draft(spark_settings)
    per_level = {
        lv.concurrency: {
            **(f.to_dict() if (f := specdec.level_spec(lv.metrics)) else {}),
            "output_tok_s": round(lv.output_tok_s, 3),
        }
        for lv in result.levels
    }
    figures = {
        **spec.to_dict(),
        "method": (config or {}).get("method"),
        "num_speculative_tokens": (config or {}).get("num_speculative_tokens")
        or spec.num_spec_tokens,
        "decode_tok_s_1": decode,
        "no_draft_tok_s": no_draft,
        "min_acceptance": section.min_acceptance,
        "levels": per_level,
    }
    spark_check.attach("spec_decode", figures)
    verdict = specdec.judge(spec, decode, no_draft, section.min_acceptance, source)
    acc = round(spec.acceptance or 0.0, 4)
    if verdict.kind == "ok":
        speed = f", single-stream decode {decode:.1f} tok/s" if decode is not None else ""
        spark_check.require(
            Finding.passed(acc, section.min_acceptance, message=f"{verdict.measured}{speed}")
        )
        return
    spark_check.require(
        Finding.failed(
            acc,
            section.min_acceptance,
            message=f"{sweep.server}: {verdict.measured}. Fix: {verdict.fix}",
            evidence={"spec_decode": json.dumps(figures, indent=1)},
        )
    )
