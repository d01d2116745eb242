"""Fabric link state, per node and per fabric twin (REFERENCE.md §2-3)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark import Cluster, Node, SparkCheck
from pytest_spark.access.base import RemoteError
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
    peer_took_the_link_down,
    twin_key,
)
from pytest_spark.facts.links import NodeLinkFacts, PortFacts, discover_fabric_ifs, ping_command
from pytest_spark.gathering.links import all_link_facts, fabric_ifs, node_link_facts, port_of
from pytest_spark.parsers.links import parse_ping
from pytest_spark.readiness.reachability import require_reachable, unreachable_reason

pytestmark = pytest.mark.link


def require_usable(node: Node, port: PortFacts) -> None:
    usable, reason = link_is_usable(port, node.name)
    if not usable:
        pytest.skip(reason)


def _twin_id(cluster: Cluster, ifname: str) -> str:
    """The ``spark_twin`` id of a fabric interface (as in ``test_link_up[NODE-ID]``)."""
    if cluster.settings.fabric_ifs:
        return ifname
    return f"twin{fabric_ifs(cluster).index(ifname)}"


def _link_down_cause(cluster: Cluster, node: Node, ifname: str) -> str:
    """The link-up check that reports why ``node``'s ``ifname`` is down: its own, or (no
    carrier on a direct cable) the peer's whose end is administratively down."""
    peer = _peer_took_it_down(cluster, node, ifname)
    return f"test_link_up[{peer or node.name}-{_twin_id(cluster, ifname)}]"


def _peer_took_it_down(cluster: Cluster, node: Node, ifname: str) -> str | None:
    if len(cluster.nodes) != 2:  # a switch port between them: the peers are independent
        return None
    peers = {
        name: port_of(facts, ifname)
        for name, facts in all_link_facts(cluster).items()
        if name != node.name and isinstance(facts, NodeLinkFacts)
    }
    return peer_took_the_link_down(port_of(node_link_facts(cluster, node), ifname), peers)


def test_fabric_twins_up(
    spark_node: Node, link_facts: NodeLinkFacts, spark_check: SparkCheck, spark_cluster: Cluster
) -> None:
    """Enough fabric twins Up. A twin that is down is its link-up check's failure: this
    check then skips citing it (one down twin, one failure)."""
    expected = spark_cluster.profile.link.fabric_twins
    up = discover_fabric_ifs(link_facts)
    finding = check_fabric_twins(spark_node.name, up, expected, link_facts.roce)
    if not finding.ok:
        down = [
            i
            for i in fabric_ifs(spark_cluster)
            if i not in up and not link_is_usable(port_of(link_facts, i))[0]
        ]
        if down and len(set(up)) + len(down) >= expected:
            causes = ", ".join(_link_down_cause(spark_cluster, spark_node, i) for i in down)
            pytest.skip(
                f"{spark_node.name}: {len(set(up))} fabric twin(s) Up, expected {expected}: "
                f"{', '.join(down)} down ({causes} has the evidence)"
            )
    spark_check.require(finding)


def test_link_up(
    spark_cluster: Cluster, spark_node: Node, port: PortFacts, spark_check: SparkCheck
) -> None:
    """The port is up with carrier. On a direct cable, no carrier because the peer's end
    is administratively down is the peer's failure: this end skips citing it."""
    finding = check_link_up(spark_node.name, port)
    if not finding.ok:
        peer = _peer_took_it_down(spark_cluster, spark_node, port.netdev)
        if peer is not None:
            pytest.skip(
                f"{spark_node.name} {port.netdev}: no carrier, because {peer}'s end of the "
                f"cable is down ({_link_down_cause(spark_cluster, spark_node, port.netdev)} "
                "has the evidence)"
            )
    spark_check.require(finding)


def test_roce_active(spark_node: Node, port: PortFacts, spark_check: SparkCheck) -> None:
    require_usable(spark_node, port)
    spark_check.require(check_roce_active(spark_node.name, port))


def test_link_rate(
    spark_node: Node, port: PortFacts, spark_check: SparkCheck, spark_cluster: Cluster
) -> None:
    """The link rate. Both twins ride one QSFP port: when the first twin reports the same
    low rate, this twin skips citing it (one slow cable, one failure)."""
    require_usable(spark_node, port)
    floor = spark_cluster.profile.link.min_rate_gbps
    finding = check_link_rate(spark_node.name, port, floor)
    if not finding.ok:
        ifs = fabric_ifs(spark_cluster)
        facts = node_link_facts(spark_cluster, spark_node)
        for sibling in ifs[: ifs.index(port.netdev)] if port.netdev in ifs else ():
            other = port_of(facts, sibling)
            if (
                twin_key(sibling) == twin_key(port.netdev)
                and other.rate_gbps == port.rate_gbps
                and not check_link_rate(spark_node.name, other, floor).ok
            ):
                pytest.skip(
                    f"{spark_node.name} {port.netdev}: link rate {port.rate_gbps:g} Gb/s, the "
                    f"same QSFP port as {sibling} (test_link_rate[{spark_node.name}-"
                    f"{_twin_id(spark_cluster, sibling)}] has the evidence)"
                )
    spark_check.require(finding)


def test_mtu(
    spark_node: Node, port: PortFacts, spark_check: SparkCheck, spark_cluster: Cluster
) -> None:
    profile = spark_cluster.profile
    spark_check.require(
        check_mtu(spark_node.name, port, profile.link.min_mtu, profile.link.hard_min_mtu)
    )


def _twin_ports(config: pytest.Config, cluster: Cluster, ifname: str) -> dict[str, PortFacts]:
    require_reachable(config, cluster)
    ports: dict[str, PortFacts] = {}
    for name, facts in all_link_facts(cluster).items():
        if isinstance(facts, RemoteError):
            pytest.fail(f"cannot read the link facts: {facts}", pytrace=False)
        ports[name] = port_of(facts, ifname)
    return ports


def test_mtu_consistent(
    pytestconfig: pytest.Config, spark_cluster: Cluster, fabric_if: str, spark_check: SparkCheck
) -> None:
    spark_check.require(check_mtu_consistent(_twin_ports(pytestconfig, spark_cluster, fabric_if)))


def test_same_subnet(
    pytestconfig: pytest.Config, spark_cluster: Cluster, fabric_if: str, spark_check: SparkCheck
) -> None:
    ports = _twin_ports(pytestconfig, spark_cluster, fabric_if)
    spark_check.require(
        check_same_subnet({node: list(port.addresses) for node, port in ports.items()}, fabric_if)
    )


def _ring_pings(cluster: Cluster, fabric_if: str) -> dict[str, tuple[Any, ...] | str]:
    """Every node pings the next one on this twin, all at once (once per session): a node's
    entry is (peer, peer_addr, mtu, big ping, small ping or None) or why it was not run."""

    def ping(node: Node) -> tuple[Any, ...] | str:
        nodes = cluster.nodes
        peer = nodes[(nodes.index(node) + 1) % len(nodes)]
        error = cluster.unreachable(peer)
        if error is not None:
            return f"peer {unreachable_reason(peer.name, error)}"
        peer_port = port_of(node_link_facts(cluster, peer), fabric_if)
        if not peer_port.addresses:
            return f"peer {peer.name} has no IPv4 address on {fabric_if} (see the subnet check)"
        peer_addr = peer_port.addresses[0].ip
        mtu = port_of(node_link_facts(cluster, node), fabric_if).mtu or 1500
        count = cluster.profile.link.ping_count
        result = node.run(ping_command(fabric_if, peer_addr, mtu, count), timeout=30)
        parsed = parse_ping(result.stdout + result.stderr)
        small = None
        if parsed.received < parsed.transmitted:
            small_result = node.run(ping_command(fabric_if, peer_addr, 1500, 1), timeout=15)
            small = parse_ping(small_result.stdout + small_result.stderr)
        return (peer, peer_addr, mtu, parsed, small)

    def all_pings() -> dict[str, tuple[Any, ...] | str]:
        usable = [
            n
            for n in cluster.nodes
            if cluster.unreachable(n) is None
            and link_is_usable(port_of(node_link_facts(cluster, n), fabric_if))[0]
        ]
        return {
            name: (value if not isinstance(value, RemoteError) else str(value))
            for name, value in cluster.map(ping, usable).items()
        }

    return cluster.cached(("ring-pings", fabric_if), all_pings)


def test_ping_peer_at_full_mtu(
    pytestconfig: pytest.Config,
    spark_cluster: Cluster,
    spark_node: Node,
    port: PortFacts,
    fabric_if: str,
    spark_check: SparkCheck,
) -> None:
    """A don't-fragment ping filling the MTU reaches the next node (a ring covers every
    port as sender and as receiver); the whole ring is pinged at once."""
    require_usable(spark_node, port)
    outcome = _ring_pings(spark_cluster, fabric_if).get(spark_node.name)
    if outcome is None or isinstance(outcome, str):
        pytest.skip(outcome or f"{spark_node.name}: not pinged")
    peer, peer_addr, mtu, parsed, small = outcome
    finding = check_ping(spark_node.name, port, peer.name, peer_addr, parsed, mtu, small_ping=small)
    if (
        not finding.ok
        and not check_mtu_consistent(_twin_ports(pytestconfig, spark_cluster, fabric_if)).ok
    ):
        # Full-size frames die at the smaller MTU: the mismatch is the root cause.
        pytest.skip(
            f"{spark_node.name} {fabric_if}: DF ping at MTU {mtu} lost, because the MTU "
            f"differs between nodes (test_mtu_consistent[{_twin_id(spark_cluster, fabric_if)}]"
            " has the evidence)"
        )
    spark_check.require(finding)
