"""Fixtures of pytest-dgx-spark: the cluster, its nodes, testinfra hosts, check recording."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import testinfra.host

from pytest_spark.api import ApiEndpoint
from pytest_spark.checks.base import Finding
from pytest_spark.cluster import Cluster, Node
from pytest_spark.remote.testinfra import testinfra_host
from pytest_spark.results import NODE_PROP, finding_property
from pytest_spark.settings import Settings
from pytest_spark.state import CLUSTER_KEY, SETTINGS_KEY


class SparkCheckWarning(UserWarning):
    """A check passed with a warning (e.g. MTU 1500: works, ~5% all-reduce cost)."""


@pytest.fixture(scope="session")
def spark_settings(pytestconfig: pytest.Config) -> Settings:
    """The resolved ``--spark-*`` settings (values and where they came from)."""
    return pytestconfig.stash[SETTINGS_KEY]


@pytest.fixture(scope="session")
def spark_cluster(pytestconfig: pytest.Config, spark_settings: Settings) -> Iterator[Cluster]:
    """The cluster under test, connected (one SSH connection per node)."""
    cluster = Cluster(spark_settings)
    pytestconfig.stash[CLUSTER_KEY] = cluster
    cluster.connect()
    pytestconfig.hook.pytest_spark_cluster_ready(cluster=cluster)
    try:
        yield cluster
    finally:
        cluster.close()


def reachable(cluster: Cluster, node: Node) -> Node:
    """The node, or an error (not a failure) naming it and why it cannot be reached."""
    error = cluster.unreachable(node)
    if error is not None:
        pytest.fail(f"node unreachable: {error}", pytrace=False)
    return node


@pytest.fixture(scope="session")
def _spark_node(request: pytest.FixtureRequest, spark_cluster: Cluster) -> Node:
    return reachable(spark_cluster, spark_cluster.node(request.param))


@pytest.fixture
def spark_node(request: pytest.FixtureRequest, _spark_node: Node) -> Node:
    """Each node of the cluster in turn (ids ``spark-head``, ``spark-worker-1``...)."""
    request.node.user_properties.append((NODE_PROP, _spark_node.name))
    return _spark_node


@pytest.fixture(scope="session")
def spark_head(spark_cluster: Cluster) -> Node:
    return reachable(spark_cluster, spark_cluster.head)


@pytest.fixture(scope="session")
def spark_workers(spark_cluster: Cluster) -> list[Node]:
    return [reachable(spark_cluster, node) for node in spark_cluster.workers]


@pytest.fixture
def host(spark_node: Node) -> testinfra.host.Host:
    """testinfra's ``host`` for each node, over the suite's own SSH connection."""
    return testinfra_host(spark_node.name, spark_node)


@pytest.fixture(scope="session")
def spark_head_host(spark_head: Node) -> testinfra.host.Host:
    return testinfra_host(spark_head.name, spark_head)


class SparkCheck:
    """Records a check's finding on the report and turns it into a verdict."""

    def __init__(self, item: pytest.Item) -> None:
        self._item = item

    def record(self, finding: Finding) -> Finding:
        self._item.user_properties.append(finding_property(finding))
        return finding

    def require(self, finding: Finding) -> Finding:
        """Record, then fail on ``fail`` and warn on ``warn``."""
        self.record(finding)
        if finding.level == "fail":
            pytest.fail(finding.message, pytrace=False)
        if finding.level == "warn":
            warnings.warn(SparkCheckWarning(finding.message), stacklevel=2)
        return finding


@pytest.fixture
def spark_check(request: pytest.FixtureRequest) -> SparkCheck:
    """Record a ``Finding`` on the report (JSON results, HTML) and assert on it."""
    return SparkCheck(request.node)


@pytest.fixture(scope="session")
def spark_api(pytestconfig: pytest.Config, spark_settings: Settings) -> ApiEndpoint:
    """The served API (attach mode): base URL, model id, key; skips nothing, fails clearly."""
    from pytest_spark.api import ApiError, discover, read_api_key

    settings = spark_settings
    try:
        key = read_api_key(settings.api_key, settings.api_key_file)
        base = settings.api_url
        if base is None:
            cluster: Cluster = pytestconfig.stash.get(CLUSTER_KEY, None) or _cluster(
                pytestconfig)
            base = f"http://{cluster.head.conn.target.hostname}:{settings.port}"
        return discover(base, api_key=key, model=settings.model,
                        timeout=settings.http_timeout)
    except ApiError as exc:
        pytest.fail(str(exc), pytrace=False)


def _cluster(config: pytest.Config) -> Cluster:
    cluster = Cluster(config.stash[SETTINGS_KEY])
    config.stash[CLUSTER_KEY] = cluster
    return cluster
