"""The closed-loop concurrency sweep as the serving checks share it: measured once per
session (:func:`pytest_spark.measure.once.measure_once`, alone on the cluster) and
carried between processes as JSON. The session fixture that measures it is ``_sweep`` in
tests_e2e/conftest.py; the verdicts on it (:class:`Sweep`, below) are read by
the throughput checks (tests_e2e/test_throughput.py) and, where its goodput gate owns a
broken SLO, cited by the open-loop knee (tests_e2e/test_open_loop.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.infra.finding import Finding
from pytest_spark.measure.codec import dump, load_as
from pytest_spark.serving.client.stream import ServingError
from pytest_spark.serving.load.sweep import (
    LevelResult,
    LoadSpec,
    Progress,
    SweepResult,
    run_sweep,
)

__all__ = ["Requires", "Sweep", "decode_sweep", "encode_sweep", "measure_sweep"]


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


class Requires(Protocol):
    """What a check asserts a finding with (``pytest_spark.SparkCheck``)."""

    def require(self, finding: Finding) -> Finding: ...


class Sweep:
    """The closed-loop sweep (:mod:`pytest_spark.serving.closedloop`), run once per session,
    as the throughput checks and the open-loop knee read it: its failure (if any) is
    reported by every check, or skipped citing the wire verdict."""

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

    def require_warmed_up(self, spark_check: Requires) -> SweepResult:
        """The sweep's result; its warm-up failure as this check's, or a skip citing the
        wire verdict when the stream is broken for every request (the canary's too)."""
        if self.error is not None:
            cited = self.wire_cited(self.error.kind, self.error.message)
            if cited is not None:
                pytest.skip(f"throughput warm-up: {cited}")
            spark_check.require(self.error.finding(f"{self.server}: throughput warm-up"))
        assert self.result is not None
        return self.result

    def level(self, spark_check: Requires, concurrency: int, what: str) -> LevelResult:
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
