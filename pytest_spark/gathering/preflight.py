"""Preflight facts of the cluster: one probe round trip per node (cached for the session),
a clock reading per node, the head's SSH attempts to its workers, the serving containers'
environment. The checks themselves are pure (:mod:`pytest_spark.checks.preflight`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.facts.alike import alike_probe_command
from pytest_spark.facts.links import joint_probe
from pytest_spark.facts.memory import memory_probe_command
from pytest_spark.facts.preflight import (
    ClockSample,
    NodePreflight,
    SshAttempt,
    clock_command,
    container_env_command,
    parse_container_env,
    parse_preflight_probe,
    parse_ssh_probe,
    preflight_probe_command,
    ssh_probe_command,
)
from pytest_spark.gathering.links import fabric_ifs, node_link_facts
from pytest_spark.parsers.links import ParseError
from pytest_spark.parsers.serveargs import parse_serve_args
from pytest_spark.settings.resolve import Settings

T = TypeVar("T")

CLOCK_SAMPLES = 3


@dataclass(frozen=True)
class ModelDir:
    """Where the model lives on the nodes: ``path`` and where that came from, or
    ``reason`` why it is not known. ``must_exist_somewhere``: derived from the serve
    args, so it counts only when some node has it (else it is a container path)."""

    path: str | None
    source: str | None = None
    reason: str | None = None
    must_exist_somewhere: bool = False


def model_dir(settings: Settings) -> ModelDir:
    if settings.model_dir:
        return ModelDir(settings.model_dir, f"from {settings.source('model_dir')}")
    if settings.serve_args:
        model = parse_serve_args(settings.serve_args).model
        if model and model.startswith("/"):
            return ModelDir(model, "the serve args' model path", must_exist_somewhere=True)
        return ModelDir(
            None,
            reason=(
                f"the serve args name the model {model!r}, not a host path: set "
                "--spark-model-dir to the model directory on the nodes"
            ),
        )
    return ModelDir(
        None,
        reason="no --spark-model-dir and no --spark-serve-args: the model "
        "directory on the nodes is not known",
    )


def host_probe_commands(settings: Settings) -> dict[str, str]:
    """The host-facts probes that share a node's one round trip, by cache key: the
    preflight probe and the nodes-alike probe run side by side in one ``sh -c``
    (:func:`~pytest_spark.facts.links.joint_probe`), so a node costs one SSH round trip
    for its host facts whichever check asks first. A probe of host facts joins by being
    listed here: the preflight, nodes-alike and memory probes."""
    where = model_dir(settings).path
    return {
        "preflight": preflight_probe_command(
            container=settings.container, image=settings.image, model_dir=where
        ),
        "alike": alike_probe_command(container=settings.container, image=settings.image),
        "memory": memory_probe_command(),
    }


def node_preflight(cluster: Cluster, node: Node) -> NodePreflight:
    where = model_dir(cluster.settings).path
    command = host_probe_commands(cluster.settings)["preflight"]
    return cached_probe(
        cluster, node, command, lambda out: parse_preflight_probe(out, where), key="preflight"
    )


def host_round_trip(cluster: Cluster, node: Node) -> CommandResult:
    """The node's host-facts probes (:func:`host_probe_commands`) in one round trip, run
    once per session; every probe's parser reads its own sections of the output."""
    commands = list(host_probe_commands(cluster.settings).values())
    return cluster.cached(
        ("host-probe", node.name), lambda: node.run(joint_probe(commands), timeout=120)
    )


def cached_probe(
    cluster: Cluster,
    node: Node,
    command: str,
    parse: Callable[[str], T],
    *,
    key: str,
    what: str | None = None,
) -> T:
    """One probe of a node, parsed and cached for the session under
    ``(f"{key}-facts", node)``; a command of :func:`host_probe_commands` is read from the
    node's shared round trip (:func:`host_round_trip`), any other runs alone. Output that
    does not parse fails the asking check with the command's evidence (``what``: the
    probe's name there, default ``key``)."""

    def probe() -> T:
        if command in host_probe_commands(cluster.settings).values():
            result = host_round_trip(cluster, node)
        else:
            result = node.run(command, timeout=120)
        try:
            return parse(result.stdout)
        except ParseError as exc:
            pytest.fail(
                f"{node.name}: cannot read the {what or key} probe output ({exc}):\n"
                f"{result.evidence()}",
                pytrace=False,
            )

    return cluster.cached((f"{key}-facts", node.name), probe)


def all_preflight(cluster: Cluster) -> dict[str, NodePreflight | RemoteError]:
    cluster.connect()
    if all(
        cluster.unreachable(n) is not None or ("preflight-facts", n.name) in cluster
        for n in cluster.nodes
    ):  # every test asks: once all is cached, no thread per node each time
        return {n.name: cluster.unreachable(n) or node_preflight(cluster, n) for n in cluster.nodes}
    return cluster.map(lambda node: node_preflight(cluster, node))


def clock_samples(cluster: Cluster) -> dict[str, ClockSample | RemoteError]:
    """Each node's clock against the runner's: the reading with the shortest round trip
    of a few, offset taken from the round trip's midpoint."""

    def sample(node: Node) -> ClockSample:
        best: ClockSample | None = None
        for _ in range(CLOCK_SAMPLES):
            t0 = time.time()
            result = node.run(clock_command(), timeout=15)
            t1 = time.time()
            try:
                remote = float(result.stdout.split()[0])
            except (ValueError, IndexError):
                pytest.fail(
                    f"{node.name}: `date +%s.%N` printed {result.stdout!r}:\n{result.evidence()}",
                    pytrace=False,
                )
            s = ClockSample(node.name, remote - (t0 + t1) / 2, t1 - t0)
            if best is None or s.rtt_s < best.rtt_s:
                best = s
        assert best is not None
        return best

    return cluster.cached("preflight-clock", lambda: cluster.map(sample))


def address_owners(cluster: Cluster) -> dict[str, str]:
    """Every IPv4 address a node holds (and its management address) -> node name."""
    owners: dict[str, str] = {}
    for node in cluster.nodes:
        owners.setdefault(node.address, node.name)
        if cluster.unreachable(node) is not None:
            continue
        for addrs in node_link_facts(cluster, node).ip_addrs.values():
            for a in addrs:
                owners.setdefault(str(a.ip), node.name)
    return owners


def ssh_from_head(cluster: Cluster, addresses: list[str]) -> list[SshAttempt]:
    def attempt() -> list[SshAttempt]:
        if not addresses:
            return []
        result = cluster.head.run(ssh_probe_command(addresses), timeout=30 + 15 * len(addresses))
        try:
            return parse_ssh_probe(result.stdout)
        except ParseError as exc:
            pytest.fail(
                f"{cluster.head.name}: cannot read the SSH probe output ({exc}):\n"
                f"{result.evidence()}",
                pytrace=False,
            )

    return cluster.cached(("preflight-ssh", tuple(addresses)), attempt)


def serving_env(cluster: Cluster, node: Node) -> dict[str, str] | None:
    """The serving container's environment on the node; None when there is none. The
    first call reads every node's at once."""
    container = cluster.settings.container

    def read(one: Node) -> dict[str, str] | None:
        def compute() -> dict[str, str] | None:
            result = one.run(container_env_command(container), timeout=30)
            if not result.ok:
                return None
            try:
                return parse_container_env(result.stdout)
            except ParseError as exc:
                pytest.fail(f"{one.name}: {exc}:\n{result.evidence()}", pytrace=False)

        return cluster.cached(("preflight-serving-env", one.name), compute)

    def ahead(one: Node) -> None:
        with contextlib.suppress(Exception, pytest.fail.Exception):
            read(one)  # a failure is raised again where that node's env is asked for

    if ("preflight-serving-env", node.name) not in cluster:
        cluster.cached("preflight-serving-env-wave", lambda: cluster.map(ahead))
    return read(node)


def fabric_of(cluster: Cluster, node: Node) -> tuple[list[str], list[str], dict[str, bool]]:
    """(fabric netdevs, their RDMA devices, every netdev -> has an IPv4 address)."""
    ifs = fabric_ifs(cluster)
    facts = node_link_facts(cluster, node)
    devs = [m.dev for m in facts.roce if m.netdev in ifs]
    names = set(facts.ip_links) | set(facts.ip_addrs)
    return ifs, list(dict.fromkeys(devs)), {n: bool(facts.ip_addrs.get(n)) for n in names}
