"""Which nodes serve a rank, and the outcome of the launch or attach as the checks read it
(``ServingInfo``): the serve args' TP x PP x DP, as launch-cluster.sh trims its node list
(attached without serve args, the head's own ``vllm serve`` line); the rest are idle by
design."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.serveargs import parse_serve_args
from pytest_spark.settings.resolve import Settings


@dataclass(frozen=True)
class ServingInfo:
    launched: bool
    ready_s: float | None
    timeline: list[dict[str, Any]]
    facts: dict[str, str]
    mode: str | None = None  # "ray" | "no-ray" | None (not known)
    mode_source: str = ""  # how the mode was known
    nodes: tuple[str, ...] = ()  # the nodes that serve a rank (empty: every node)
    idle_nodes: tuple[str, ...] = ()  # configured, left idle by design (the launcher trims)
    idle_because: str = ""


def serving_nodes(
    cluster: Cluster, settings: Settings, info: ServingInfo | None = None
) -> list[Node]:
    """The nodes the launcher keeps: it trims its node list to TP x PP x DP (one GPU a
    node on a Spark), head first; what the launch or attach found (``info``) when known."""
    if info is not None and info.nodes:
        return [n for n in cluster.nodes if n.name in info.nodes]
    return kept_nodes(cluster, settings)[0]


def idle_by_design(
    cluster: Cluster, settings: Settings, info: ServingInfo | None, node: str
) -> str | None:
    """The skip reason of a check that needs ``node``'s serving container when the node
    serves no rank by design (the launcher trimmed it: no container there), else None."""
    kept = [n.name for n in serving_nodes(cluster, settings, info)]
    if node in kept:
        return None
    why = info.idle_because if info is not None and info.idle_because else ""
    why = why or kept_nodes(cluster, settings)[1]
    return (
        f"{node} is idle by design: it serves no rank, the cluster keeps {len(kept)} "
        f"node(s) ({', '.join(kept)}): {why}"
    )


def head_serve_line(processes: list[str]) -> str | None:
    """The head's ``vllm serve ...`` out of its container's process lines (``docker top``
    args; a launch script's ``bash /workspace/exec-script.sh`` has it in a child)."""
    for line in processes:
        if "vllm serve" in line:
            return line[line.index("vllm serve") :]
    return None


def kept_nodes(
    cluster: Cluster, settings: Settings, attached_line: str | None = None
) -> tuple[list[Node], str]:
    """(the nodes that serve a rank, why the others are idle). The serve args' TP x PP x
    DP, as launch-cluster.sh trims its node list (eugr's "Parallelism-Aware Node
    Trimming", 2026-03-31: the head and the first workers); attached without serve args,
    the head's own ``vllm serve`` line: its ``--nnodes`` (no Ray), else its TP x PP x DP."""
    nodes = list(cluster.nodes)
    line, source = settings.serve_args, "the serve args"
    if not line and attached_line:
        line, source = attached_line, "the head's vllm serve process"
    if not line:
        return nodes, ""
    try:
        args = parse_serve_args(line)
    except ValueError:  # a cut or shell-quoted process line
        return nodes, ""
    if source != "the serve args" and args.nnodes is not None:
        used = args.nnodes
        why = f"{source} has --nnodes {used}"
    elif args.parallelism_given:
        used = args.nodes_used()
        why = (
            f"{source}' {args.describe_ranks()}, one GPU a node; launch-cluster.sh prints "
            f"`Note: Command requires {used} node(s) (tp={args.tensor_parallel_size} * "
            f"pp={args.pipeline_parallel_size} * dp={args.data_parallel_size}); using "
            f"{used} of {len(nodes)} configured node(s).` and starts no container there"
        )
    else:
        return nodes, ""
    kept = nodes[: max(1, used)]
    return kept, why if len(kept) < len(nodes) else ""
