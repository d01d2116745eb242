"""The host-facts probes that share a node's one round trip, and the session cache every
probe of a node goes through.

A probe of host facts joins the round trip by one line in :func:`host_probe_commands` (its
cache key and its command); its gatherer then reads it with :func:`cached_probe`, which
takes the node's joint output (:func:`host_round_trip`, run once per session) and hands it
to the probe's own parser. Output that does not parse fails the asking check with the
command's evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from pytest_spark.access.base import CommandResult
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.alike.probe import alike_probe_command
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.fdlimit.probe import fdlimit_probe_command
from pytest_spark.infra.kernel.probe import kernel_probe_command
from pytest_spark.infra.loaded.probe import loaded_probe_command, recipe_env_names
from pytest_spark.infra.memory.probe import memory_probe_command
from pytest_spark.infra.preflight.probe import model_dir, preflight_probe_command
from pytest_spark.infra.probe import joint_probe
from pytest_spark.settings.resolve import Settings

__all__ = ["cached_probe", "host_probe_commands", "host_round_trip", "node_probe_commands"]

T = TypeVar("T")


def host_probe_commands(settings: Settings, container: str | None = None) -> dict[str, str]:
    """The host-facts probes that share a node's one round trip, by cache key: the
    preflight probe and the nodes-alike probe run side by side in one ``sh -c``
    (:func:`~pytest_spark.infra.probe.joint_probe`), so a node costs one SSH round trip
    for its host facts whichever check asks first. A probe of host facts joins by being
    listed here: the preflight, nodes-alike, memory, open-file limit, previous-boot and
    loaded (what the serving ranks mapped, their environment, the vllm tree) probes.
    ``container``: the node's serving container (``Cluster.container(node)``: a sparkrun
    job's rank container differs per node); default ``settings.container``."""
    where = model_dir(settings).path
    name = container or settings.container
    return {
        "preflight": preflight_probe_command(container=name, image=settings.image, model_dir=where),
        "alike": alike_probe_command(container=name, image=settings.image),
        "memory": memory_probe_command(),
        "fdlimit": fdlimit_probe_command(container=name),
        "kernel": kernel_probe_command(),
        "loaded": loaded_probe_command(container=name, env_names=recipe_env_names(settings)),
    }


def node_probe_commands(cluster: Cluster, node: Node) -> dict[str, str]:
    """:func:`host_probe_commands` for ``node``, with its own serving container."""
    return host_probe_commands(cluster.settings, cluster.container(node))


def host_round_trip(cluster: Cluster, node: Node) -> CommandResult:
    """The node's host-facts probes (:func:`host_probe_commands`) in one round trip, run
    once per session; every probe's parser reads its own sections of the output."""
    commands = list(node_probe_commands(cluster, node).values())
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
        if command in node_probe_commands(cluster, node).values():
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
