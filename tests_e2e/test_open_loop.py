"""Open-loop load (--spark-open-loop): Poisson arrivals at rising request rates until a
level's goodput breaks the profile's [slo]; the knee (the highest rate that met them) is
recorded (``extra.open_loop``) and gated against ``open_loop.min_knee_req_s``. Off by
default: it sends hundreds of requests on a Spark. The closed-loop sweep is
tests_e2e/test_throughput.py; its goodput gate owns SLOs that break under load: a knee under
its floor where the closed loop at ``slo.concurrency`` already broke them skips citing
test_goodput (one root cause, one failure; the knee is recorded either way).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_spark import Finding, Settings, SparkCheck, progress_line_writer, verdict_in_session
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.measure.once import measure_once
from pytest_spark.serving import ServingError
from pytest_spark.serving.load.closedloop import Sweep
from pytest_spark.serving.load.openloop import run_rate_sweep
from pytest_spark.serving.load.slo import LABELS, goodput
from pytest_spark.serving.load.specs import load_spec, open_loop_spec, slo_of
from pytest_spark.serving.load.sweep import LoadClient
from pytest_spark.serving.validate.causes import DECODE_VERDICT, GOODPUT_VERDICT, knee_cause

pytestmark = pytest.mark.load

OPEN_LOOP_PROP = "open_loop"


def test_open_loop_knee(
    request: pytest.FixtureRequest,
    spark_api: ApiEndpoint,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """The knee of the open-loop sweep >= open_loop.min_knee_req_s (recorded either way)."""
    if not spark_settings.open_loop:
        pytest.skip("open-loop sweep: not asked for (--spark-open-loop runs it)")
    slo = slo_of(spark_settings.profile)
    if not slo.limits():
        pytest.skip("open-loop sweep: the profile sets no SLO ([slo] ttft_s, tpot_s, e2e_s)")
    spec = open_loop_spec(spark_settings.profile)
    server = f"{spark_api.model} at {spark_api.base_url}"

    def compute() -> dict[str, Any]:
        lc = LoadClient(spark_api, load_spec(spark_settings.profile, spark_api))
        try:
            return run_rate_sweep(lc, spec, slo, progress_line_writer(request.config)).to_dict()
        except ServingError as exc:
            return {"error": exc.to_json()}

    measured = measure_once(request.config, "open-loop-sweep", compute, lambda d: d, lambda d: d)
    spark_check.attach("measurement", measured.record)
    doc = measured.value
    if "error" in doc:
        error = ServingError.from_json(doc["error"])
        spark_check.require(error.finding(f"{server}: open-loop warm-up"))
    spark_check.attach(OPEN_LOOP_PROP, doc)
    floor = spark_settings.profile.open_loop.min_knee_req_s
    knee = doc["knee_req_s"]
    levels = doc["levels"]
    rates = [lv["rate"] for lv in levels]
    broke = next((lv for lv in levels if not lv["met"]), None)
    where = "no tested rate broke them" if broke is None else f"{broke['rate']:g} req/s broke them"
    shown = f"knee {knee if knee is not None else 'none'} req/s under {slo.text()} ({where})"
    if floor is None:
        spark_check.require(Finding.passed(knee, "reported", "req/s", message=shown))
        return
    if knee is not None and knee >= floor:
        spark_check.require(Finding.passed(knee, floor, "req/s", message=shown))
        return
    first = broke or levels[0]
    below = (
        f"open-loop knee {'none' if knee is None else f'{knee:g} req/s'}, expected >= "
        f"{floor:g} req/s ({first['goodput_pct']:g}% of the requests at {first['rate']:g} req/s "
        "met the SLOs)"
    )
    if verdict_in_session(request.session, GOODPUT_VERDICT):
        cause = _closed_loop_cause(request, spark_settings)
        if cause is not None:
            pytest.skip(f"{below}: {cause}")
    worst = max(first["broken"], key=first["broken"].get) if first["broken"] else None
    spark_check.require(
        Finding.failed(
            knee,
            floor,
            "req/s",
            message=f"{server}: open-loop knee "
            f"{'none (the lowest rate broke the SLOs)' if knee is None else f'{knee:g} req/s'}"
            f", expected >= {floor:g} req/s: at {first['rate']:g} req/s (Poisson arrivals, "
            f"rates tried {rates}) {first['good']} of {first['requests']} requests "
            f"({first['goodput_pct']:g}%) met {slo.text()}, expected >= "
            f"{slo.min_goodput_pct:g}%; most broken: {LABELS.get(worst or '', 'request errors')} "
            f"({first['broken']}). The server queues requests it cannot batch: check "
            "vllm:num_requests_waiting and --max-num-seqs, and the decode and aggregate "
            "throughput checks for a slow engine",
            evidence={"open_loop": json.dumps({**doc, "levels": [first]}, indent=1)},
        )
    )


def _closed_loop_cause(request: pytest.FixtureRequest, spark_settings: Settings) -> str | None:
    """The skip reason when the closed-loop sweep's goodput gate owns the broken SLOs (the
    sweep is measured here if no check has needed it yet: once per session either way)."""
    sweep: Sweep = request.getfixturevalue("_sweep")[0]
    result, profile = sweep.result, spark_settings.profile
    level = result.level(profile.slo.concurrency) if result is not None else None
    if result is None or level is None or not level.ok:
        return None  # the throughput checks report a sweep that broke or lacks the level
    one = result.level(1)
    decode = one.to_dict()["decode_tok_s"]["median"] if one is not None else None
    return knee_cause(
        goodput(level.records, slo_of(profile), level.wall_s),
        profile.slo.concurrency,
        profile.slo.min_goodput_pct,
        decode,
        profile.throughput.min_decode_tok_s_1,
        decode_verdict=verdict_in_session(request.session, DECODE_VERDICT),
    )
