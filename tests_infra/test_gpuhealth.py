"""GPU health before a rollout (issue #15 §3), per node: temperature, clocks event reasons
(with the clocks and power draw beside them), persistence mode, and Xid / NVRM errors in
the kernel log since boot. The facts come with the GPU health probe (in the node's one
host round trip, beside the preflight probe; cached); a field the GPU reports as N/A
warns, never fails.

A GPU that nvidia-smi cannot see is ``test_gpu_visible``'s: the checks that read
nvidia-smi skip citing it (the kernel log check still runs: it says why).
"""

from __future__ import annotations

import pytest

from pytest_spark import (
    Cluster,
    Finding,
    Node,
    RemoteError,
    SparkCheck,
    require_once_across_nodes,
    verdict_in_session,
)
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.gpuhealth.check import (
    TEMPERATURE_VERDICT,
    check_gpu_kernel_log,
    check_gpu_persistence,
    check_gpu_temperature,
    check_gpu_throttle,
    gpu_lost_in_kernel_log,
)
from pytest_spark.infra.gpuhealth.gather import node_gpu_health
from pytest_spark.infra.gpuhealth.probe import GpuHealth
from pytest_spark.infra.gpuload.check import LOAD_VERDICT
from pytest_spark.infra.kernellog import KERNEL_VERDICT
from pytest_spark.infra.preflight.gather import all_preflight
from pytest_spark.infra.preflight.probe import NodePreflight

pytestmark = pytest.mark.preflight


def _facts(cluster: Cluster, node: Node) -> NodePreflight:
    facts = all_preflight(cluster)[node.name]
    if isinstance(facts, RemoteError):
        pytest.fail(f"node unreachable: {facts}", pytrace=False)
    return facts


@pytest.fixture
def gpu_health(
    request: pytest.FixtureRequest, spark_cluster: Cluster, spark_node: Node
) -> GpuHealth:
    """This node's GPU readings; skipped when nvidia-smi sees no GPU there, citing the
    check that owns the cause: test_gpu_kernel_errors when the kernel log says the GPU
    fell off the bus, else test_gpu_visible."""
    facts = _facts(spark_cluster, spark_node)
    health = node_gpu_health(spark_cluster, spark_node)
    if not facts.gpu.gpus:
        why = facts.gpu.error or "nvidia-smi -L lists no GPU"
        owner = f"test_gpu_visible[{spark_node.name}]"
        kernel = f"{KERNEL_VERDICT}[{spark_node.name}]"
        lost = gpu_lost_in_kernel_log(health.kernel)
        if lost is not None and verdict_in_session(request.session, kernel):
            owner, why = kernel, "it fell off the bus"
        pytest.skip(
            f"{spark_node.name}: no GPU readings because nvidia-smi sees no GPU ({why}; "
            f"{owner} has the evidence)"
        )
    return health


def test_gpu_temperature(
    spark_node: Node, gpu_health: GpuHealth, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    section = spark_cluster.profile.gpu_health
    spark_check.require(check_gpu_temperature(spark_node.name, gpu_health, section))


def test_gpu_clocks_not_throttled(
    request: pytest.FixtureRequest,
    spark_node: Node,
    gpu_health: GpuHealth,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    """No slowdown reason active (the profile says which fail and which warn); the SM
    clock, its maximum and the power draw are in the message."""
    section = spark_cluster.profile.gpu_health
    owner = f"{TEMPERATURE_VERDICT}[{spark_node.name}]"
    hot = (
        verdict_in_session(request.session, owner)
        and check_gpu_temperature(spark_node.name, gpu_health, section).level == "fail"
    )
    # In launch mode the pre-serving load reads the clock under a load of its own.
    load_owner = f"{LOAD_VERDICT}[{spark_node.name}]"
    owner_runs = spark_cluster.settings.launch and verdict_in_session(request.session, load_owner)
    result = check_gpu_throttle(
        spark_node.name,
        gpu_health,
        section,
        temperature_failed=hot,
        low_clock_owner=load_owner if owner_runs else None,
    )
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)


def test_gpu_persistence_mode(
    request: pytest.FixtureRequest,
    spark_node: Node,
    gpu_health: GpuHealth,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    """Persistence mode on; off on several nodes (one setup left it off) is one failure,
    on the first of them, naming the others (verdict.require_once_across_nodes)."""
    section = spark_cluster.profile.gpu_health

    def judge(node: Node) -> Finding | Skip:
        facts = _facts(spark_cluster, node)
        if not facts.gpu.gpus:  # its gpu_health fixture skips
            return Skip(f"{node.name}: nvidia-smi sees no GPU")
        return check_gpu_persistence(node.name, node_gpu_health(spark_cluster, node), section)

    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)


def test_gpu_kernel_errors(
    spark_node: Node, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """Xid and NVRM errors in the kernel log since boot (journalctl -k -b, else dmesg)."""
    _facts(spark_cluster, spark_node)  # an unreachable node fails as the others do
    health = node_gpu_health(spark_cluster, spark_node)
    section = spark_cluster.profile.gpu_health
    finding = check_gpu_kernel_log(spark_node.name, health.kernel, section)
    if health.kernel.source:
        spark_check.attach("kernel_log_source", health.kernel.source)
    spark_check.require(finding)
