"""The serving containers' states on the nodes (``docker inspect``), read by the launchers
(is a name free before a launch, is it gone after a stop) and by the checks: a docker
daemon that does not answer is "unknown", never "no container"."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.layout import ServingLayout, launcher_layout

LEFTOVER_WAIT_S = 30.0  # dockerd removes a stopped --rm container just after `docker stop`


def inspected_state(result: CommandResult) -> tuple[str, str | None]:
    """``docker inspect -f '{{.State.Status}}' NAME``'s answer: ``(state, None)`` with
    state running, exited, ... or "missing" (no such container); ``("unknown", error)``
    when docker itself did not answer (a daemon that is down, no permission on its
    socket): its stderr is docker's error, never a state or a container name."""
    state = result.stdout.strip()
    error = result.stderr.strip()
    if result.ok and state:
        return state.split()[0], None
    if "No such" in error or "No such" in state:
        return "missing", None
    return "unknown", (error or state or f"docker inspect exited {result.rc}").splitlines()[0]


DOCKER_SILENT = "unknown: docker did not answer"


def container_states(cluster: Cluster, container: str | ServingLayout) -> dict[str, str]:
    """Each reachable node's state of ``container`` (one name, or a layout's container on
    each node) (``docker inspect``: running, exited,
    removing, ...), "" where there is none, or ``unknown: docker did not answer (...)``
    where the daemon did not (that is no answer about the container: it was read as
    "no container")."""
    layout = launcher_layout(container) if isinstance(container, str) else container

    def inspect(node: Node) -> CommandResult:
        name = shlex.quote(layout.container(node))
        return node.run(f"docker inspect -f '{{{{.State.Status}}}}' {name}", timeout=15)

    reachable = [node for node in cluster.nodes if cluster.unreachable(node) is None]
    results = cluster.map(inspect, reachable)
    states = {}
    for node in reachable:
        result = results[node.name]
        if isinstance(result, RemoteError):
            states[node.name] = ""
        elif result.ok:
            states[node.name] = result.stdout.strip()
        else:
            error = next((ln.strip() for ln in result.stderr.splitlines() if ln.strip()), "")
            silent = error and "no such" not in error.lower()
            states[node.name] = f"{DOCKER_SILENT} ({error})" if silent else ""
    return states


def wait_gone(
    cluster: Cluster,
    container: str | ServingLayout,
    wait_s: float = LEFTOVER_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> dict[str, str]:
    """Wait up to ``wait_s`` for stopped containers of that name to go (a ``--rm``
    container is removed by dockerd after ``docker stop`` returns). Returns what is still
    there: every running one at once, else the stopped ones left after the wait."""
    deadline = now() + wait_s
    while True:
        states = {
            name: state
            for name, state in container_states(cluster, container).items()
            if state and not state.startswith(DOCKER_SILENT)  # the docker check's, not ours
        }
        if not states or "running" in states.values() or now() >= deadline:
            return states
        sleep(1.0)
