"""The soak (--spark-soak=DURATION): ``soak.concurrency`` closed-loop streams held for the
duration with a live progress line; /metrics sampled throughout. Four checks on the one
soak: no request errors, tok/s of the last window within ``soak.max_drift_pct`` of the
first, no KV-cache preemptions (vllm:num_preemptions), no growing waiting queue
(vllm:num_requests_waiting). Without the option every check skips with the reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_spark import Finding, Settings, SparkCheck, progress_line_writer
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.measure.once import measure_once
from pytest_spark.serving import ServingError
from pytest_spark.serving.load.soak import run_soak
from pytest_spark.serving.load.specs import load_spec, soak_spec
from pytest_spark.serving.load.sweep import LoadClient

pytestmark = pytest.mark.load

ERRORS_VERDICT = "test_soak_no_errors"


@pytest.fixture(scope="session")
def _soak(
    request: pytest.FixtureRequest, spark_api: ApiEndpoint, spark_settings: Settings
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    duration = spark_settings.soak
    server = f"{spark_api.model} at {spark_api.base_url}"
    if duration is None:
        pytest.skip("soak: not asked for (--spark-soak=DURATION, e.g. 30m, runs it)")
    spec = soak_spec(spark_settings.profile, duration)

    def compute() -> dict[str, Any]:
        lc = LoadClient(spark_api, load_spec(spark_settings.profile, spark_api))
        try:
            result = run_soak(lc, spec, progress_line_writer(request.config))
        except ServingError as exc:
            return {"error": exc.to_json()}
        doc = result.to_dict()
        first = next((r for r in result.failed), None)
        doc["first_error_evidence"] = first.evidence if first is not None else None
        return doc

    measured = measure_once(request.config, "soak", compute, lambda d: d, lambda d: d)
    return server, measured.value, measured.record


@pytest.fixture
def soak(_soak: tuple[str, dict[str, Any], dict[str, Any]], spark_check: SparkCheck) -> Any:
    server, doc, record = _soak
    spark_check.attach("measurement", record)
    if "error" in doc:
        spark_check.require(ServingError.from_json(doc["error"]).finding(f"{server}: soak warm-up"))
    spark_check.attach("soak", {k: v for k, v in doc.items() if k != "first_error_evidence"})
    return server, doc


def _figures(doc: dict[str, Any]) -> dict[str, str]:
    shown = {k: v for k, v in doc.items() if k not in ("samples", "first_error_evidence")}
    return {"soak": json.dumps(shown, indent=1)}


def test_soak_no_errors(soak: tuple[str, dict[str, Any]], spark_check: SparkCheck) -> None:
    server, doc = soak
    n, failed = doc["requests"], doc["failed"]
    if failed:
        spark_check.require(
            Finding.failed(
                f"{failed} of {n} requests failed",
                "every request completes",
                message=f"{server}: soak of {doc['duration_s']:g} s at {doc['concurrency']} "
                f"streams: {failed} of {n} requests failed ({'; '.join(doc['errors'])}). A "
                "server that fails under steady load: read the engine log around the first "
                "failure (evidence) for an OOM, a dead worker or a timeout",
                evidence=doc["first_error_evidence"] or _figures(doc),
            )
        )
    spark_check.require(
        Finding.passed(n, "every request completes", message=f"{n} requests, none failed")
    )


def test_soak_tok_s_steady(
    soak: tuple[str, dict[str, Any]], spark_check: SparkCheck, spark_settings: Settings
) -> None:
    server, doc = soak
    limit = spark_settings.profile.soak.max_drift_pct
    windows, drift = doc["window_tok_s"], doc["drift_pct"]
    if drift is None:
        pytest.skip(
            f"soak tok/s drift: {len(windows)} full window(s) of {doc['window_s']:g} s in "
            f"{doc['duration_s']:g} s: a soak of at least two windows compares them "
            "(raise --spark-soak or lower soak.window_s)"
        )
    shown = f"{windows[0]:.1f} -> {windows[-1]:.1f} tok/s ({drift:+.1f}%)"
    if drift < -limit:
        spark_check.require(
            Finding.failed(
                round(drift, 2),
                -limit,
                "%",
                message=f"{server}: soak output tok/s fell {-drift:.1f}% from the first "
                f"{doc['window_s']:g} s window to the last ({shown}, {doc['concurrency']} "
                f"streams), expected at most {limit:g}%. Usually the GPUs throttling as they "
                "heat under the steady load (the gpu-health checks read the clocks before "
                "it): watch `nvidia-smi --query-gpu=temperature.gpu,clocks.sm,"
                "clocks_event_reasons.active --format=csv -l 5` during a soak and check the "
                "airflow around the Sparks; else KV-cache pressure (see the preemption "
                "check) or another process on the nodes",
                evidence=_figures(doc),
            )
        )
    spark_check.require(Finding.passed(round(drift, 2), -limit, "%", message=shown))


def test_soak_no_preemptions(
    soak: tuple[str, dict[str, Any]], spark_check: SparkCheck, spark_settings: Settings
) -> None:
    server, doc = soak
    most = spark_settings.profile.soak.max_preemptions
    grown = doc["preemptions"]
    if grown is None:
        pytest.skip("soak preemptions: the server exports no vllm:num_preemptions in /metrics")
    if grown > most:
        spark_check.require(
            Finding.failed(
                grown,
                most,
                message=f"{server}: {grown:g} KV-cache preemptions (vllm:num_preemptions) "
                f"during the soak at {doc['concurrency']} streams, expected <= {most}. The KV "
                "cache is too small for this load: raise --gpu-memory-utilization or "
                "--kv-cache-memory-bytes, or lower --max-num-seqs",
                evidence=_figures(doc),
            )
        )
    spark_check.require(Finding.passed(grown, most, message=f"{grown:g} preemptions"))


def test_soak_waiting_queue_steady(
    soak: tuple[str, dict[str, Any]], spark_check: SparkCheck, spark_settings: Settings
) -> None:
    server, doc = soak
    most = spark_settings.profile.soak.max_waiting_growth
    growth = doc["waiting_growth"]
    if growth is None:
        pytest.skip("soak waiting queue: the server exports no vllm:num_requests_waiting")
    shown = f"waiting queue grew by {growth:.2f} requests"
    if growth > most:
        spark_check.require(
            Finding.failed(
                round(growth, 3),
                most,
                "requests",
                message=f"{server}: soak: vllm:num_requests_waiting grew by {growth:.2f} "
                f"(mean of the last {doc['window_s']:g} s window minus the first's) at "
                f"{doc['concurrency']} closed-loop streams, expected <= {most:g}: the server "
                "admits requests slower than at the start. Usually KV-cache exhaustion "
                "(see the preemption check) or --max-num-seqs below the streams",
                evidence=_figures(doc),
            )
        )
    spark_check.require(Finding.passed(round(growth, 3), most, "requests", message=shown))
