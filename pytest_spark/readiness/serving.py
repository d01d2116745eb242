"""Why the cluster is not serving, as the checks that need it cite it: the state of the
launch or attach (``ServingState``) and of the served API (``ApiState``); a skip naming the
root cause while the serving verdict (``test_cluster_serving``) runs, else a failure; the
root cause when it is another check's (an unreachable node, a down fabric port); the head's
own account when the API does not answer (``head_account``); and the route to the head's
API (direct, or an SSH tunnel via the head).

The fixtures (``pytest_spark.fixtures``) build these states once per session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster
from pytest_spark.access.layout import ServingLayout
from pytest_spark.readiness.ranks import ServingInfo
from pytest_spark.readiness.reachability import (
    REACHABILITY_VERDICT_KEY,
    unreachable,
    unreachable_reason,
)
from pytest_spark.settings.resolve import Settings

# Whether a spark_serving_verdict check (test_cluster_serving) runs in this session: only
# then may the checks that need the server skip when it is down (else they must fail).
SERVING_VERDICT_KEY: pytest.StashKey[bool] = pytest.StashKey()


@dataclass(frozen=True)
class ServingState:
    """What standing the cluster up (or attaching to it) found: ready, or why not."""

    info: ServingInfo | None
    problem: str | None
    # A skip reason when the problem is another check's failure (a node the suite cannot
    # reach): test_cluster_serving and every check that needs the server skip citing it.
    cited: str | None = None


@dataclass(frozen=True)
class ApiState:
    endpoint: ApiEndpoint | None
    problem: str | None
    cited: str | None = None


def not_serving(config: pytest.Config, problem: str, cited: str | None = None) -> NoReturn:
    """Skip pointing at the serving verdict check when it runs in this session; fail with
    the whole problem when it does not (``-m tool_calls`` on a dead server must not pass).
    A problem ``cited`` from another check (an unreachable node) skips citing that."""
    if cited is not None:
        pytest.skip(cited)
    if config.stash.get(SERVING_VERDICT_KEY, False):
        pytest.skip(not_serving_reason(problem))
    pytest.fail(problem, pytrace=False)


def not_serving_reason(problem: str) -> str:
    """The skip reason of a check that needs the server: the root cause, and where to look."""
    headline = next((line.strip() for line in problem.splitlines() if line.strip()), problem)
    if len(headline) > 300:
        headline = headline[:297] + "..."
    return f"the cluster is not serving: {headline} (test_cluster_serving has the evidence)"


# launch-cluster.sh's refusal when a node has neither 2 nor 4 RoCE devices Up.
LAUNCHER_DEVICE_COUNT = "Unexpected number of active CX7 interfaces"


def down_port_cause(cluster: Cluster, problem: str) -> str | None:
    """The serving failure's root cause when a rank's NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    names a fabric port that is down (the engine dies when its bootstrap link drops): the
    link-up check reports that port, so the serving checks skip citing it. None otherwise
    (ask only when a link-up check runs in this session: it must report the port)."""
    from pytest_spark.infra.nccl.gather import down_fabric_ports, down_socket_ports, rank_envs

    try:
        if LAUNCHER_DEVICE_COUNT in problem:  # the launcher refused: too few RoCE devices Up
            down = [
                f"launch-cluster.sh needs 2 or 4 RoCE devices Up: {r}"
                for r in (down_fabric_ports(cluster))
            ]
        else:
            envs = rank_envs(cluster)
            down = down_socket_ports(cluster, envs) if not isinstance(envs, str) else []
    except (RemoteError, pytest.fail.Exception, pytest.skip.Exception):
        return None
    if not down:
        return None
    headline = not_serving_reason(problem).removesuffix(" (test_cluster_serving has the evidence)")
    return f"{headline}, because {'; '.join(down)}"


def no_rdma_serving_cause(cluster: Cluster, problem: str) -> str | None:
    """The serving failure's root cause when nodes have no RDMA drivers (no
    /sys/class/infiniband: ibdev2netdev lists nothing, so no fabric interface for the
    launcher): the GID check reports every such node, so the serving checks skip citing
    it. None otherwise (ask only when the GID check runs in this session: it must report it)."""
    from pytest_spark.infra.nccl.gather import nodes_without_rdma
    from pytest_spark.infra.nccl.gid_check import no_rdma_cause

    try:
        cause = no_rdma_cause(nodes_without_rdma(cluster), None)
    except (RemoteError, pytest.fail.Exception, pytest.skip.Exception):
        return None
    if cause is None:
        return None
    headline = not_serving_reason(problem).removesuffix(" (test_cluster_serving has the evidence)")
    return f"{headline}, because {cause}"


def unreachable_for_serving(
    config: pytest.Config, cluster: Cluster, settings: Settings
) -> str | None:
    """Why serving cannot be judged, citing test_node_reachable: the head unreachable, or
    (launching) any node, since a launch starts and watches every node. Attached, the API
    on the head is still judged with a worker out of the suite's reach. None when the
    reachability check is not in the session (then the serving check reports it all)."""
    if not config.stash.get(REACHABILITY_VERDICT_KEY, False):
        return None
    needed = cluster.nodes if settings.launch else [cluster.head]
    for node in unreachable(cluster, needed):
        error = cluster.unreachable(node)
        assert error is not None
        return unreachable_reason(node.name, error)
    return None


def server_log_hint(settings: Settings, layout: ServingLayout | None = None) -> str:
    """Where the serving engine's own account of a failure is: the head's container log
    (a sparkrun job's: its serve log inside the head's rank container, ``layout``), or
    with --spark-api-url alone (no node to read it on) the server's own log."""
    if settings.head and layout is not None and layout.serve_log is not None:
        head = layout.default  # a sparkrun layout's default is the head's rank container
        return f"the head's serve log (`docker exec {head} tail -n 100 {layout.serve_log}`)"
    if settings.head:
        name = layout.default if layout is not None else settings.container
        return f"the head's container log (`docker logs {name}` on the head)"
    return f"the server's own log (on the machine that serves {settings.api_url})"


def route_to_api(cluster: Cluster, port: int) -> tuple[str, Any]:
    """Direct to the head's address when it answers, else an SSH tunnel via the head."""
    import httpx

    from pytest_spark.access import body
    from pytest_spark.access.tunnel import Tunnel

    direct = f"http://{cluster.head.conn.target.hostname}:{port}"
    try:
        with httpx.Client(timeout=3) as client:
            if body.get(client, f"{direct}/health", cap=64 * 1024).status_code == 200:
                return direct, None
    except httpx.HTTPError:
        pass
    tunnel = Tunnel(cluster.head.conn, "127.0.0.1", port)
    return tunnel.url, tunnel


HEAD_TAIL_LINES = 15  # the head's last log lines a not-serving failure quotes


def head_account(
    problem: str,
    node: str,
    container: str,
    status: str,
    lines: list[str],
    log_hint: str | None = None,
) -> tuple[str, dict[str, str]]:
    """A not-serving failure that only says what the API answered (``Connection refused``)
    with the head's own account added: its serving container's state (``exited (code
    137)``: the engine was killed) and its last log lines, in the message and as evidence.
    A problem that already names the container (the readiness watch's), or a container
    that runs (an API key, a proxy: not the engine's story), is kept as it is.
    ``log_hint``: where its log is read (default ``docker logs CONTAINER`` on the node)."""
    if container in problem or status in ("", "running") or status.startswith("unknown"):
        return problem, {}
    tail = [line.rstrip() for line in lines if line.strip()][-HEAD_TAIL_LINES:]
    state = f"{node}: container {container!r} {status}"
    hint = log_hint or f"`docker logs {container}` on {node}"
    message = f"{problem}\n  {state} (its engine is gone: {hint} says why)"
    if tail:
        message += f"\n  {node} log (last {len(tail)} lines):\n" + "\n".join(
            f"    {line}" for line in tail
        )
    return message, {"container": state, f"{node} log": "\n".join(tail)}
