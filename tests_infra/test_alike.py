"""Nodes alike (issue #15 §1): every node runs what the head runs, before a 15-minute load.

Per cluster, each check compares every node with the head and names the odd node: the
kernel, OS release, NVIDIA driver and CUDA version, DGX OS release and ConnectX-7 firmware
(and, apart, whether any of them is on the profile's known-bad list); the serving image
(in attach mode, the image the running containers were started from) (its identity, and
what differs inside it: vLLM, torch, Python, the NCCL version and library hash, where the
same version of a different build hangs the ranks); the clocks' NTP-synchronised state
(beside test_preflight's measured skew). The model directory is test_preflight's
test_model_dir_identical. Facts come from one probe round trip per node (cached); the
image's contents from one ``docker run --rm`` of it on each node inside that round trip.
"""

from __future__ import annotations

import pytest

from pytest_spark import Cluster, Finding, RemoteError, SparkCheck
from pytest_spark.infra.alike.check import (
    check_host_alike,
    check_image_alike,
    check_time_sync,
    nccl_versions,
)
from pytest_spark.infra.alike.gather import all_alike
from pytest_spark.infra.alike.knownbad_check import check_known_bad, denied_nodes
from pytest_spark.infra.alike.probe import NodeAlike
from pytest_spark.infra.finding import Skip
from pytest_spark.readiness.reachability import require_reachable

pytestmark = pytest.mark.preflight


def require(spark_check: SparkCheck, result: Finding | Skip) -> None:
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)


def alike_facts(config: pytest.Config, cluster: Cluster) -> dict[str, NodeAlike]:
    """Every node's facts; an unreachable node skips citing test_node_reachable."""
    require_reachable(config, cluster)
    out: dict[str, NodeAlike] = {}
    for name, facts in all_alike(cluster).items():
        if isinstance(facts, RemoteError):
            pytest.fail(f"node unreachable: {facts}", pytrace=False)
        out[name] = facts
    return out


def test_host_software_alike(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """Kernel release (uname -r), OS release (/etc/os-release), NVIDIA driver and CUDA
    version (nvidia-smi's header), DGX OS release (/etc/dgx-release) and ConnectX-7
    firmware (ethtool -i) the same on every node as on the head. A value on the profile's
    known-bad list is test_no_known_bad_versions' failure and left out here."""
    facts = alike_facts(pytestconfig, spark_cluster)
    owned = denied_nodes(facts, spark_cluster.profile.known_bad)
    spark_check.require(check_host_alike(spark_cluster.head.name, facts, owned))


def test_no_known_bad_versions(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """No node on a driver, kernel, DGX OS, ConnectX-7 firmware or NCCL build the profile's
    [known_bad] deny list names (each entry with its public source), unless allow-listed."""
    facts = alike_facts(pytestconfig, spark_cluster)
    spark_check.require(check_known_bad(facts, spark_cluster.profile.known_bad))


def test_serving_image_alike(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """The serving image the same on every node; a difference is told by what differs
    inside it (vLLM, torch, Python, NCCL version and libnccl sha256)."""
    facts = alike_facts(pytestconfig, spark_cluster)
    versions = nccl_versions(facts)
    if versions:  # the report's environment: the NCCL version the image loads, per node
        spark_check.attach("nccl_version", versions)
    require(
        spark_check,
        check_image_alike(
            spark_cluster.head.name, facts, spark_cluster.container(spark_cluster.head)
        ),
    )


def test_clock_ntp_synchronized(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_check: SparkCheck
) -> None:
    """Every node's clock NTP-synchronised (timedatectl show, else chronyc tracking)."""
    facts = alike_facts(pytestconfig, spark_cluster)
    require(spark_check, check_time_sync(facts))
