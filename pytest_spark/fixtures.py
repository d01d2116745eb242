"""Fixtures of pytest-dgx-spark: the settings, the cluster, its nodes, testinfra hosts,
check recording, and the serving cluster and its API (or why not: ``readiness.serving``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import testinfra.host

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.layout import ServingLayout
from pytest_spark.access.testinfra import testinfra_host
from pytest_spark.infra.nccl.gid_check import GID_VERDICT
from pytest_spark.infra.servecmd import ServerCommand
from pytest_spark.readiness.ranks import ServingInfo
from pytest_spark.readiness.reachability import require_reachable
from pytest_spark.readiness.serving import (
    ApiState,
    ServingState,
    down_port_cause,
    no_rdma_serving_cause,
    not_serving,
    route_to_api,
    server_log_hint,
    unreachable_for_serving,
)
from pytest_spark.report.live import notice_writer, progress_done, progress_writer
from pytest_spark.report.results import NODE_PROP
from pytest_spark.settings.resolve import Settings
from pytest_spark.state import CLUSTER_KEY, RUN_DIR_KEY, SETTINGS_KEY
from pytest_spark.verdict import SparkCheck, verdict_in_session


@pytest.fixture(scope="session")
def spark_settings(pytestconfig: pytest.Config) -> Settings:
    """The resolved ``--spark-*`` settings (values and where they came from)."""
    return pytestconfig.stash[SETTINGS_KEY]


@pytest.fixture(scope="session")
def spark_cluster(pytestconfig: pytest.Config, spark_settings: Settings) -> Iterator[Cluster]:
    """The cluster under test, connected (one SSH connection per node); its serving layout
    is the one the session found (the controller's, handed to xdist workers)."""
    cluster = pytestconfig.stash.get(CLUSTER_KEY, None) or _cluster(pytestconfig)
    cluster.connect()
    pytestconfig.hook.pytest_spark_cluster_ready(cluster=cluster)
    try:
        yield cluster
    finally:
        cluster.close()


def reachable(config: pytest.Config, cluster: Cluster, node: Node) -> Node:
    """The node; when it cannot be reached, a skip citing ``test_node_reachable`` (which
    fails with the evidence), or a failure when that check is not in the session."""
    require_reachable(config, cluster, [node])
    return node


@pytest.fixture(scope="session")
def _spark_node(request: pytest.FixtureRequest, spark_cluster: Cluster) -> Node:
    return spark_cluster.node(request.param)


@pytest.fixture
def spark_node_unchecked(request: pytest.FixtureRequest, _spark_node: Node) -> Node:
    """Each node in turn, reachable or not (the reachability check itself uses it)."""
    request.node.user_properties.append((NODE_PROP, _spark_node.name))
    return _spark_node


@pytest.fixture
def spark_node(
    pytestconfig: pytest.Config, spark_cluster: Cluster, spark_node_unchecked: Node
) -> Node:
    """Each node of the cluster in turn (ids ``spark-head``, ``spark-worker-1``...); a
    check on an unreachable node is skipped citing ``test_node_reachable``."""
    return reachable(pytestconfig, spark_cluster, spark_node_unchecked)


@pytest.fixture(scope="session")
def spark_head(pytestconfig: pytest.Config, spark_cluster: Cluster) -> Node:
    return reachable(pytestconfig, spark_cluster, spark_cluster.head)


@pytest.fixture(scope="session")
def spark_workers(pytestconfig: pytest.Config, spark_cluster: Cluster) -> list[Node]:
    return [reachable(pytestconfig, spark_cluster, node) for node in spark_cluster.workers]


@pytest.fixture
def host(spark_node: Node) -> testinfra.host.Host:
    """testinfra's ``host`` for each node, over the suite's own SSH connection."""
    return testinfra_host(spark_node.name, spark_node)


@pytest.fixture
def spark_check(request: pytest.FixtureRequest) -> SparkCheck:
    """Record a ``Finding`` on the report (JSON results, HTML) and assert on it."""
    return SparkCheck(request.node)


@pytest.fixture(scope="session")
def spark_serving_state(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config, spark_settings: Settings
) -> ServingState:
    """Launch (--spark-launch) or attach, once; never raises. The readiness check
    ``test_cluster_serving`` reports a problem with its evidence; checks that need the
    server skip pointing at it, so one dead worker is one failure, not fifty."""
    from pytest_spark.launchers.base import NotServing
    from pytest_spark.readiness.launch import ensure_serving

    cluster = pytestconfig.stash.get(CLUSTER_KEY, None) or _cluster(pytestconfig)
    cluster.connect()
    cited = unreachable_for_serving(pytestconfig, cluster, spark_settings)
    if cited is not None:
        return ServingState(None, cited, cited)
    try:
        info = ensure_serving(
            cluster,
            spark_settings,
            pytestconfig.stash[RUN_DIR_KEY],
            progress=progress_writer(pytestconfig),
            notify=notice_writer(pytestconfig),
        )
    except NotServing as exc:
        problem = str(exc)
        # a root cause another check reports, only while that check runs in this session
        cause = None
        if verdict_in_session(request.session, "test_link_up"):
            cause = down_port_cause(cluster, problem)
        if cause is None and verdict_in_session(request.session, GID_VERDICT):
            cause = no_rdma_serving_cause(cluster, problem)
        return ServingState(None, problem, cause)
    finally:
        progress_done(pytestconfig)
    return ServingState(info, None)


@pytest.fixture(scope="session")
def spark_serving(pytestconfig: pytest.Config, spark_serving_state: ServingState) -> ServingInfo:
    """The serving cluster, ready: launched with --spark-launch, else attached to. Waits
    with live progress, fails fast with every node's log tail, never hangs. A test that
    uses it is skipped, naming the root cause, when the cluster is not serving."""
    if spark_serving_state.info is None:
        state = spark_serving_state
        not_serving(pytestconfig, state.problem or "not serving", state.cited)
    return spark_serving_state.info


@pytest.fixture(scope="session")
def spark_api_state(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config, spark_settings: Settings
) -> Iterator[ApiState]:
    """The served API once ready (base URL direct or through an SSH tunnel via the head,
    model id, key), or why it cannot be used; never raises. With --spark-api-url alone,
    that server directly."""
    from pytest_spark.access.api import ApiError, discover, engine_failing, read_api_key

    settings = spark_settings
    tunnel = None
    try:
        key = read_api_key(settings.api_key, settings.api_key_file)
        base = settings.api_url
        if base is None:
            serving: ServingState = request.getfixturevalue("spark_serving_state")
            if serving.problem is not None:
                yield ApiState(None, serving.problem, serving.cited)
                return
            cluster = pytestconfig.stash[CLUSTER_KEY]
            base, tunnel = route_to_api(cluster, settings.port)
        endpoint = discover(base, api_key=key, model=settings.model, timeout=settings.http_timeout)
        layout = _layout_if_known(pytestconfig)
        known = pytestconfig.stash.get(CLUSTER_KEY, None) if settings.head else None
        head = known.head.name if known is not None else None
        failing = engine_failing(endpoint, log_hint=server_log_hint(settings, layout), node=head)
        if failing is not None:
            raise ApiError(failing)
    except ApiError as exc:
        if tunnel is not None:
            tunnel.close()
        yield ApiState(None, str(exc))
        return
    try:
        yield ApiState(endpoint, None)
    finally:
        if tunnel is not None:
            tunnel.close()


@pytest.fixture(scope="session")
def spark_api(pytestconfig: pytest.Config, spark_api_state: ApiState) -> ApiEndpoint:
    """The served API; a test that uses it is skipped, naming the root cause, when the
    cluster is not serving or the API cannot be used (test_cluster_serving fails then)."""
    if spark_api_state.endpoint is None:
        state = spark_api_state
        not_serving(pytestconfig, state.problem or "no API endpoint", state.cited)
    return spark_api_state.endpoint


@pytest.fixture(scope="session")
def spark_server_command(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config, spark_settings: Settings
) -> ServerCommand | None:
    """What the serving head's server was started with (its container's command, the
    ``vllm serve`` process in it, vLLM's non-default args line of this start, or
    --spark-serve-args); None when nothing says (--spark-api-url alone, not serving)."""
    from pytest_spark.infra.servecmd import parse_serve_args_text
    from pytest_spark.infra.server.gather import read_server_command

    if not spark_settings.head:
        return parse_serve_args_text(spark_settings.serve_args)
    serving: ServingState = request.getfixturevalue("spark_serving_state")
    if serving.info is None:
        return None
    cluster = pytestconfig.stash[CLUSTER_KEY]
    try:
        head, layout = cluster.head, cluster.layout
        return read_server_command(
            head, layout.container(head), spark_settings.serve_args, layout.serve_log
        )
    except RemoteError:
        return parse_serve_args_text(spark_settings.serve_args)


@pytest.fixture(scope="session")
def spark_model_config(
    pytestconfig: pytest.Config, spark_settings: Settings
) -> dict[str, Any] | None:
    """The served model's ``config.json``, read on the head from the model directory
    (--spark-model-dir, or the serve args' model path); None when there is no head, no
    directory, or the file cannot be read (the roofline then takes other sources)."""
    import json
    import shlex

    from pytest_spark.infra.preflight.probe import model_dir

    where = model_dir(spark_settings).path if spark_settings.head else None
    if not where:
        return None
    cluster = pytestconfig.stash.get(CLUSTER_KEY, None) or _cluster(pytestconfig)
    try:
        result = cluster.head.run(f"cat {shlex.quote(where)}/config.json", timeout=10.0)
    except RemoteError:
        return None
    try:
        config = json.loads(result.stdout) if result.rc == 0 else None
    except ValueError:
        return None
    return config if isinstance(config, dict) else None


def _cluster(config: pytest.Config) -> Cluster:
    from pytest_spark.access import layout

    cluster = Cluster(config.stash[SETTINGS_KEY])
    found = layout.load(config.stash[RUN_DIR_KEY]) if RUN_DIR_KEY in config.stash else None
    if found is not None:
        cluster.layout = found
    config.stash[CLUSTER_KEY] = cluster
    return cluster


def _layout_if_known(config: pytest.Config) -> ServingLayout | None:
    """The serving layout when the session has one (no SSH to find it)."""
    cluster = config.stash.get(CLUSTER_KEY, None)
    return cluster.layout_known if cluster is not None else None
