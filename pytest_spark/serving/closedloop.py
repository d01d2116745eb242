"""The closed-loop concurrency sweep as the serving checks share it: measured once per
session (:func:`pytest_spark.gathering.measure.measure_once`, alone on the cluster) and
carried between processes as JSON. The session fixture that measures it is ``_sweep`` in
tests_e2e/conftest.py; the verdicts on it (:class:`pytest_spark.serving.sweep.Sweep`) are read by
the throughput checks (tests_e2e/test_throughput.py) and, where its goodput gate owns a
broken SLO, cited by the open-loop knee (tests_e2e/test_open_loop.py).
"""

from __future__ import annotations

from typing import Any

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.parsers.codec import dump, load_as
from pytest_spark.serving.load import LoadSpec, Progress, SweepResult, run_sweep
from pytest_spark.serving.stream import ServingError

__all__ = ["decode_sweep", "encode_sweep", "measure_sweep"]


def measure_sweep(
    api: ApiEndpoint, spec: LoadSpec, progress: Progress | None = None
) -> SweepResult | ServingError:
    try:
        return run_sweep(api, spec, progress)
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
