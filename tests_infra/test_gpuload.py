"""A short GPU load on each node before serving (issue #28 part 4): bf16 matmuls for
``gpu_health.load_s`` seconds (the serving image's torch, else the host's python3) on every
node at once, nvidia-smi sampling the SM clock, power, temperature and utilisation under
it. A node clock-locked below the profile's floor (the GB10 low-power state) fails here,
before a model load that would take minutes to meet it; a node well below its peers warns.

Launch mode only: attached, the serving engine holds the GPU and
``test_gpu_clocks_not_throttled`` reads the clock under its load. In launch mode that
check's low-clock rule skips citing this one (one cause, one failure).
"""

from __future__ import annotations

import pytest

from pytest_spark import Cluster, Node, Settings, SparkCheck
from pytest_spark.infra.gpuload.check import busy_clock, check_gpu_clock_under_load
from pytest_spark.infra.gpuload.gather import gpu_load
from pytest_spark.infra.gpuload.probe import NodeLoad
from pytest_spark.measure.codec import dump, load
from pytest_spark.measure.once import Measured, measure_once
from pytest_spark.readiness.reachability import require_reachable

pytestmark = pytest.mark.preflight


@pytest.fixture(scope="session")
def _gpu_load(
    request: pytest.FixtureRequest, spark_cluster: Cluster
) -> Measured[dict[str, NodeLoad]]:
    """Once per session, alone on the cluster, also under xdist (pytest_spark.measure.once):
    one load and one record, whichever node's check asks first."""
    return measure_once(
        request.config,
        "gpu-load",
        lambda: gpu_load(spark_cluster),
        encode=dump,
        decode=lambda data: load(dict[str, NodeLoad], data),
    )


def test_gpu_clock_under_load(
    request: pytest.FixtureRequest,
    spark_node: Node,
    spark_cluster: Cluster,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    if not spark_settings.launch:
        pytest.skip(
            f"{spark_node.name}: attached, the serving engine holds the GPU: "
            f"test_gpu_clocks_not_throttled[{spark_node.name}] reads the clock under its load"
        )
    require_reachable(request.config, spark_cluster, [spark_node])
    measured = request.getfixturevalue("_gpu_load")
    spark_check.attach("measurement", measured.record)
    loads = measured.value
    node_load = loads[spark_node.name]
    section = spark_cluster.profile.gpu_health
    peers = {name: busy_clock(other, section) for name, other in loads.items()}
    spark_check.require(check_gpu_clock_under_load(spark_node.name, node_load, peers, section))
