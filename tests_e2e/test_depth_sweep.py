"""Depth x concurrency (--spark-depth-sweep), in the shape of the Spark Arena benchmark
(llama-benchy with spark-arena-v2.yaml): context depth, pp, tg and concurrency, a unique
prefix per request (prefix-cache busting) and a heat-aware order
(pytest_spark/serving/load/depth.py). Off by default: the Arena profile is 28 cells, the
deepest at 100000 tokens of context. Recorded (``extra.depth_sweep``, llama-benchy's report
fields) and written as ``depth-sweep.json`` beside the results JSON (--spark-results);
it fails only when a cell's requests failed: it is a measurement, not a gate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_spark import Finding, Settings, SparkCheck, progress_line_writer
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.load.depth import run_depth_sweep

pytestmark = pytest.mark.load

DEPTH_PROP = "depth_sweep"


def _out_path(settings: Settings) -> Path | None:
    """``depth-sweep.json`` beside the results JSON (None: no --spark-results)."""
    return Path(settings.results).parent / "depth-sweep.json" if settings.results else None


def test_depth_sweep(
    request: pytest.FixtureRequest,
    spark_api: ApiEndpoint,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """Every (depth, concurrency) cell answered; the figures recorded in llama-benchy's
    report fields."""
    spec = spark_settings.depth_sweep
    if spec is None:
        pytest.skip("depth x concurrency sweep: not asked for (--spark-depth-sweep runs it)")
    result = run_depth_sweep(spark_api, spec, progress_line_writer(request.config))
    report = result.to_benchy()
    spark_check.attach(DEPTH_PROP, report)
    path = _out_path(spark_settings)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
    where = f"written to {path}" if path else "in the results (--spark-results writes the file)"
    cells = report["benchmarks"]
    broken = [b for b in cells if b["failed"]]
    shown = (
        f"{len(cells)} cells (depths {list(spec.depths)}, concurrency {list(spec.concurrency)}, "
        f"pp {spec.pp}, tg {spec.tg}), heat-aware order, {where}"
    )
    if not broken:
        spark_check.require(Finding.passed(len(cells), len(cells), "cells", message=shown))
        return
    first = broken[0]
    spark_check.require(
        Finding.failed(
            len(cells) - len(broken),
            len(cells),
            "cells",
            message=f"{spark_api.model} at {spark_api.base_url}: depth sweep: {first['failed']} "
            f"of {first['requests']} requests failed at depth {first['context_size']}, "
            f"concurrency {first['concurrency']}: {'; '.join(first['errors'])}. A depth above "
            "the served --max-model-len is refused: lower the depths (depths=...) or check "
            "the server's context length",
            bound=">=",
        )
    )
