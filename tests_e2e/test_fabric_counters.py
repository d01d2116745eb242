"""Fabric error counters (issue #28 part 4): every ConnectX port's ``ethtool -S`` error
counters and ``link_down_events_phy`` and its RoCE ``hw_counters``, read before and after
the all-reduce run and the throughput sweep (pytest_spark.infra.counters.gather.counted),
must not rise. Runs with the throughput category, after its sweep (it asks for it); the
all-reduce run's window counts when the nccl category ran in the session.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark import Cluster, Node, SparkCheck
from pytest_spark.infra.counters.check import check_fabric_counters
from pytest_spark.infra.counters.gather import windows
from pytest_spark.infra.finding import Skip
from pytest_spark.measure.once import measure_dir

pytestmark = pytest.mark.throughput


def test_fabric_error_counters(
    request: pytest.FixtureRequest,
    spark_node: Node,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
    _sweep: tuple[Any, dict[str, Any]],
) -> None:
    """No fabric error counter of this node rose during the suite's traffic."""
    result = check_fabric_counters(spark_node.name, windows(measure_dir(request.config)))
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)
