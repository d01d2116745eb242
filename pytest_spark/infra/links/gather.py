"""Link facts of the cluster: one SSH round trip per node, cached for the session. Facts
only: which check skips on them (a down twin) is decided by the fixtures and the checks."""

from __future__ import annotations

import contextlib

import pytest

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.links.check import link_is_usable, link_rate_short
from pytest_spark.infra.links.probe import (
    HOST_PROBE,
    NodeLinkFacts,
    PortFacts,
    discover_fabric_ifs,
)
from pytest_spark.infra.links.twins_check import twin_key
from pytest_spark.infra.roundtrip import gather_probe


def node_link_facts(cluster: Cluster, node: Node) -> NodeLinkFacts:
    """This node's facts. The first call probes every reachable node at once (one wave,
    not one round trip per node as tests reach them)."""
    if ("link-facts", node.name) not in cluster:
        cluster.cached("link-facts-wave", lambda: cluster.map(lambda n: _quiet(cluster, n)))
    return _probe(cluster, node)


def _quiet(cluster: Cluster, node: Node) -> None:
    """Probe ahead; a node's failure is raised where that node's facts are asked for."""
    with contextlib.suppress(Exception, pytest.fail.Exception):
        _probe(cluster, node)


def _probe(cluster: Cluster, node: Node) -> NodeLinkFacts:
    return gather_probe(cluster, node, HOST_PROBE)  # alone, not in the host round trip


def all_link_facts(cluster: Cluster) -> dict[str, NodeLinkFacts | RemoteError]:
    """Every reachable node's facts, gathered concurrently (errors kept per node)."""
    return cluster.map(lambda node: _probe(cluster, node))


def fabric_ifs(cluster: Cluster) -> list[str]:
    """The fabric twins: --spark-fabric-ifs, else every netdev ibdev2netdev reports Up on
    some node, plus its twin (the other netdev of the same physical port), so a twin that
    is down everywhere is still checked rather than silently dropped."""
    if cluster.settings.fabric_ifs:
        return list(cluster.settings.fabric_ifs)

    def discover() -> list[str]:
        facts = [f for f in all_link_facts(cluster).values() if isinstance(f, NodeLinkFacts)]
        up = [name for f in facts for name in discover_fabric_ifs(f)]
        keys = {twin_key(name) for name in up}
        every = [m.netdev for f in facts for m in sorted(f.roce, key=lambda m: (m.dev, m.port))]
        return list(dict.fromkeys(n for n in every if twin_key(n) in keys))

    return cluster.cached("fabric-ifs", discover)


def unusable_fabric_links(cluster: Cluster) -> list[str]:
    """Why each fabric twin that is not up on a reachable node is unusable (the link-up
    check's own words), e.g. ``link not usable: spark-worker-1 enp1s0f1np1: link
    administratively down (see the link-up check)``."""
    reasons = []
    ifs = fabric_ifs(cluster)
    for node, facts in all_link_facts(cluster).items():
        if isinstance(facts, NodeLinkFacts):
            for ifname in ifs:
                usable, reason = link_is_usable(port_of(facts, ifname), node)
                if not usable:
                    reasons.append(reason)
    return reasons


def slow_fabric_links(cluster: Cluster) -> list[str]:
    """The link-rate check's words for each up fabric twin below the profile's rate, one per
    QSFP port (its two twins share the rate), e.g. ``spark-worker-1 enP2p1s0f1np1: link
    rate 100 Gb/s from ibstat (ethtool: 100000Mb/s) (see the link-rate check)``."""
    reasons = []
    floor = cluster.profile.link.min_rate_gbps
    ifs = fabric_ifs(cluster)
    for node, facts in all_link_facts(cluster).items():
        if isinstance(facts, NodeLinkFacts):
            seen = set()
            for ifname in ifs:
                port = port_of(facts, ifname)
                reason = link_rate_short(port, node, floor)
                if reason is not None and (twin_key(ifname), port.rate_gbps) not in seen:
                    seen.add((twin_key(ifname), port.rate_gbps))
                    reasons.append(reason)
    return reasons


def port_of(facts: NodeLinkFacts, ifname: str) -> PortFacts:
    port = facts.ports.get(ifname)
    if port is not None:
        return port
    return PortFacts(
        ifname, None, None, None, None, None, None, None, None, None, None, exists=False
    )
