"""The RoCE GID index NCCL uses: a RoCE v2 GID on each fabric HCA, the same on every node.

Read from sysfs on each node (``/sys/class/infiniband/DEV/ports/1/gids/N`` and
``gid_attrs/types/N``), with the index NCCL would pick: ``NCCL_IB_GID_INDEX`` from the
serving container's environment, else NCCL's own auto-selection.
"""

from __future__ import annotations

import pytest

from pytest_spark import Cluster, Node, Settings, SparkCheck, verdict_in_session
from pytest_spark.infra.nccl.check import FABRIC_DEVS
from pytest_spark.infra.nccl.gather import fabric_devs, gid_tables, nodes_without_rdma, rank_envs
from pytest_spark.infra.nccl.gid_check import (
    GID_VERDICT,
    GidChoice,
    check_gid_same,
    check_gid_v2,
    gid_choices,
    no_rdma_cause,
)
from pytest_spark.infra.nccl.gid_parse import GidTable
from pytest_spark.readiness.reachability import require_reachable

pytestmark = pytest.mark.nccl


@pytest.fixture(scope="session")
def _nccl_envs(
    request: pytest.FixtureRequest, spark_cluster: Cluster, spark_settings: Settings
) -> dict[str, dict[str, str]]:
    """Each node's NCCL environment (NCCL_IB_GID_INDEX and friends) as its rank gets it."""
    require_reachable(request.config, spark_cluster)
    if spark_settings.launch:
        # The environment is the launched containers'; a failed launch is
        # test_cluster_serving's, and the fallback (the launcher's defaults) is read then.
        request.getfixturevalue("spark_serving_state")
    envs = rank_envs(spark_cluster)
    if isinstance(envs, str):
        pytest.fail(f"the NCCL environment could not be read: {envs}", pytrace=False)
    return envs


def _tables(cluster: Cluster, node: Node) -> dict[str, GidTable] | None:
    tables = gid_tables(cluster, node)
    if isinstance(tables, str):
        pytest.fail(f"{node.name}: the RoCE GID tables could not be read: {tables}", pytrace=False)
    return tables


def _devs(cluster: Cluster, node: Node) -> list[str]:
    return fabric_devs(cluster, node) or list(FABRIC_DEVS)


def test_roce_gid_is_v2(
    spark_cluster: Cluster,
    spark_node: Node,
    spark_check: SparkCheck,
    _nccl_envs: dict[str, dict[str, str]],
) -> None:
    tables = _tables(spark_cluster, spark_node)
    env = _nccl_envs.get(spark_node.name)
    without = nodes_without_rdma(spark_cluster)
    cause = no_rdma_cause(without, spark_node.name)
    if cause is not None:
        pytest.skip(cause)  # no RDMA on several nodes: one cause, the first one's failure
    spark_check.require(
        check_gid_v2(spark_node.name, tables, env, _devs(spark_cluster, spark_node), without)
    )


def test_roce_gid_index_same_on_every_node(
    request: pytest.FixtureRequest,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
    _nccl_envs: dict[str, dict[str, str]],
) -> None:
    # Nodes whose own GID is not RoCE v2 are test_roce_gid_is_v2[NODE]'s failure: compared
    # here they would give the same root cause twice. A node without RDMA has no GID to
    # compare: not a pass, the GID check's failure (no RDMA on the nodes is one cause).
    cause = no_rdma_cause(nodes_without_rdma(spark_cluster), None)
    if cause is not None and verdict_in_session(request.session, GID_VERDICT):
        pytest.skip(f"GID index: {cause}")
    choices: dict[str, dict[str, GidChoice | None]] = {}
    for node in spark_cluster.nodes:
        tables = _tables(spark_cluster, node)
        if tables is None:
            continue
        mine = gid_choices(tables, _nccl_envs.get(node.name), _devs(spark_cluster, node))
        if all(c is not None and c.ok for c in mine.values()):
            choices[node.name] = mine
    spark_check.require(check_gid_same(choices, spark_cluster.head.name))
