"""GPU health facts of a node: its probe, once per session, riding the node's shared host
round trip beside the preflight probe. The checks are pure
(:mod:`pytest_spark.infra.gpuhealth.check`)."""

from __future__ import annotations

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.gpuhealth.probe import HOST_PROBE, GpuHealth
from pytest_spark.infra.roundtrip import gather_probe


def node_gpu_health(cluster: Cluster, node: Node) -> GpuHealth:
    """The node's GPU health probe, once per session."""
    return gather_probe(cluster, node, HOST_PROBE)
