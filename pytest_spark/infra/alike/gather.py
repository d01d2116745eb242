"""Nodes-alike facts of the cluster: the nodes-alike probe, all nodes at once, cached for
the session. It shares each node's host-facts round trip with the preflight probe
(:func:`pytest_spark.infra.roundtrip.host_round_trip`). The checks are pure
(:mod:`pytest_spark.infra.alike.check`)."""

from __future__ import annotations

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.alike.probe import HOST_PROBE, NodeAlike
from pytest_spark.infra.roundtrip import gather_probe


def node_alike(cluster: Cluster, node: Node) -> NodeAlike:
    return gather_probe(cluster, node, HOST_PROBE)


def all_alike(cluster: Cluster) -> dict[str, NodeAlike | RemoteError]:
    """Every node's facts (a node the suite cannot reach gives its RemoteError)."""
    cluster.connect()
    return cluster.cached(
        "alike-facts-wave", lambda: cluster.map(lambda node: node_alike(cluster, node))
    )
