"""Preflight facts of the cluster: one probe round trip per node (cached for the session),
a clock reading per node, the head's SSH attempts to its workers, the serving containers'
environment. The checks themselves are pure (``pytest_spark.infra.preflight.*_check``)."""

from __future__ import annotations

import contextlib
import time
from typing import TypeVar

import pytest

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.links.gather import fabric_ifs, node_link_facts
from pytest_spark.infra.preflight.probe import (
    HOST_PROBE,
    ClockSample,
    NodePreflight,
    SshAttempt,
    clock_command,
    container_env_command,
    parse_container_env,
    parse_ssh_probe,
    ssh_probe_command,
)
from pytest_spark.infra.roundtrip import gather_probe

T = TypeVar("T")

CLOCK_SAMPLES = 3


def node_preflight(cluster: Cluster, node: Node) -> NodePreflight:
    return gather_probe(cluster, node, HOST_PROBE)


def all_preflight(cluster: Cluster) -> dict[str, NodePreflight | RemoteError]:
    cluster.connect()
    if all(
        cluster.unreachable(n) is not None or ("preflight-facts", n.name) in cluster
        for n in cluster.nodes
    ):  # every test asks: once all is cached, no thread per node each time
        return {n.name: cluster.unreachable(n) or node_preflight(cluster, n) for n in cluster.nodes}
    return cluster.map(lambda node: node_preflight(cluster, node))


def clock_samples(cluster: Cluster) -> dict[str, ClockSample | RemoteError]:
    """Each node's clock against the runner's: the reading with the shortest round trip
    of a few, offset taken from the round trip's midpoint."""

    def sample(node: Node) -> ClockSample:
        best: ClockSample | None = None
        for _ in range(CLOCK_SAMPLES):
            t0 = time.time()
            result = node.run(clock_command(), timeout=15)
            t1 = time.time()
            try:
                remote = float(result.stdout.split()[0])
            except (ValueError, IndexError):
                pytest.fail(
                    f"{node.name}: `date +%s.%N` printed {result.stdout!r}:\n{result.evidence()}",
                    pytrace=False,
                )
            s = ClockSample(node.name, remote - (t0 + t1) / 2, t1 - t0)
            if best is None or s.rtt_s < best.rtt_s:
                best = s
        assert best is not None
        return best

    return cluster.cached("preflight-clock", lambda: cluster.map(sample))


def address_owners(cluster: Cluster) -> dict[str, str]:
    """Every IPv4 address a node holds (and its management address) -> node name."""
    owners: dict[str, str] = {}
    for node in cluster.nodes:
        owners.setdefault(node.address, node.name)
        if cluster.unreachable(node) is not None:
            continue
        for addrs in node_link_facts(cluster, node).ip_addrs.values():
            for a in addrs:
                owners.setdefault(str(a.ip), node.name)
    return owners


def ssh_from_head(cluster: Cluster, addresses: list[str]) -> list[SshAttempt]:
    def attempt() -> list[SshAttempt]:
        if not addresses:
            return []
        result = cluster.head.run(ssh_probe_command(addresses), timeout=30 + 15 * len(addresses))
        try:
            return parse_ssh_probe(result.stdout)
        except ParseError as exc:
            pytest.fail(
                f"{cluster.head.name}: cannot read the SSH probe output ({exc}):\n"
                f"{result.evidence()}",
                pytrace=False,
            )

    return cluster.cached(("preflight-ssh", tuple(addresses)), attempt)


def serving_env(cluster: Cluster, node: Node) -> dict[str, str] | None:
    """The serving container's environment on the node; None when there is none. The
    first call reads every node's at once."""

    def read(one: Node) -> dict[str, str] | None:
        def compute() -> dict[str, str] | None:
            result = one.run(container_env_command(cluster.container(one)), timeout=30)
            if not result.ok:
                return None
            try:
                return parse_container_env(result.stdout)
            except ParseError as exc:
                pytest.fail(f"{one.name}: {exc}:\n{result.evidence()}", pytrace=False)

        return cluster.cached(("preflight-serving-env", one.name), compute)

    def ahead(one: Node) -> None:
        with contextlib.suppress(Exception, pytest.fail.Exception):
            read(one)  # a failure is raised again where that node's env is asked for

    if ("preflight-serving-env", node.name) not in cluster:
        cluster.cached("preflight-serving-env-wave", lambda: cluster.map(ahead))
    return read(node)


def fabric_of(cluster: Cluster, node: Node) -> tuple[list[str], list[str], dict[str, bool]]:
    """(fabric netdevs, their RDMA devices, every netdev -> has an IPv4 address)."""
    ifs = fabric_ifs(cluster)
    facts = node_link_facts(cluster, node)
    devs = [m.dev for m in facts.roce if m.netdev in ifs]
    names = set(facts.ip_links) | set(facts.ip_addrs)
    return ifs, list(dict.fromkeys(devs)), {n: bool(facts.ip_addrs.get(n)) for n in names}


def wireless_ifs(cluster: Cluster, node: Node) -> frozenset[str]:
    """The node's wireless netdevs (sysfs, or ``iw dev``), from its link probe."""
    return node_link_facts(cluster, node).wireless


def roce_ports(cluster: Cluster, node: Node) -> list[tuple[str, str, bool]]:
    """The node's own ``ibdev2netdev``: (RDMA device, netdev, Up), for judging its serving
    environment against its own cabling (not the head's)."""
    return [(m.dev, m.netdev, m.up) for m in node_link_facts(cluster, node).roce]
