"""Which launcher a collective run uses: every node probed once, concurrently, and the
first launcher that every node offers wins (REFERENCE §3 and issue 4):

1. ``nccl-tests``: ``all_reduce_perf`` on the host PATH (or ``~/nccl-tests/build``) or inside
   the serving container, launched from the head with ``mpirun -np N -H ip1:1,ip2:1`` as
   NVIDIA's playbooks do. nccl-tests spans nodes only through MPI (nccl-tests#121), so
   without ``mpirun`` the binary is passed over, with a note saying so.
2. ``container``: the shipped script (``scripts/``) run by a python with torch inside the
   serving container (``docker exec -i C python3 - ARGS < script``), so it sees the
   container's ``NCCL_*``/``GLOO_*`` environment, exactly what vLLM sees.
3. ``python``: the same script run by the host's ``python3`` when it has torch.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.infra.nccl.command_probe import (
    STEP_TIMEOUT,
    Containers,
    container_names,
    container_on,
    probe_command,
)
from pytest_spark.infra.nccl.probe import LaunchPlan

__all__ = [
    "CollectiveUnavailable",
    "Launcher",
    "RankNode",
    "detect_launcher",
    "each_node",
    "plan_launch",
]

Launcher = Literal["auto", "python", "container", "nccl-tests"]


class RankNode(Protocol):
    """What the runner needs from a node: a name and a command runner (cluster.Node) that
    can hand over stdout as it arrives (``on_output``: asked of rank 0 for progress only)."""

    name: str

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> CommandResult: ...


class CollectiveUnavailable(RuntimeError):
    """No launcher works on every node: no nccl-tests with mpirun and no python with torch."""


def _facts(result: CommandResult | RemoteError | BaseException) -> dict[str, str]:
    if not isinstance(result, CommandResult):
        return {"error": str(result)}
    facts = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key.strip()] = value.strip()
    return facts


def each_node(
    nodes: Sequence[RankNode], fn: Callable[[RankNode], CommandResult], timeout: float
) -> list[CommandResult | BaseException]:
    """Run ``fn(node)`` on every node at once; exceptions are returned, not raised."""
    with cf.ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        futures = [pool.submit(fn, n) for n in nodes]
        out: list[CommandResult | BaseException] = []
        for fut in futures:
            try:
                out.append(fut.result(timeout=timeout + 5))
            except BaseException as exc:
                out.append(exc)
        return out


def detect_launcher(
    nodes: Sequence[RankNode],
    *,
    container: Containers = None,
    python: str = "python3",
    timeout: float = STEP_TIMEOUT,
) -> LaunchPlan:
    """Probe every node once (concurrently) and choose the launcher (see the module doc).
    ``container``: one name on every node, or each node's (by node name)."""

    def probe(n: RankNode) -> CommandResult:
        cmd = probe_command(python=python, container=container_on(container, n.name))
        return n.run(cmd, timeout=timeout)

    results = each_node(nodes, probe, timeout)
    facts = [_facts(r) for r in results]
    notes = []
    for node, f in zip(nodes, facts, strict=True):
        if "error" in f:
            notes.append(f"{node.name}: probe failed: {f['error']}")
            continue
        found = [
            f"all_reduce_perf={f.get('arp') or 'none'}",
            f"mpirun={f.get('mpirun') or 'none'}",
            f"host torch={f.get('torch') or 'none'}",
        ]
        if container:
            found += [
                f"container {container_on(container, node.name)}: "
                f"all_reduce_perf={f.get('c_arp') or 'none'}",
                f"mpirun={f.get('c_mpirun') or 'none'}",
                f"torch={f.get('c_torch') or 'none'} (docker exec rc={f.get('c_rc', '?')})",
            ]
        notes.append(f"{node.name}: " + ", ".join(found))
    head = facts[0] if facts else {}
    if facts and all(f.get("arp") for f in facts):
        if head.get("mpirun"):
            return LaunchPlan("nccl-tests", None, head["arp"], tuple(notes))
        notes.append(
            "all_reduce_perf found on the hosts but no mpirun on the head: nccl-tests "
            "spans nodes only through MPI (nccl-tests#121); not used"
        )
    if container and facts and all(f.get("c_arp") for f in facts):
        if head.get("c_mpirun"):
            return LaunchPlan("nccl-tests", container, head["c_arp"], tuple(notes))
        notes.append(
            f"all_reduce_perf found in container {container_names(container)} but no mpirun "
            "there: not used"
        )
    if container and facts and all(f.get("c_torch") for f in facts):
        return LaunchPlan("container", container, None, tuple(notes))
    if facts and all(f.get("torch") for f in facts):
        return LaunchPlan("python", None, None, tuple(notes))
    raise CollectiveUnavailable(
        "no all-reduce launcher works on every node: need nccl-tests' all_reduce_perf with "
        f"mpirun, or {python} with torch on the host"
        + (f" or inside container {container_names(container)}" if container else "")
        + ". Found: "
        + "; ".join(notes)
        + ". Fix: build nccl-tests with MPI=1 (NVIDIA DGX Spark playbook) or "
        "`pip install torch` on every node."
    )


def plan_launch(
    nodes: Sequence[RankNode], launcher: Launcher, container: Containers, python: str
) -> LaunchPlan:
    if launcher == "auto":
        return detect_launcher(nodes, container=container, python=python)
    if launcher == "nccl-tests":
        found = detect_launcher(nodes, container=container, python=python)
        if found.launcher != "nccl-tests":
            raise CollectiveUnavailable(
                "launcher nccl-tests asked for, but all_reduce_perf with mpirun is not on "
                "every node: " + "; ".join(found.notes)
            )
        return found
    if launcher == "container" and not container:
        raise ValueError("the container launcher needs container=NAME")
    return LaunchPlan(launcher, container if launcher == "container" else None)
