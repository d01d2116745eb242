"""GB10 health without DCGM (issue #28 part 4): the kernel log beyond this boot's NVRM / Xid
lines (those are test_gpuhealth.py's test_gpu_kernel_errors).

Per node: did the previous boot end with a clean shutdown, and what did it log near its
end (``journalctl --list-boots``, ``journalctl -b -1``; one probe in the node's shared host
round trip); PCIe AER errors on the ConnectX-7 functions since boot (read by the GPU
health probe, in the same round trip). See pytest_spark.infra.kernel.check for the rules.
"""

from __future__ import annotations

import pytest

from pytest_spark import Cluster, Node, RemoteError, SparkCheck
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.gpuhealth.gather import node_gpu_health
from pytest_spark.infra.kernel.check import check_pcie_aer, check_previous_boot
from pytest_spark.infra.kernel.gather import node_previous_boot
from pytest_spark.infra.preflight.gather import all_preflight

pytestmark = pytest.mark.preflight


def test_previous_boot_clean(
    spark_node: Node, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """The previous boot ended with a clean shutdown; if not, what it logged near its end."""
    facts = node_previous_boot(spark_cluster, spark_node)
    section = spark_cluster.profile.gpu_health
    spark_check.require(check_previous_boot(spark_node.name, facts, section))


def test_pcie_aer(spark_node: Node, spark_cluster: Cluster, spark_check: SparkCheck) -> None:
    """No uncorrectable PCIe AER error on the ConnectX-7 functions since boot."""
    facts = all_preflight(spark_cluster)[spark_node.name]
    if isinstance(facts, RemoteError):
        pytest.fail(f"node unreachable: {facts}", pytrace=False)
    result = check_pcie_aer(spark_node.name, node_gpu_health(spark_cluster, spark_node).kernel)
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)
