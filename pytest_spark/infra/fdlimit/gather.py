"""Open-file limit facts of a node: one probe per node, cached for the session, riding in
the node's shared host round trip. The check is pure
(:mod:`pytest_spark.infra.fdlimit.check`)."""

from __future__ import annotations

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.fdlimit.probe import HOST_PROBE, NodeFdLimits
from pytest_spark.infra.roundtrip import gather_probe


def node_fdlimits(cluster: Cluster, node: Node) -> NodeFdLimits:
    """The node's open-file limits probe, once per session."""
    return gather_probe(cluster, node, HOST_PROBE)
