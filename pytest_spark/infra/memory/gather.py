"""Memory facts of the cluster: one memory probe round trip per node (cached for the
session), the engine's claim from the serve args, and whether the serving engine already
runs on a node (its container, from the preflight probe). The check is pure
(:mod:`pytest_spark.infra.memory.check`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.memory.check import Claim
from pytest_spark.infra.memory.parse import ContainerMemory
from pytest_spark.infra.memory.probe import (
    HOST_PROBE,
    NodeMemory,
    container_limit_probe,
    parse_container_limit,
)
from pytest_spark.infra.preflight.gather import all_preflight
from pytest_spark.infra.preflight.probe import NodePreflight
from pytest_spark.infra.roundtrip import gather_probe
from pytest_spark.infra.serveargs import parse_serve_args
from pytest_spark.settings.resolve import Settings


def node_memory(cluster: Cluster, node: Node) -> NodeMemory:
    """The node's memory probe, once per session (a RemoteError raises: the caller's node
    is reachable, or test_node_reachable has it)."""
    return gather_probe(cluster, node, HOST_PROBE)


def engine_claim(settings: Settings) -> Claim:
    """The claim the launch will make: the serve args' --gpu-memory-utilization, else
    vLLM's default; their --kv-cache-memory-bytes, which sizes the KV cache instead."""
    args = settings.serve_args
    parsed = parse_serve_args(args) if args else None
    return Claim.from_serve_args(
        parsed.gpu_memory_utilization if parsed else None,
        bool(args),
        parsed.kv_cache_memory_bytes if parsed else None,
        parsed.gpu_memory_utilization_gb if parsed else None,
    )


def serving_claim(cluster: Cluster) -> Claim:
    """The claim a rank makes on a node: the serve args given (--spark-serve-args), else
    those a running rank was started with (its ``vllm serve`` process; attached, the
    launch gives every rank the same serve args), else vLLM's default (:func:`engine_claim`).
    A node whose rank died (its container stopped or gone while another rank runs) is
    judged on the claim its rank made, not on vLLM's default: without serve args given,
    the default (0.92) failed a node whose served claim fits, a second failure beside the
    readiness check's for one dead worker. Read once per session."""
    settings = cluster.settings
    if settings.serve_args or settings.launch:
        return engine_claim(settings)
    return cluster.cached(("memory", "serving-claim"), lambda: _running_rank_claim(cluster))


def _running_rank_claim(cluster: Cluster) -> Claim:
    facts = all_preflight(cluster)
    for node in cluster.nodes:
        found = facts.get(node.name)
        serving = found.docker.serving if isinstance(found, NodePreflight) else None
        if serving is None or not serving.running:
            continue
        try:
            line = container_memory(cluster, node).serve_line
            args = parse_serve_args(line) if line else None
        except (RemoteError, ValueError):
            continue
        if args is None:
            continue
        claim = Claim.from_serve_args(
            args.gpu_memory_utilization,
            True,
            args.kv_cache_memory_bytes,
            args.gpu_memory_utilization_gb,
        )
        return replace(claim, source=f"{claim.source}, read from {node.name}'s vllm serve")
    return engine_claim(settings=cluster.settings)


@dataclass(frozen=True)
class EngineState:
    """Whether the serving container runs on the node, and its processes (host PIDs)."""

    running: bool
    pids: frozenset[int]
    container: str


def engine_state(cluster: Cluster, node: Node, memory: NodeMemory) -> EngineState:
    """Whether an engine already holds its claim on the node: the serving container runs
    (from the preflight probe, cached), or a GPU compute app runs (nvidia-smi lists it
    even where its memory is ``[N/A]``: an engine run another way, e.g. a compose
    service of another name). A compute app outside the serving container is also
    test_gpu_not_held_by_others' failure, which the check then cites."""
    facts = all_preflight(cluster).get(node.name)
    container = cluster.container(node)
    serving = facts.docker.serving if isinstance(facts, NodePreflight) else None
    pids = frozenset(serving.pids) if serving is not None and serving.running else frozenset()
    running = (serving is not None and serving.running) or bool(memory.apps)
    return EngineState(running, pids, container)


def container_memory(cluster: Cluster, node: Node) -> ContainerMemory:
    """The node's serving container's memory limit and its rank's need, in one round trip
    (after the launch: the container and its ``vllm serve`` child exist then)."""
    container = cluster.container(node)
    result = node.run(container_limit_probe(container), timeout=30)
    parsed = parse_container_limit(node.name, result.stdout)
    if parsed.serve_line is None:
        return parsed
    try:
        args = parse_serve_args(parsed.serve_line)
    except ValueError:
        return parsed
    claim = Claim.from_serve_args(
        args.gpu_memory_utilization,
        True,
        args.kv_cache_memory_bytes,
        args.gpu_memory_utilization_gb,
    )
    if claim.gib is None:  # a fraction of MemTotal: the node's memory probe has it
        info = node_memory(cluster, node).meminfo
        if info is None:
            return parsed
        need, how = claim.startup_bytes(info.total), f"{claim.fraction:g} x MemTotal"
    else:
        need, how = claim.startup_bytes(0), f"--gpu-memory-utilization-gb {claim.gib:g} + 0.5 GiB"
    return replace(parsed, need=need, need_source=f"{how}, read from its vllm serve process")
