"""What a node's serving container loaded: one probe per node, cached for the session,
riding in the node's shared host round trip (one ``docker exec`` inside it). The checks
are pure (:mod:`pytest_spark.infra.loaded.check`).

The round trip may run before the cluster serves (``--spark-launch``: the preflight runs
first); a check that needs the ranks asks again once serving (:func:`serving_loaded`),
which probes the node alone once when the round trip saw no rank."""

from __future__ import annotations

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.infra.loaded.probe import HOST_PROBE, LoadedFacts, parse_loaded_probe
from pytest_spark.infra.roundtrip import gather_probe, probe_command


def node_loaded(cluster: Cluster, node: Node) -> LoadedFacts:
    """The node's loaded probe from its shared round trip, once per session."""
    return gather_probe(cluster, node, HOST_PROBE)


def serving_loaded(cluster: Cluster, node: Node) -> LoadedFacts:
    """The node's loaded facts once the cluster serves: the round trip's when it saw
    rank processes, else one probe of the node alone (cached)."""
    facts = node_loaded(cluster, node)
    if facts.procs:
        return facts

    def again() -> LoadedFacts:
        result = node.run(probe_command(cluster, node, HOST_PROBE), timeout=60)
        return parse_loaded_probe(result.stdout)

    return cluster.cached(("loaded-serving", node.name), again)


def rank_env(cluster: Cluster, node: Node) -> tuple[dict[str, str], int] | None:
    """The environment of the node's rank process (``/proc/PID/environ``) and its PID;
    None when no rank process could be read."""
    facts = serving_loaded(cluster, node)
    chosen = facts.ranks or facts.procs
    if not chosen:
        return None
    return dict(chosen[0].env), chosen[0].pid
