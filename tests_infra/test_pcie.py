"""The ConnectX-7 functions' PCIe links, per node: each trained at the width and speed it
is capable of (pytest_spark.infra.pcie.check; the ASUS Ascent GX10's second link at Gen5
x2 halves that twin's bandwidth with no error anywhere). Facts from sysfs, in the node's
shared host round trip."""

from __future__ import annotations

import pytest

from pytest_spark import Cluster, Finding, Node, SparkCheck, require_once_across_nodes
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.pcie.check import check_pcie_links
from pytest_spark.infra.pcie.probe import HOST_PROBE
from pytest_spark.infra.roundtrip import gather_probe

pytestmark = pytest.mark.link


def test_pcie_links_at_capability(
    request: pytest.FixtureRequest,
    spark_node: Node,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    """Every RDMA function's PCIe link at its own maximum width and speed."""

    def judge(node: Node) -> Finding | Skip:
        return check_pcie_links(node.name, gather_probe(spark_cluster, node, HOST_PROBE))

    # the same board on several nodes (two GX10s): one failure naming them all
    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)
