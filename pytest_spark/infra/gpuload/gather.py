"""The pre-serving GPU load on every node at once, once per session (it runs alone, not
in the shared host round trip: it lasts ``gpu_health.load_s``). The check is pure
(:mod:`pytest_spark.infra.gpuload.check`)."""

from __future__ import annotations

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.gpuload.probe import (
    START_S,
    NodeLoad,
    gpuload_probe_command,
    parse_gpuload_probe,
)

LAUNCHER_IMAGE = "vllm-node"  # eugr/spark-vllm-docker launch-cluster.sh: IMAGE_NAME default


def gpu_load(cluster: Cluster) -> dict[str, NodeLoad | RemoteError]:
    """Every node's samples under the load, run on all nodes at once (so their clocks
    compare under the same load), once per session; a node's RemoteError is kept."""

    def compute() -> dict[str, NodeLoad | RemoteError]:
        section = cluster.profile.gpu_health
        command = gpuload_probe_command(
            image=cluster.settings.image or LAUNCHER_IMAGE,
            load_s=section.load_s,
            interval_s=section.load_interval_s,
        )
        timeout = section.load_s + START_S + 30

        def one(node):  # type: ignore[no-untyped-def]
            result = node.run(command, timeout=timeout)
            try:
                return parse_gpuload_probe(result.stdout)
            except ParseError as exc:
                return NodeLoad((), None, f"cannot read the probe output ({exc})")

        return cluster.map(one)

    return cluster.cached("gpu-load", compute)
