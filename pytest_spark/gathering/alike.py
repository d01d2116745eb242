"""Nodes-alike facts of the cluster: one probe round trip per node, all nodes at once,
cached for the session. The checks are pure (:mod:`pytest_spark.checks.alike`)."""

from __future__ import annotations

import pytest

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.facts.alike import NodeAlike, alike_probe_command, parse_alike_probe
from pytest_spark.parsers.links import ParseError


def node_alike(cluster: Cluster, node: Node) -> NodeAlike:
    settings = cluster.settings

    def probe() -> NodeAlike:
        command = alike_probe_command(container=settings.container, image=settings.image)
        result = node.run(command, timeout=120)
        try:
            return parse_alike_probe(result.stdout)
        except ParseError as exc:
            pytest.fail(
                f"{node.name}: cannot read the nodes-alike probe output ({exc}):\n"
                f"{result.evidence()}",
                pytrace=False,
            )

    return cluster.cached(("alike-facts", node.name), probe)


def all_alike(cluster: Cluster) -> dict[str, NodeAlike | RemoteError]:
    """Every node's facts (a node the suite cannot reach gives its RemoteError)."""
    cluster.connect()
    return cluster.cached(
        "alike-facts-wave", lambda: cluster.map(lambda node: node_alike(cluster, node))
    )
