"""Nodes-alike facts of the cluster: one probe round trip per node, all nodes at once,
cached for the session. The checks are pure (:mod:`pytest_spark.checks.alike`)."""

from __future__ import annotations

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.facts.alike import NodeAlike, alike_probe_command, parse_alike_probe
from pytest_spark.gathering.preflight import cached_probe


def node_alike(cluster: Cluster, node: Node) -> NodeAlike:
    settings = cluster.settings
    command = alike_probe_command(container=settings.container, image=settings.image)
    return cached_probe(cluster, node, command, parse_alike_probe, key="alike", what="nodes-alike")


def all_alike(cluster: Cluster) -> dict[str, NodeAlike | RemoteError]:
    """Every node's facts (a node the suite cannot reach gives its RemoteError)."""
    cluster.connect()
    return cluster.cached(
        "alike-facts-wave", lambda: cluster.map(lambda node: node_alike(cluster, node))
    )
