"""The probes every infra topic declares (:class:`~pytest_spark.infra.hostprobe.HostProbe`),
the node's one host round trip that carries the shared ones, and the session cache every
declared probe of a node goes through.

A topic declares its probes in its own ``probe`` module; :func:`host_probes` collects them
from every topic folder under ``pytest_spark/infra`` (no topic is named here, so adding
one touches no shared file). A gatherer reads a probe with :func:`gather_probe`: a shared
probe's facts come from the node's joint output (:func:`host_round_trip`, run once per
session), any other probe runs alone; the probe's own parser reads the output. Output
that does not parse fails the asking check with the command's evidence.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Iterable
from types import ModuleType
from typing import Any, TypeVar

import pytest

from pytest_spark.access.base import CommandResult
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.probe import joint_probe
from pytest_spark.settings.resolve import Settings

__all__ = [
    "declared_probes",
    "gather_probe",
    "host_probe_commands",
    "host_probes",
    "host_round_trip",
    "probe_command",
    "shared_probes",
]

T = TypeVar("T")
INFRA = __name__.rpartition(".")[0]  # pytest_spark.infra: one folder per topic


@functools.cache
def host_probes() -> tuple[HostProbe[Any], ...]:
    """Every probe the infra topics declare (:func:`declared_probes` of each topic's
    ``probe`` module, ``pytest_spark/infra/<topic>/probe.py``, topics in name order),
    collected once."""
    modules = []
    topics = pkgutil.iter_modules(importlib.import_module(INFRA).__path__)
    for info in sorted(topics, key=lambda m: m.name):
        name = f"{INFRA}.{info.name}.probe"
        if info.ispkg and importlib.util.find_spec(name) is not None:
            modules.append(importlib.import_module(name))
    return declared_probes(modules)


def declared_probes(modules: Iterable[ModuleType]) -> tuple[HostProbe[Any], ...]:
    """The :class:`HostProbe` values at module level of ``modules``, in their order, each
    module's in the order it declares them. Two probes with one key are an error (their
    cached facts would collide)."""
    found = [v for m in modules for v in vars(m).values() if isinstance(v, HostProbe)]
    keys = [p.key for p in found]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"host probes declared twice under one key: {', '.join(twice)}")
    return tuple(found)


def shared_probes() -> tuple[HostProbe[Any], ...]:
    """The declared probes that ride a node's one host round trip (``shared``)."""
    return tuple(p for p in host_probes() if p.shared)


def host_probe_commands(settings: Settings, container: str | None = None) -> dict[str, str]:
    """The shared probes' commands by key, as :func:`host_round_trip` runs them side by
    side in one ``sh -c`` (:func:`~pytest_spark.infra.probe.joint_probe`), so a node costs
    one SSH round trip for its host facts whichever check asks first. ``container``: the
    node's serving container (``Cluster.container(node)``: a sparkrun job's rank container
    differs per node); default ``settings.container``."""
    name = container or settings.container
    return {p.key: p.command(settings, name) for p in shared_probes()}


def probe_command(cluster: Cluster, node: Node, probe: HostProbe[Any]) -> str:
    """``probe``'s command for ``node`` (its own serving container)."""
    return probe.command(cluster.settings, cluster.container(node))


def host_round_trip(cluster: Cluster, node: Node) -> CommandResult:
    """The node's shared probes (:func:`shared_probes`) in one round trip, run once per
    session; every probe's parser reads its own sections of the output."""
    commands = [probe_command(cluster, node, p) for p in shared_probes()]
    return cluster.cached(
        ("host-probe", node.name), lambda: node.run(joint_probe(commands), timeout=120)
    )


def gather_probe(cluster: Cluster, node: Node, probe: HostProbe[T]) -> T:
    """``probe``'s facts of a node, parsed and cached for the session under
    ``(f"{probe.key}-facts", node)``: a shared probe (one of :func:`shared_probes`, by
    identity) is read from the node's host round trip (:func:`host_round_trip`), any other
    runs alone. Output that does not parse fails the asking check with the command's
    evidence."""

    def run() -> T:
        if probe in shared_probes():
            result = host_round_trip(cluster, node)
        else:
            result = node.run(probe_command(cluster, node, probe), timeout=probe.timeout_s)
        try:
            return probe.parse(result.stdout, cluster.settings)
        except ParseError as exc:
            pytest.fail(
                f"{node.name}: cannot read the {probe.name} probe output ({exc}):\n"
                f"{result.evidence()}",
                pytrace=False,
            )

    return cluster.cached((f"{probe.key}-facts", node.name), run)
