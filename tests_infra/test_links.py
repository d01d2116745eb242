"""Fabric link state, per node and per fabric twin (REFERENCE.md §2-3)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from pytest_spark import (
    Cluster,
    Finding,
    Node,
    RemoteError,
    SparkCheck,
    require_once_across_nodes,
)
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.links.check import (
    check_link_rate,
    check_link_up,
    check_roce_active,
    link_is_usable,
    link_rate_ends,
    link_rate_short,
    nic_firmware,
    peer_took_the_link_down,
)
from pytest_spark.infra.links.gather import all_link_facts, fabric_ifs, node_link_facts, port_of
from pytest_spark.infra.links.mtu_check import check_mtu, check_mtu_consistent
from pytest_spark.infra.links.ping_check import check_ping, check_ping_pairs, ping_pairs_culprit
from pytest_spark.infra.links.probe import (
    NodeLinkFacts,
    PingTarget,
    PortFacts,
    discover_fabric_ifs,
    matrix_peers,
    parse_ping_matrix,
    ping_matrix_command,
)
from pytest_spark.infra.links.subnet_check import check_same_subnet
from pytest_spark.infra.links.twins_check import check_fabric_twins
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
    firmware = nic_firmware(link_facts.ibstat)
    if firmware:  # the report's environment: the ConnectX firmware, per node and device
        spark_check.attach("nic_firmware", firmware)
    expected = spark_cluster.profile.link.fabric_twins
    up = discover_fabric_ifs(link_facts)
    finding = check_fabric_twins(
        spark_node.name, up, expected, link_facts.roce, link_facts.missing_tools
    )
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


def _twin_judge(
    cluster: Cluster,
    ifname: str,
    judge: Callable[[Node, PortFacts], Finding],
    *,
    usable_only: bool,
) -> Callable[[Node], Finding | Skip]:
    """A per-port check on each node's end of twin ``ifname`` (``usable_only``: a port
    that cannot be used skips, as ``require_usable``), for
    verdict.require_once_across_nodes: the same failure on both ends of a twin (RoCE off,
    MTU 1500 on both) is one failure."""

    def on(node: Node) -> Finding | Skip:
        port = port_of(node_link_facts(cluster, node), ifname)
        usable, reason = link_is_usable(port, node.name)
        return judge(node, port) if usable or not usable_only else Skip(reason)

    return on


def test_roce_active(
    request: pytest.FixtureRequest,
    spark_node: Node,
    fabric_if: str,
    spark_check: SparkCheck,
    spark_cluster: Cluster,
) -> None:
    judge = _twin_judge(
        spark_cluster, fabric_if, lambda n, p: check_roce_active(n.name, p), usable_only=True
    )
    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)


def _slow_ends(cluster: Cluster) -> list[tuple[str, str, float]]:
    """Every usable fabric twin below the profile's rate: (node, ifname, rate), nodes in
    the cluster's order, twins in discovery order."""
    floor = cluster.profile.link.min_rate_gbps
    facts = all_link_facts(cluster)
    low = []
    for node in cluster.nodes:
        node_facts = facts.get(node.name)
        if not isinstance(node_facts, NodeLinkFacts):
            continue
        for ifname in fabric_ifs(cluster):
            port = port_of(node_facts, ifname)
            if link_is_usable(port)[0] and link_rate_short(port, node.name, floor) is not None:
                low.append((node.name, ifname, check_link_rate(node.name, port, floor).measured))
    return low


def test_link_rate(
    spark_node: Node, port: PortFacts, spark_check: SparkCheck, spark_cluster: Cluster
) -> None:
    """The link rate. A link has one rate: both twins of a QSFP port share it, and on a
    direct cable both nodes' ends report it. The first end below the floor has the one
    failure, naming every end at that rate; the others skip citing it (one slow cable,
    one failure)."""
    require_usable(spark_node, port)
    floor = spark_cluster.profile.link.min_rate_gbps
    finding = check_link_rate(spark_node.name, port, floor)
    if not finding.ok:
        direct = len(spark_cluster.nodes) == 2  # else a switch port between them
        owner, ends = link_rate_ends(
            _slow_ends(spark_cluster), spark_node.name, port.netdev, direct=direct
        )
        if owner != (spark_node.name, port.netdev):
            pytest.skip(
                f"{spark_node.name} {port.netdev}: link rate {finding.measured:g} Gb/s, the "
                f"same link as {owner[0]} {owner[1]} (test_link_rate[{owner[0]}-"
                f"{_twin_id(spark_cluster, owner[1])}] has the evidence)"
            )
        others = [f"{n} {i}" for n, i in ends if (n, i) != owner]
        if others:
            finding = dataclasses.replace(
                finding,
                message=finding.message.replace(
                    ". Likely",
                    f"; the same rate at {', '.join(others)} (one link, one rate: "
                    f"{' <-> '.join(sorted({n for n, _ in ends}))}). Likely",
                    1,
                ),
            )
    spark_check.require(finding)


def test_mtu(
    request: pytest.FixtureRequest,
    spark_node: Node,
    fabric_if: str,
    spark_check: SparkCheck,
    spark_cluster: Cluster,
) -> None:
    link = spark_cluster.profile.link

    def mtu(node: Node, port: PortFacts) -> Finding:
        return check_mtu(node.name, port, link.min_mtu, link.hard_min_mtu)

    judge = _twin_judge(spark_cluster, fabric_if, mtu, usable_only=False)
    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)


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


def _pair_pings(cluster: Cluster) -> dict[tuple[str, str], dict[str, tuple[Any, ...] | str]]:
    """The ping matrix, once per session: every pair of nodes on every fabric twin, pinged
    from one end (infra.links.probe.matrix_peers: a DF ping's reply tests the way back), all
    nodes at once, one round trip per node; a switch port that drops full-size frames
    shows on each pair through it. Per (node,
    twin): peer -> (peer_addr, mtu, big ping, small ping or None), or why that pair was
    not pinged (the peer unreachable, its twin not usable, no address)."""
    ifs = fabric_ifs(cluster)
    count = cluster.profile.link.ping_count

    def plan(node: Node) -> tuple[list[PingTarget], dict[tuple[str, str], Any]]:
        targets: list[PingTarget] = []
        cells: dict[tuple[str, str], Any] = {}
        facts = node_link_facts(cluster, node)
        for ifname in ifs:
            if not link_is_usable(port_of(facts, ifname))[0]:
                continue
            mtu = port_of(facts, ifname).mtu or 1500
            nodes = cluster.nodes
            for peer in (nodes[i] for i in matrix_peers(len(nodes), nodes.index(node))):
                error = cluster.unreachable(peer)
                if error is not None:
                    cells[(ifname, peer.name)] = f"peer {unreachable_reason(peer.name, error)}"
                    continue
                peer_port = port_of(node_link_facts(cluster, peer), ifname)
                usable, reason = link_is_usable(peer_port, peer.name)
                if not usable:
                    cells[(ifname, peer.name)] = f"peer {reason}"
                elif not peer_port.addresses:
                    cells[(ifname, peer.name)] = (
                        f"peer {peer.name} has no IPv4 address on {ifname} (see the subnet check)"
                    )
                else:
                    addr = str(peer_port.addresses[0].ip)
                    cells[(ifname, peer.name)] = (addr, mtu)
                    targets.append(PingTarget(ifname, addr, mtu))
        return targets, cells

    def ping(node: Node) -> dict[tuple[str, str], Any]:
        targets, cells = plan(node)
        if not targets:
            return cells
        result = node.run(ping_matrix_command(targets, count), timeout=120)
        try:
            outcomes = parse_ping_matrix(result.stdout)
        except ParseError as exc:
            pytest.fail(
                f"{node.name}: cannot read the ping probe output ({exc}):\n{result.evidence()}",
                pytrace=False,
            )
        for key, cell in cells.items():
            if isinstance(cell, tuple):
                addr, mtu = cell
                got = outcomes.get((key[0], addr))
                if got is None or got.big is None:
                    why = got.problem if got is not None else "not in the ping probe output"
                    cells[key] = f"{node.name}: the ping of {addr} gave no result ({why})"
                else:
                    cells[key] = (addr, mtu, got.big, got.small)
        return cells

    def matrix() -> dict[tuple[str, str], dict[str, tuple[Any, ...] | str]]:
        reachable = [n for n in cluster.nodes if cluster.unreachable(n) is None]
        out: dict[tuple[str, str], dict[str, tuple[Any, ...] | str]] = {}
        for name, cells in cluster.map(ping, reachable).items():
            if isinstance(cells, RemoteError):
                for ifname in ifs:
                    out[(name, ifname)] = {"": str(cells)}
                continue
            for (ifname, peer), cell in cells.items():
                out.setdefault((name, ifname), {})[peer] = cell
        return out

    return cluster.cached("ping-matrix", matrix)


def _pair_findings(
    cluster: Cluster, node: Node, fabric_if: str, port: PortFacts, culprit: str | None
) -> tuple[dict[str, Finding], list[str]]:
    """A finding per pair of this node on the twin: the pings it sent and, when it is the
    culprit every failing pair goes through, the other nodes' pings of it too; and why
    other peers were not pinged."""
    matrix = _pair_pings(cluster)
    findings: dict[str, Finding] = {}
    reasons: list[str] = []
    for peer, cell in matrix.get((node.name, fabric_if), {}).items():
        if isinstance(cell, str):
            reasons.append(cell)
            continue
        addr, mtu, big, small = cell
        findings[peer] = check_ping(node.name, port, peer, addr, big, mtu, small_ping=small)
    if culprit == node.name:
        for (sender, ifname), cells in matrix.items():
            cell = cells.get(node.name)
            if ifname == fabric_if and sender not in findings and isinstance(cell, tuple):
                addr, mtu, big, small = cell
                findings[sender] = check_ping(
                    sender, fabric_if, node.name, addr, big, mtu, small_ping=small
                )
    return findings, reasons


def _failing_pairs(cluster: Cluster, fabric_if: str) -> list[tuple[str, str]]:
    """(sender, receiver) of every DF ping on this twin that did not get its replies."""
    pairs = []
    for (name, ifname), cells in _pair_pings(cluster).items():
        if ifname != fabric_if:
            continue
        for peer, cell in cells.items():
            if not isinstance(cell, str) and cell[2].received < cell[2].transmitted:
                pairs.append((name, peer))
    return pairs


def test_ping_peer_at_full_mtu(
    pytestconfig: pytest.Config,
    spark_cluster: Cluster,
    spark_node: Node,
    port: PortFacts,
    fabric_if: str,
    spark_check: SparkCheck,
) -> None:
    """Don't-fragment pings filling the MTU reach the node's peers on this twin (the ping
    matrix covers every pair; its DF replies test the way back). Failing pairs that all go
    through one node are that node's failure, with every pair through it; the others skip
    citing it."""
    require_usable(spark_node, port)
    culprit = ping_pairs_culprit(_failing_pairs(spark_cluster, fabric_if))
    findings, reasons = _pair_findings(spark_cluster, spark_node, fabric_if, port, culprit)
    if not findings:
        pytest.skip("; ".join(reasons) or f"{spark_node.name}: no peer to ping on {fabric_if}")
    finding = check_ping_pairs(spark_node.name, fabric_if, findings, culprit)
    if not finding.ok:
        if not check_mtu_consistent(_twin_ports(pytestconfig, spark_cluster, fabric_if)).ok:
            # Full-size frames die at the smaller MTU: the mismatch is the root cause.
            pytest.skip(
                f"{spark_node.name} {fabric_if}: DF pings at full MTU lost, because the MTU "
                f"differs between nodes (test_mtu_consistent[{_twin_id(spark_cluster, fabric_if)}]"
                " has the evidence)"
            )
        if culprit is not None and culprit != spark_node.name:
            pytest.skip(
                f"{spark_node.name} {fabric_if}: DF pings at full MTU lost only to {culprit}, "
                f"which every failing pair goes through (test_ping_peer_at_full_mtu[{culprit}-"
                f"{_twin_id(spark_cluster, fabric_if)}] has the evidence)"
            )
    spark_check.require(finding)
