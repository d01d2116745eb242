"""Open-file limits (issue #26 part 5): can every node's serving container raise its
open-files limit to what vLLM's API server asks (65535)?

Per node: the Docker engine's ``Max open files`` (soft and hard) from ``/proc/<pid of
dockerd>/limits``, which containers inherit unless started with ``--ulimit``, with
``fs.file-max`` and ``fs.nr_open`` from /proc/sys/fs, against the profile's
``fdlimit.min_open_files`` (see pytest_spark.infra.fdlimit.check). Facts come from one
probe per node, in the node's shared host round trip.
"""

from __future__ import annotations

import pytest

from pytest_spark import (
    Cluster,
    Finding,
    Node,
    SparkCheck,
    require_once_across_nodes,
    verdict_in_session,
)
from pytest_spark.infra.fdlimit.check import check_fd_limits
from pytest_spark.infra.fdlimit.gather import node_fdlimits
from pytest_spark.infra.finding import Skip

pytestmark = pytest.mark.preflight

DOCKER_VERDICT = "test_docker_ready"


def test_dockerd_open_files_limit(
    request: pytest.FixtureRequest,
    spark_node: Node,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    """The Docker engine's hard open-files limit lets the serving container raise its own
    to vLLM's 65535; the kernel's file table is no smaller."""

    def judge(node: Node) -> Finding | Skip:
        docker = (
            f"{DOCKER_VERDICT}[{node.name}]"
            if verdict_in_session(request.session, DOCKER_VERDICT)
            else None
        )
        return check_fd_limits(
            node.name,
            node_fdlimits(spark_cluster, node),
            spark_cluster.profile.fdlimit.min_open_files,
            docker_verdict=docker,
        )

    # the same limit on several nodes (one install, one drop-in missing): one failure
    require_once_across_nodes(request, spark_check, spark_cluster, spark_node, judge)
