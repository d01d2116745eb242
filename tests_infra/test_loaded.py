"""What the serving ranks loaded (issue #28 part 1), read from the running processes, not
from the image:

- the NCCL library each rank process mapped (``/proc/PID/maps``) and its ELF Build ID:
  one per process, one build on every rank of every node;
- the installed vllm package tree's hash, the same on every node.

The ranks' environment (``/proc/PID/environ``) is test_preflight's
test_serving_env_matches_fabric. Facts come from one ``docker exec`` per node inside the
node's shared host round trip. When the serving image already differs between nodes
(tests_infra/test_alike.py's test_serving_image_alike fails), what it loads differs by
that one cause: these checks skip citing it.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark import Cluster, Finding, Node, RemoteError, SparkCheck, verdict_in_session
from pytest_spark.infra.alike.check import check_image_alike
from pytest_spark.infra.alike.gather import all_alike
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.loaded.check import check_nccl_loaded, check_vllm_tree
from pytest_spark.infra.loaded.gather import serving_loaded
from pytest_spark.infra.loaded.probe import LoadedFacts
from pytest_spark.readiness.ranks import ServingInfo

pytestmark = pytest.mark.preflight

IMAGE_VERDICT = "test_serving_image_alike"


def _images_differ(request: pytest.FixtureRequest, cluster: Cluster) -> str | None:
    """The skip reason when the nodes' serving images differ (one cause, its own check)."""
    if not verdict_in_session(request.session, IMAGE_VERDICT):
        return None
    try:
        facts = {n: f for n, f in all_alike(cluster).items() if not isinstance(f, RemoteError)}
        found = check_image_alike(cluster.head.name, facts, cluster.container(cluster.head))
    except (RemoteError, pytest.fail.Exception):  # the image check reports its own trouble
        return None
    if isinstance(found, Finding) and not found.ok:
        return f"the serving images differ between nodes ({IMAGE_VERDICT} has the evidence)"
    return None


def _head_facts(cluster: Cluster, node: Node) -> LoadedFacts | None:
    if node.name == cluster.head.name or cluster.unreachable(cluster.head) is not None:
        return None
    return serving_loaded(cluster, cluster.head)


def _require(spark_check: SparkCheck, result: Finding | Skip) -> None:
    if isinstance(result, Skip):
        pytest.skip(result.reason)
    spark_check.require(result)


def _judge(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    node: Node,
    spark_check: SparkCheck,
    check: Any,
) -> None:
    """The node's loaded facts against the head's; a difference skips citing the image
    check when the images already differ (that is its one failure)."""
    facts = serving_loaded(cluster, node)
    result = check(node.name, facts, cluster.head.name, _head_facts(cluster, node))
    if isinstance(result, Finding) and not result.ok:
        cited = _images_differ(request, cluster)
        if cited:
            pytest.skip(f"{node.name}: {cited}")
    _require(spark_check, result)


def test_nccl_loaded_same_build(
    request: pytest.FixtureRequest,
    spark_serving: ServingInfo,
    spark_cluster: Cluster,
    spark_node: Node,
    spark_check: SparkCheck,
) -> None:
    """Every rank process of the node mapped one libnccl, of the head's ranks' Build ID."""
    _judge(request, spark_cluster, spark_node, spark_check, check_nccl_loaded)


def test_vllm_tree_identical(
    request: pytest.FixtureRequest,
    spark_serving: ServingInfo,
    spark_cluster: Cluster,
    spark_node: Node,
    spark_check: SparkCheck,
) -> None:
    """The node's installed vllm package tree hashes as the head's."""
    _judge(request, spark_cluster, spark_node, spark_check, check_vllm_tree)
