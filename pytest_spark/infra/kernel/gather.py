"""Previous-boot facts of a node: one probe per node, cached for the session, riding in
the node's shared host round trip. The checks are pure (:mod:`pytest_spark.infra.kernel.check`)."""

from __future__ import annotations

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.kernel.probe import HOST_PROBE, PreviousBoot
from pytest_spark.infra.roundtrip import gather_probe


def node_previous_boot(cluster: Cluster, node: Node) -> PreviousBoot:
    """The node's previous-boot probe, once per session."""
    return gather_probe(cluster, node, HOST_PROBE)
