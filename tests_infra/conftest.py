"""Fixtures of the infra suite (fabric twins, per-node link facts)."""

from __future__ import annotations

import pytest

from pytest_spark import Cluster, Node, verdict_in_session
from pytest_spark.infra.links.gather import all_link_facts, fabric_ifs, node_link_facts, port_of
from pytest_spark.infra.links.probe import NodeLinkFacts, PortFacts, discover_fabric_ifs
from pytest_spark.infra.links.twins_check import fabric_twin_missing
from pytest_spark.readiness.reachability import require_reachable


@pytest.fixture
def fabric_if(request: pytest.FixtureRequest, spark_cluster: Cluster, spark_twin: int) -> str:
    """The interface name of fabric twin ``spark_twin`` (index into the discovered twins).
    Not found: an unreachable node is its reachability check's (a twin cannot be found
    on a node the suite cannot ask), a node with too few twins its test_fabric_twins_up's."""
    ifs = fabric_ifs(spark_cluster)
    if spark_twin >= len(ifs):
        require_reachable(request.config, spark_cluster)
        expected = spark_cluster.profile.link.fabric_twins
        short = [
            name
            for name, facts in all_link_facts(spark_cluster).items()
            if isinstance(facts, NodeLinkFacts) and len(discover_fabric_ifs(facts)) < expected
        ]
        fail, text = fabric_twin_missing(
            spark_twin,
            ifs,
            expected,
            short,
            verdict=verdict_in_session(request.session, "test_fabric_twins_up"),
        )
        if fail:
            pytest.fail(text, pytrace=False)
        pytest.skip(text)
    return ifs[spark_twin]


@pytest.fixture
def link_facts(spark_cluster: Cluster, spark_node: Node) -> NodeLinkFacts:
    return node_link_facts(spark_cluster, spark_node)


@pytest.fixture
def port(link_facts: NodeLinkFacts, fabric_if: str) -> PortFacts:
    return port_of(link_facts, fabric_if)
