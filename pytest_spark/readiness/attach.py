"""Attach mode's first look: report what is there (the API's /health, each node's serving
container) instead of waiting on nothing."""

from __future__ import annotations

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.layout import ServingLayout
from pytest_spark.launchers.base import NotServing
from pytest_spark.readiness.parse import parse_probe
from pytest_spark.readiness.probe import SINCE_START, NodeProbe, probe_command
from pytest_spark.settings.resolve import Settings


def attach_precheck(cluster: Cluster, settings: Settings) -> NodeProbe:
    """Attach mode: report what is there instead of waiting on nothing. Returns the
    head's probe (its serving processes tell Ray from no-Ray)."""
    layout = cluster.layout
    cmd = probe_command(
        layout.container(cluster.head),
        SINCE_START,
        settings.port,
        None,
        processes=True,
        serve_log=layout.serve_log,
    )
    head = parse_probe(cluster.head.run(cmd, timeout=15))
    if head.health == "200":
        return head
    states = {cluster.head.name: head.status}
    reachable = [node for node in cluster.workers if cluster.unreachable(node) is None]

    def probe(node: Node) -> CommandResult:
        return node.run(probe_command(layout.container(node), "1s", None, None), timeout=15)

    # All workers at once (a serial loop grew with the node count); the first worker's
    # error, in worker order, is raised as the loop raised it.
    results = cluster.map(probe, reachable)
    for node in reachable:
        result = results[node.name]
        if isinstance(result, RemoteError):
            raise result
        states[node.name] = parse_probe(result, with_health=False).status
    if all(status == "missing" or status.startswith("unknown") for status in states.values()):
        found = ", ".join(f"{n}: {s}" for n, s in states.items())
        raise NotServing(
            f"attach mode: the cluster is not serving. API /health on {cluster.head.name} port "
            f"{settings.port}: {_health_text(head.health)}; {_containers_text(layout)}: "
            f"{found}. Start it (launch-cluster.sh, or run with --spark-launch), or point "
            "--spark-container / --spark-port at what is running"
        )
    return head


def _containers_text(layout: ServingLayout) -> str:
    if layout.job is None:
        return f"container {layout.default!r}"
    return f"sparkrun job {layout.job.cluster_id}'s containers"


def _health_text(code: str | None) -> str:
    return {"000": "connection refused or timed out", None: "not probed"}.get(code, f"HTTP {code}")
