"""Fabric link state, per node and per fabric twin (REFERENCE.md §2-3)."""

from __future__ import annotations

import ipaddress

import pytest

from pytest_spark import Cluster, Node, SparkCheck
from pytest_spark.checks.links import (
    check_fabric_twins,
    check_link_rate,
    check_link_up,
    check_mtu,
    check_mtu_consistent,
    check_ping,
    check_roce_active,
    check_same_subnet,
    link_is_usable,
)
from pytest_spark.facts.links import NodeLinkFacts, PortFacts, discover_fabric_ifs, ping_command
from pytest_spark.linkstate import all_link_facts, node_link_facts, port_of
from pytest_spark.parsers.links import parse_ping
from pytest_spark.remote.base import RemoteError

pytestmark = pytest.mark.link


def require_usable(node: Node, port: PortFacts) -> None:
    usable, reason = link_is_usable(port, node.name)
    if not usable:
        pytest.skip(reason)


def test_fabric_twins_up(
    spark_node: Node, link_facts: NodeLinkFacts, spark_check: SparkCheck, spark_cluster: Cluster
) -> None:
    expected = int(spark_cluster.profile["link.fabric_twins"])
    spark_check.require(
        check_fabric_twins(
            spark_node.name, discover_fabric_ifs(link_facts), expected, link_facts.roce
        )
    )


def test_link_up(spark_node: Node, port: PortFacts, spark_check: SparkCheck) -> None:
    spark_check.require(check_link_up(spark_node.name, port))


def test_roce_active(spark_node: Node, port: PortFacts, spark_check: SparkCheck) -> None:
    require_usable(spark_node, port)
    spark_check.require(check_roce_active(spark_node.name, port))


def test_link_rate(
    spark_node: Node, port: PortFacts, spark_check: SparkCheck, spark_cluster: Cluster
) -> None:
    require_usable(spark_node, port)
    spark_check.require(
        check_link_rate(spark_node.name, port, float(spark_cluster.profile["link.min_rate_gbps"]))
    )


def test_mtu(
    spark_node: Node, port: PortFacts, spark_check: SparkCheck, spark_cluster: Cluster
) -> None:
    profile = spark_cluster.profile
    spark_check.require(
        check_mtu(
            spark_node.name, port, int(profile["link.min_mtu"]), int(profile["link.hard_min_mtu"])
        )
    )


def _twin_ports(cluster: Cluster, ifname: str) -> dict[str, PortFacts]:
    ports: dict[str, PortFacts] = {}
    for name, facts in all_link_facts(cluster).items():
        if isinstance(facts, RemoteError):
            pytest.fail(f"node unreachable: {facts}", pytrace=False)
        ports[name] = port_of(facts, ifname)
    return ports


def test_mtu_consistent(spark_cluster: Cluster, fabric_if: str, spark_check: SparkCheck) -> None:
    spark_check.require(check_mtu_consistent(_twin_ports(spark_cluster, fabric_if)))


def test_same_subnet(spark_cluster: Cluster, fabric_if: str, spark_check: SparkCheck) -> None:
    ports = _twin_ports(spark_cluster, fabric_if)
    spark_check.require(
        check_same_subnet({node: list(port.addresses) for node, port in ports.items()}, fabric_if)
    )


def test_ping_peer_at_full_mtu(
    spark_cluster: Cluster,
    spark_node: Node,
    port: PortFacts,
    fabric_if: str,
    spark_check: SparkCheck,
) -> None:
    """A don't-fragment ping filling the MTU reaches the next node (a ring covers every
    port as sender and as receiver)."""
    require_usable(spark_node, port)
    nodes = spark_cluster.nodes
    peer = nodes[(nodes.index(spark_node) + 1) % len(nodes)]
    if spark_cluster.unreachable(peer) is not None:
        pytest.skip(f"peer {peer.name} unreachable: {spark_cluster.unreachable(peer)}")
    peer_port = port_of(node_link_facts(spark_cluster, peer), fabric_if)
    if not peer_port.addresses:
        pytest.skip(f"peer {peer.name} has no IPv4 address on {fabric_if} (see the subnet check)")
    peer_addr: ipaddress.IPv4Address = peer_port.addresses[0].ip
    mtu = port.mtu or 1500
    count = int(spark_cluster.profile.get("link.ping_count", 3))
    result = spark_node.run(ping_command(fabric_if, peer_addr, mtu, count), timeout=30)
    small = None
    parsed = parse_ping(result.stdout + result.stderr)
    if parsed.received < parsed.transmitted:
        small_result = spark_node.run(ping_command(fabric_if, peer_addr, 1500, 1), timeout=15)
        small = parse_ping(small_result.stdout + small_result.stderr)
    finding = check_ping(spark_node.name, port, peer.name, peer_addr, parsed, mtu, small_ping=small)
    spark_check.require(finding)
