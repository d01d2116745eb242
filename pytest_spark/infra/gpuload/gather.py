"""The pre-serving GPU load on every node at once, once per session (it runs alone, not
in the shared host round trip: it lasts ``gpu_health.load_s``). The check is pure
(:mod:`pytest_spark.infra.gpuload.check`)."""

from __future__ import annotations

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.gpuload.probe import (
    START_S,
    NodeLoad,
    gpuload_probe_command,
    parse_gpuload_probe,
)

LAUNCHER_IMAGE = "vllm-node"  # eugr/spark-vllm-docker launch-cluster.sh: IMAGE_NAME default


def gpu_load(cluster: Cluster) -> dict[str, NodeLoad]:
    """Every node's samples under the load, run on all nodes at once (so their clocks
    compare under the same load), once per session; a node that could not run it has no
    samples and its ``error`` says why."""

    def compute() -> dict[str, NodeLoad]:
        section = cluster.profile.gpu_health
        command = gpuload_probe_command(
            image=cluster.settings.image or LAUNCHER_IMAGE,
            load_s=section.load_s,
            interval_s=section.load_interval_s,
        )
        timeout = section.load_s + START_S + 30

        def one(node: Node) -> NodeLoad:
            result = node.run(command, timeout=timeout)
            try:
                return parse_gpuload_probe(result.stdout)
            except ParseError as exc:
                return NodeLoad((), None, f"cannot read the probe output ({exc})")

        return {
            name: NodeLoad((), None, f"the load could not run: {result}")
            if isinstance(result, RemoteError)
            else result
            for name, result in cluster.map(one).items()
        }

    return cluster.cached("gpu-load", compute)
