"""Fixtures of the infra suite (fabric twins, per-node link facts)."""

from __future__ import annotations

import pytest

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.facts.links import NodeLinkFacts, PortFacts
from pytest_spark.gathering.links import fabric_ifs, node_link_facts, port_of


@pytest.fixture
def fabric_if(spark_cluster: Cluster, spark_twin: int) -> str:
    """The interface name of fabric twin ``spark_twin`` (index into the discovered twins)."""
    ifs = fabric_ifs(spark_cluster)
    if spark_twin >= len(ifs):
        expected = spark_cluster.profile.link.fabric_twins
        pytest.fail(
            f"fabric twin {spark_twin}: only {len(ifs)} fabric interface(s) found on any node "
            f"({', '.join(ifs) or 'none'}), expected {expected}. ibdev2netdev shows no Up "
            "RoCE port for it: check cables and `ibdev2netdev` on every node, or name the "
            "interfaces with --spark-fabric-ifs",
            pytrace=False,
        )
    return ifs[spark_twin]


@pytest.fixture
def link_facts(spark_cluster: Cluster, spark_node: Node) -> NodeLinkFacts:
    return node_link_facts(spark_cluster, spark_node)


@pytest.fixture
def port(link_facts: NodeLinkFacts, fabric_if: str) -> PortFacts:
    return port_of(link_facts, fabric_if)
