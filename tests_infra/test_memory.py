"""GB10 memory headroom (issue #15 §2): before a 15-minute load, does every node have the
memory that ``--gpu-memory-utilization`` will claim, plus the OS's share?

Per node: MemAvailable, MemTotal and swap from /proc/meminfo (nvidia-smi's memory is
``[N/A]`` on GB10's unified memory) against the claim of the serve args (vLLM's default
when they have none) and the profile's ``memory.os_headroom_gib``; while the serving engine
runs, against the headroom alone (its claim is taken; see pytest_spark.infra.memory.check). A
short node names the largest processes outside the serving container. Facts come from one
memory probe round trip per node (cached) and the preflight probe's container list. Without
--spark-serve-args, attached, the claim is read from a running rank's ``vllm serve`` (the
launch gives every rank the same): a worker whose container stopped is judged on the claim
it made, and is the readiness check's one failure, not a second one here.
"""

from __future__ import annotations

import pytest

from pytest_spark import Cluster, Node, SparkCheck, verdict_in_session
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.memory.check import check_container_limit, check_memory_headroom
from pytest_spark.infra.memory.gather import (
    container_memory,
    engine_state,
    node_memory,
    serving_claim,
)
from pytest_spark.infra.memory.parse import ContainerMemory
from pytest_spark.infra.preflight.docker_check import check_gpu_holders
from pytest_spark.infra.preflight.gather import all_preflight
from pytest_spark.infra.preflight.probe import NodePreflight
from pytest_spark.readiness.ranks import ServingInfo, serving_nodes

pytestmark = pytest.mark.preflight

GPU_HOLDERS = "test_gpu_not_held_by_others"


def _gpu_held(request: pytest.FixtureRequest, cluster: Cluster, node: Node) -> str | None:
    """The GPU-holder check's failure on this node, when that check runs in the session:
    a stale engine holds memory too, and that is its one failure."""
    if not verdict_in_session(request.session, GPU_HOLDERS):
        return None
    facts = all_preflight(cluster).get(node.name)
    if not isinstance(facts, NodePreflight):
        return None
    found = check_gpu_holders(
        node.name, facts.docker, facts.gpu, cluster.container(node), facts.now
    )
    if isinstance(found, Skip) or found.ok:
        return None
    return f"{GPU_HOLDERS}[{node.name}] has the evidence"


def test_memory_headroom(
    request: pytest.FixtureRequest,
    spark_node: Node,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    """MemAvailable covers the engine's claim (--gpu-memory-utilization x MemTotal) plus
    the OS headroom; nothing outside the serving container holds what the engine needs."""
    facts = node_memory(spark_cluster, spark_node)
    profile = spark_cluster.profile.memory
    # the serve args given, else a running rank's (a dead rank's node is judged on them)
    claim = serving_claim(spark_cluster)
    engine = engine_state(spark_cluster, spark_node, facts)
    spark_check.attach("claim", claim.describe())
    spark_check.attach("engine_running", str(engine.running))
    result = check_memory_headroom(
        spark_node.name,
        facts,
        claim,
        profile.os_headroom_gib,
        engine_running=engine.running,
        own_pids=engine.pids,
        max_swap_used_gib=profile.max_swap_used_gib,
        top_holders=profile.top_holders,
        gpu_held=_gpu_held(request, spark_cluster, spark_node),
    )
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)


def test_serving_fits_container_memory_limit(
    spark_serving: ServingInfo, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """Each serving container's cgroup memory limit (launch-cluster.sh --non-privileged:
    --memory 110g by default; memory.max inside, else docker inspect) holds what its rank
    asks for, read from its running `vllm serve` (--gpu-memory-utilization-gb N: N GiB +
    0.5 GiB; a fraction: of MemTotal): the limit is the OOM boundary. One verdict for the
    cluster, naming each node that is short."""
    nodes = serving_nodes(spark_cluster, spark_cluster.settings, spark_serving)
    reachable = [n for n in nodes if spark_cluster.unreachable(n) is None]
    found = spark_cluster.map(lambda node: container_memory(spark_cluster, node), reachable)
    containers = [found[n.name] for n in reachable if isinstance(found[n.name], ContainerMemory)]
    spark_check.attach(
        "containers",
        "\n".join(f"{c.node}: limit {c.limit} ({c.source}); {c.serve_line}" for c in containers),
    )
    result = check_container_limit(containers)
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)
