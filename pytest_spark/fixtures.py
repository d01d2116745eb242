"""Fixtures of pytest-dgx-spark: the cluster, its nodes, testinfra hosts, check recording."""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest
import testinfra.host

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.testinfra import testinfra_host
from pytest_spark.infra.finding import Finding
from pytest_spark.infra.server.probe import ServerCommand
from pytest_spark.readiness.launch import ServingInfo
from pytest_spark.readiness.reachability import (
    REACHABILITY_VERDICT_KEY,
    require_reachable,
    unreachable,
    unreachable_reason,
)
from pytest_spark.readiness.watch import StartupWatch
from pytest_spark.report.results import DATA_PREFIX, NODE_PROP, finding_property
from pytest_spark.serving.client.stream import ServingError
from pytest_spark.serving.load.sweep import LevelResult, SweepResult
from pytest_spark.settings.resolve import Settings
from pytest_spark.state import (
    CLUSTER_KEY,
    RUN_DIR_KEY,
    SERVING_VERDICT_KEY,
    SETTINGS_KEY,
)


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


class SparkCheck:
    """Records a check's finding on the report and turns it into a verdict."""

    def __init__(self, item: pytest.Item) -> None:
        self._item = item

    def record(self, finding: Finding) -> Finding:
        self._item.user_properties.append(finding_property(finding))
        return finding

    def attach(self, name: str, data: Any) -> None:
        """Keep JSON-able evidence or figures with the check (results ``extra``, report
        plots): e.g. ``attach("busbw_series", [{"bytes": ..., "busbw_gbps": ...}])``."""
        self._item.user_properties.append((f"{DATA_PREFIX}{name}", data))

    def require(self, finding: Finding) -> Finding:
        """Record, then fail on ``fail`` and warn on ``warn``."""
        self.record(finding)
        if finding.level == "fail":
            # from None: a verdict reached while handling an error (a request that raised)
            # is the whole message; pytest would print that error again above it
            raise pytest.fail.Exception(finding.message, pytrace=False) from None
        if finding.level == "warn":
            warnings.warn(SparkCheckWarning(finding.message), stacklevel=2)
        return finding


def require_unless_twin_down(cluster: Cluster, finding: Finding, check: SparkCheck) -> None:
    """Record and assert ``finding``; when it fails and a fabric twin is down, skip
    instead, naming the down link: the launcher and NCCL leave a Down twin out of
    NCCL_IB_HCA and the transport, so the config is then right and the root cause is the
    link (its link-up check fails)."""
    from pytest_spark.infra.links.gather import unusable_fabric_links

    if not finding.ok:
        down = unusable_fabric_links(cluster)
        if down:
            pytest.skip(f"{'; '.join(down)}: {finding.message}")
    check.require(finding)


@pytest.fixture
def spark_check(request: pytest.FixtureRequest) -> SparkCheck:
    """Record a ``Finding`` on the report (JSON results, HTML) and assert on it."""
    return SparkCheck(request.node)


@dataclass(frozen=True)
class ServingState:
    """What standing the cluster up (or attaching to it) found: ready, or why not."""

    info: ServingInfo | None
    problem: str | None
    # A skip reason when the problem is another check's failure (a node the suite cannot
    # reach): test_cluster_serving and every check that needs the server skip citing it.
    cited: str | None = None


@dataclass(frozen=True)
class ApiState:
    endpoint: ApiEndpoint | None
    problem: str | None
    cited: str | None = None


def not_serving(config: pytest.Config, problem: str, cited: str | None = None) -> NoReturn:
    """Skip pointing at the serving verdict check when it runs in this session; fail with
    the whole problem when it does not (``-m tool_calls`` on a dead server must not pass).
    A problem ``cited`` from another check (an unreachable node) skips citing that."""
    if cited is not None:
        pytest.skip(cited)
    if config.stash.get(SERVING_VERDICT_KEY, False):
        pytest.skip(not_serving_reason(problem))
    pytest.fail(problem, pytrace=False)


def not_serving_reason(problem: str) -> str:
    """The skip reason of a check that needs the server: the root cause, and where to look."""
    headline = next((line.strip() for line in problem.splitlines() if line.strip()), problem)
    if len(headline) > 300:
        headline = headline[:297] + "..."
    return f"the cluster is not serving: {headline} (test_cluster_serving has the evidence)"


@pytest.fixture(scope="session")
def spark_serving_state(
    request: pytest.FixtureRequest, pytestconfig: pytest.Config, spark_settings: Settings
) -> ServingState:
    """Launch (--spark-launch) or attach, once; never raises. The readiness check
    ``test_cluster_serving`` reports a problem with its evidence; checks that need the
    server skip pointing at it, so one dead worker is one failure, not fifty."""
    from pytest_spark.readiness.launch import NotServing, ensure_serving

    cluster = pytestconfig.stash.get(CLUSTER_KEY, None) or _cluster(pytestconfig)
    cluster.connect()
    cited = _unreachable_for_serving(pytestconfig, cluster, spark_settings)
    if cited is not None:
        return ServingState(None, cited, cited)
    try:
        info = ensure_serving(
            cluster,
            spark_settings,
            pytestconfig.stash[RUN_DIR_KEY],
            progress=_progress_writer(pytestconfig),
            notify=_notice_writer(pytestconfig),
        )
    except NotServing as exc:
        problem = str(exc)
        cause = _down_port_cause(request, cluster, problem) or _no_rdma_cause(
            request, cluster, problem
        )
        return ServingState(None, problem, cause)
    finally:
        _progress_done(pytestconfig)
    return ServingState(info, None)


# launch-cluster.sh's refusal when a node has neither 2 nor 4 RoCE devices Up.
LAUNCHER_DEVICE_COUNT = "Unexpected number of active CX7 interfaces"


def _down_port_cause(request: pytest.FixtureRequest, cluster: Cluster, problem: str) -> str | None:
    """The serving failure's root cause when a rank's NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    names a fabric port that is down (the engine dies when its bootstrap link drops): the
    link-up check reports that port, so the serving checks skip citing it. None otherwise,
    or when no link-up check runs in this session."""
    from pytest_spark.infra.nccl.gather import down_fabric_ports, down_socket_ports, rank_envs

    if not verdict_in_session(request.session, "test_link_up"):
        return None
    try:
        if LAUNCHER_DEVICE_COUNT in problem:  # the launcher refused: too few RoCE devices Up
            down = [
                f"launch-cluster.sh needs 2 or 4 RoCE devices Up: {r}"
                for r in (down_fabric_ports(cluster))
            ]
        else:
            envs = rank_envs(cluster)
            down = down_socket_ports(cluster, envs) if not isinstance(envs, str) else []
    except (RemoteError, pytest.fail.Exception, pytest.skip.Exception):
        return None
    if not down:
        return None
    headline = not_serving_reason(problem).removesuffix(" (test_cluster_serving has the evidence)")
    return f"{headline}, because {'; '.join(down)}"


def _no_rdma_cause(request: pytest.FixtureRequest, cluster: Cluster, problem: str) -> str | None:
    """The serving failure's root cause when nodes have no RDMA drivers (no
    /sys/class/infiniband: ibdev2netdev lists nothing, so no fabric interface for the
    launcher): the GID check reports every such node, so the serving checks skip citing
    it. None otherwise, or when no GID check runs in this session."""
    from pytest_spark.infra.nccl.gather import nodes_without_rdma
    from pytest_spark.infra.nccl.gid_check import GID_VERDICT, no_rdma_cause

    if not verdict_in_session(request.session, GID_VERDICT):
        return None
    try:
        cause = no_rdma_cause(nodes_without_rdma(cluster), None)
    except (RemoteError, pytest.fail.Exception, pytest.skip.Exception):
        return None
    if cause is None:
        return None
    headline = not_serving_reason(problem).removesuffix(" (test_cluster_serving has the evidence)")
    return f"{headline}, because {cause}"


def _unreachable_for_serving(
    config: pytest.Config, cluster: Cluster, settings: Settings
) -> str | None:
    """Why serving cannot be judged, citing test_node_reachable: the head unreachable, or
    (launching) any node, since a launch starts and watches every node. Attached, the API
    on the head is still judged with a worker out of the suite's reach. None when the
    reachability check is not in the session (then the serving check reports it all)."""
    if not config.stash.get(REACHABILITY_VERDICT_KEY, False):
        return None
    needed = cluster.nodes if settings.launch else [cluster.head]
    for node in unreachable(cluster, needed):
        error = cluster.unreachable(node)
        assert error is not None
        return unreachable_reason(node.name, error)
    return None


@pytest.fixture(scope="session")
def spark_serving(pytestconfig: pytest.Config, spark_serving_state: ServingState) -> ServingInfo:
    """The serving cluster, ready: launched with --spark-launch, else attached to. Waits
    with live progress, fails fast with every node's log tail, never hangs. A test that
    uses it is skipped, naming the root cause, when the cluster is not serving."""
    if spark_serving_state.info is None:
        state = spark_serving_state
        not_serving(pytestconfig, state.problem or "not serving", state.cited)
    return spark_serving_state.info


def _progress_writer(config: pytest.Config) -> Callable[[StartupWatch, float], None]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    last: dict[str, Any] = {"phase": None, "t": 0.0}

    def write(watch: StartupWatch, now: float) -> None:
        if reporter is None:
            return
        line = watch.status_line(now)
        tty = reporter.isatty() if callable(getattr(reporter, "isatty", None)) else False
        if not tty and watch.phase == last["phase"] and now - last["t"] < 10:
            return
        last.update(phase=watch.phase, t=now)
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            if tty:
                reporter.write(f"\r{line:<78}", flush=True)
            else:
                reporter.write_line(line)
                reporter.flush()  # live in a CI log too: a pipe is block-buffered

    return write


def _notice_writer(config: pytest.Config) -> Callable[[str], None]:
    """A line of its own in the terminal (connection lost, retrying), under capture too."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")

    def write(text: str) -> None:
        if reporter is None:
            return
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(f"pytest-dgx-spark: {text}", yellow=True)
            reporter.flush()

    return write


def progress_line_writer(config: pytest.Config, every_s: float = 10.0) -> Callable[[str], None]:
    """A progress line flushed to the terminal as it goes, under capture too: rewritten in
    place on a terminal; in a log (a pipe) one line per ``every_s`` and the last (100%)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    last = {"t": float("-inf")}

    def write(line: str) -> None:
        if reporter is None:
            return
        tty = reporter.isatty() if callable(getattr(reporter, "isatty", None)) else False
        now = time.monotonic()
        final = " 100% " in f" {line} "
        if not tty and not final and now - last["t"] < every_s:
            return
        last["t"] = now
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            if tty:
                reporter.write(f"\r{line:<78}" + ("\n" if final else ""), flush=True)
            else:
                reporter.ensure_newline()
                # under -q the dots of the tests so far have no path before them, so
                # ensure_newline leaves them: the line starts after them unless ended here
                if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                    reporter.write("\n")
                reporter.write_line(line)
                reporter.flush()  # live in a CI log too: a pipe is block-buffered

    return write


def _progress_done(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(reporter, "isatty", lambda: False)():
        reporter.write("\n")


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
        failing = engine_failing(endpoint, log_hint=server_log_hint(settings))
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


def server_log_hint(settings: Settings) -> str:
    """Where the serving engine's own account of a failure is: the head's container log,
    or with --spark-api-url alone (no node to read it on) the server's own log."""
    if settings.head:
        return f"the head's container log (`docker logs {settings.container}` on the head)"
    return f"the server's own log (on the machine that serves {settings.api_url})"


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
    from pytest_spark.infra.server.gather import read_server_command
    from pytest_spark.infra.server.probe import parse_serve_args_text

    if not spark_settings.head:
        return parse_serve_args_text(spark_settings.serve_args)
    serving: ServingState = request.getfixturevalue("spark_serving_state")
    if serving.info is None:
        return None
    cluster = pytestconfig.stash[CLUSTER_KEY]
    try:
        head, container = cluster.head, spark_settings.container
        return read_server_command(head, container, spark_settings.serve_args)
    except RemoteError:
        return parse_serve_args_text(spark_settings.serve_args)


def verdict_in_session(session: pytest.Session, name: str) -> bool:
    """Whether the check ``name`` (a test function's name, or one parametrised item's,
    ``test_tool_call[auto-stream]``) runs in this session: only then may a dependent check
    skip citing it (else it must report the problem itself)."""
    return any(name in (getattr(item, "originalname", None), item.name) for item in session.items)


def route_to_api(cluster: Cluster, port: int) -> tuple[str, Any]:
    """Direct to the head's address when it answers, else an SSH tunnel via the head."""
    import httpx

    from pytest_spark.access import body
    from pytest_spark.access.tunnel import Tunnel

    direct = f"http://{cluster.head.conn.target.hostname}:{port}"
    try:
        with httpx.Client(timeout=3) as client:
            if body.get(client, f"{direct}/health", cap=64 * 1024).status_code == 200:
                return direct, None
    except httpx.HTTPError:
        pass
    tunnel = Tunnel(cluster.head.conn, "127.0.0.1", port)
    return tunnel.url, tunnel


def _cluster(config: pytest.Config) -> Cluster:
    cluster = Cluster(config.stash[SETTINGS_KEY])
    config.stash[CLUSTER_KEY] = cluster
    return cluster


class Sweep:
    """The closed-loop sweep (:mod:`pytest_spark.serving.load.closedloop`), run once per session,
    as the throughput checks and the open-loop knee read it: its failure (if any) is
    reported by every check, or skipped citing the wire verdict."""

    def __init__(
        self,
        server: str,
        outcome: SweepResult | ServingError,
        wire_cited: Callable[[str, str], str | None] | None = None,
    ) -> None:
        self.server = server
        self.result = outcome if isinstance(outcome, SweepResult) else None
        self.error = outcome if isinstance(outcome, ServingError) else None
        # Why a request broken on the wire is the wire verdict's (None: report it here).
        self.wire_cited = wire_cited or (lambda kind, message: None)

    def cited_by(self, wire_cited: Callable[[str, str], str | None]) -> Sweep:
        """This sweep, for one check: its wire failures cite the wire verdict."""
        mine = copy.copy(self)
        mine.wire_cited = wire_cited
        return mine

    def require_warmed_up(self, spark_check: SparkCheck) -> SweepResult:
        """The sweep's result; its warm-up failure as this check's, or a skip citing the
        wire verdict when the stream is broken for every request (the canary's too)."""
        if self.error is not None:
            cited = self.wire_cited(self.error.kind, self.error.message)
            if cited is not None:
                pytest.skip(f"throughput warm-up: {cited}")
            spark_check.require(self.error.finding(f"{self.server}: throughput warm-up"))
        assert self.result is not None
        return self.result

    def level(self, spark_check: SparkCheck, concurrency: int, what: str) -> LevelResult:
        self.require_warmed_up(spark_check)
        assert self.result is not None
        level = self.result.level(concurrency)
        if level is None:
            pytest.skip(
                f"{what}: concurrency {concurrency} is not in the sweep "
                f"(throughput.concurrency = {list(self.result.spec.concurrency)})"
            )
        if not level.ok:
            first = level.failed[0]
            cited = self.wire_cited(first.error_kind or "", first.error or "")
            if cited is not None:
                pytest.skip(f"{what}: every request at concurrency {concurrency}: {cited}")
            spark_check.require(
                Finding.failed(
                    f"0 of {len(level.records)} requests",
                    "successful requests",
                    message=f"{self.server}: {what}: every request at concurrency {concurrency} "
                    f"failed: {first.error}",
                    evidence=first.evidence,
                )
            )
        return level
