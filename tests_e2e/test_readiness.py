"""The served model is up, complete and answering through the TP group (marker readiness)."""

from __future__ import annotations

import shlex

import pytest

from pytest_spark import (
    Cluster,
    Finding,
    Node,
    RemoteError,
    Settings,
    SparkCheck,
    verdict_in_session,
)
from pytest_spark.access import body
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.access.cluster import node_names
from pytest_spark.access.layout import LayoutError
from pytest_spark.infra.serveargs import expected_ray_members, parse_serve_args
from pytest_spark.launchers.containers import inspected_state
from pytest_spark.readiness.parse import parse_probe
from pytest_spark.readiness.probe import SINCE_START, probe_command
from pytest_spark.readiness.ranks import ServingInfo, idle_by_design
from pytest_spark.readiness.ray import parse_ray_status
from pytest_spark.readiness.serving import (
    SERVING_VERDICT_KEY,
    ApiState,
    ServingState,
    head_account,
    not_serving_reason,
    server_log_hint,
)
from pytest_spark.serving import ServingError
from pytest_spark.serving.client.stream import Reply
from pytest_spark.serving.validate.canary import WireProbe
from pytest_spark.serving.validate.causes import body_failure, check_stream_wire

pytestmark = pytest.mark.readiness


@pytest.mark.spark_serving_verdict
def test_cluster_serving(
    request: pytest.FixtureRequest,
    spark_api_state: ApiState,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """The cluster serves: launched and ready (or found serving when attached) and its API
    answers /v1/models. When not, this check fails with the evidence (signature, fix, every
    node's log tail) and every check that needs the server skips, pointing here."""
    problem, cited = spark_api_state.problem, spark_api_state.cited
    if spark_settings.api_url is None:
        serving: ServingState = request.getfixturevalue("spark_serving_state")
        problem, cited = serving.problem or problem, serving.cited or cited
    if cited is not None:
        pytest.skip(cited)  # another check's failure (an unreachable node) is the cause
    if problem is not None or spark_api_state.endpoint is None:
        message, evidence = problem or "no API endpoint", dict[str, str]()
        if spark_settings.head is not None:
            message, evidence = _with_head_account(request, spark_settings, message)
        spark_check.require(
            Finding.failed(
                "not serving",
                "serving",
                node=_named_node(spark_settings, message),
                message=message,
                evidence=evidence,
            )
        )
        return
    api = spark_api_state.endpoint
    spark_check.require(
        Finding.passed(
            api.model,
            spark_settings.model or "a served model",
            message=f"{api.base_url} serves {api.model!r}",
        )
    )


def _with_head_account(
    request: pytest.FixtureRequest, settings: Settings, problem: str
) -> tuple[str, dict[str, str]]:
    """The problem with the head's serving container state and last log lines (an API
    that refuses connections because the head's engine was killed says so)."""
    cluster: Cluster = request.getfixturevalue("spark_cluster")
    head = cluster.head
    if cluster.unreachable(head) is not None:
        return problem, {}
    try:
        layout = cluster.layout
        container = layout.container(head)
        command = probe_command(container, SINCE_START, None, None, serve_log=layout.serve_log)
        probe = parse_probe(head.run(command, timeout=20), with_health=False)
    except (RemoteError, LayoutError):
        return problem, {}
    lines = probe.lines
    if layout.serve_log is None:
        lines = [line.partition(" ")[2] or line for line in lines]  # without the stamps
    hint = layout.log_hint(head.name)
    return head_account(problem, head.name, container, probe.status, lines, hint)


def _named_node(settings: Settings, problem: str) -> str | None:
    """The node the problem's headline names first (the JSON's ``node``), if any: none
    with --spark-api-url alone (the suite knows no node then)."""
    if settings.head is None:
        return None
    headline = next((line for line in problem.splitlines() if line.strip()), "")
    found = [(headline.find(name), name) for name, _, _ in node_names(settings)]
    return min(((i, n) for i, n in found if i >= 0), default=(0, None))[1]


def test_startup_within_budget(
    spark_serving: ServingInfo, spark_settings: Settings, spark_check: SparkCheck
) -> None:
    """The load finished inside the startup budget; the phase timeline goes on record."""
    spark_check.attach("startup_timeline", spark_serving.timeline)
    if not spark_serving.launched or spark_serving.ready_s is None:
        pytest.skip("attached to a running cluster: its load time is not known")
    # The wait gives up at --spark-ready-timeout, so a launch that got here is within it;
    # what can still be wrong is a load slower than this profile's clusters load.
    budget = spark_settings.profile.readiness.max_load_s
    ready_s = spark_serving.ready_s
    if ready_s <= budget:
        finding = Finding.passed(
            ready_s,
            f"<= {budget:.0f}",
            "s",
            message=f"cluster ready {ready_s:.1f} s after launch (budget {budget:.0f} s)",
        )
    else:
        slowest = max(spark_serving.timeline, key=lambda p: p["end_s"] - p["start_s"], default=None)
        phase = f"; the longest phase: {slowest['phase']}" if slowest else ""
        finding = Finding.failed(
            ready_s,
            f"<= {budget:.0f}",
            "s",
            message=f"cluster ready {ready_s:.1f} s after launch, slower than this profile's "
            f"{budget:.0f} s (readiness.max_load_s){phase}: check the checkpoint's storage "
            "(local NVMe, not a network mount), that no other job holds the GPUs or page "
            "cache, and the timeline in the report",
        )
    spark_check.require(finding)


def test_health_endpoint(
    request: pytest.FixtureRequest,
    spark_api: ApiEndpoint,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    with spark_api.client() as client:
        response = body.get(client, "/health", cap=64 * 1024)
    if response.status_code == 200:
        spark_check.require(Finding.passed(response.status_code, 200))
        return
    # where the head's log is: its container's, or a sparkrun rank's serve log file
    cluster: Cluster | None = (
        request.getfixturevalue("spark_cluster") if spark_settings.head else None
    )
    layout = cluster.layout_known if cluster is not None else None
    spark_check.require(
        Finding.failed(
            response.status_code,
            200,
            message=(
                f"GET {spark_api.base_url}/health answered {response.status_code}: the "
                "engine is not healthy (503 after an engine death); read "
                f"{server_log_hint(spark_settings, layout)}"
            ),
        )
    )


def test_served_model_matches_launch_args(
    spark_api: ApiEndpoint, spark_settings: Settings, spark_check: SparkCheck
) -> None:
    if not spark_settings.serve_args:
        if spark_settings.model:
            spark_check.require(Finding.passed(spark_api.model, spark_settings.model))
            return
        pytest.skip("no --spark-serve-args or --spark-model to compare the served model with")
    args = parse_serve_args(spark_settings.serve_args)
    problems = []
    if args.served_name and spark_api.model != args.served_name:
        problems.append(f"model id {spark_api.model!r}, launched as {args.served_name!r}")
    if args.max_model_len and spark_api.max_model_len != args.max_model_len:
        problems.append(
            f"max_model_len {spark_api.max_model_len}, launched with "
            f"--max-model-len {args.max_model_len}"
        )
    measured = {"id": spark_api.model, "max_model_len": spark_api.max_model_len}
    expected = {"id": args.served_name, "max_model_len": args.max_model_len}
    if problems:
        spark_check.require(
            Finding.failed(
                measured,
                expected,
                message=(
                    f"/v1/models does not match the launch: {'; '.join(problems)}. Another server "
                    "answers on this port, or a stale container from an earlier launch is serving"
                ),
            )
        )
    spark_check.require(Finding.passed(measured, expected))


def test_serving_container_running(
    request: pytest.FixtureRequest,
    spark_serving_state: ServingState,
    spark_cluster: Cluster,
    spark_node: Node,
    spark_head: Node,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    """Every node's serving container (the TP rank on that node) is running. It looks
    even when the cluster is not serving: which node lost its rank is the evidence."""
    idle = idle_by_design(spark_cluster, spark_settings, spark_serving_state.info, spark_node.name)
    if idle is not None:
        pytest.skip(idle)
    container = spark_cluster.container(spark_node)
    inspect = f"docker inspect -f '{{{{.State.Status}}}}' {shlex.quote(container)}"
    result = spark_node.run(inspect, timeout=20)
    state, docker_error = inspected_state(result)
    if docker_error is not None:
        # docker did not answer (its daemon down): test_docker_ready's failure, not a state
        where = f"test_docker_ready[{spark_node.name}]"
        if verdict_in_session(request.session, where):
            pytest.skip(
                f"{spark_node.name}: docker cannot say whether {container!r} "
                f"runs: {docker_error} ({where} has the evidence)"
            )
        spark_check.require(
            Finding.failed(
                "unknown",
                "running",
                node=spark_node.name,
                message=(
                    f"{spark_node.name}: docker cannot say whether the serving container "
                    f"{container!r} runs: {docker_error}. Start the docker "
                    "daemon there (systemctl start docker) or give this user its socket"
                ),
                evidence={"docker inspect": result.evidence()},
            )
        )
    # "missing": the launcher runs it with --rm, a dead rank leaves nothing. Attached to
    # a server the launcher did not start (no container on the head either): nothing to
    # look at. A worker without the head's container lost its rank.
    head_container = shlex.quote(spark_cluster.container(spark_head))
    head_inspect = f"docker inspect -f '{{{{.State.Status}}}}' {head_container}"
    if (
        state == "missing"
        and not spark_settings.launch
        and (spark_node.name == spark_head.name or not spark_head.run(head_inspect, timeout=20).ok)
    ):
        pytest.skip(
            f"no container {container!r} on {spark_node.name} nor on the "
            "head: the server is not run by the launcher here"
        )
    problem = spark_serving_state.problem
    if state != "running" and problem and request.config.stash.get(SERVING_VERDICT_KEY, False):
        # The lost rank is why the cluster is not serving: one failure, there (or at the
        # root cause test_cluster_serving itself cites: a down port, an unreachable node).
        reason = spark_serving_state.cited or not_serving_reason(problem)
        pytest.skip(f"{spark_node.name}: container {state!r}; {reason}")
    if state == "running":
        spark_check.require(Finding.passed(state, "running", node=spark_node.name))
    else:
        spark_check.require(
            Finding.failed(
                state,
                "running",
                node=spark_node.name,
                message=(
                    f"{spark_node.name}: serving container {container!r} is "
                    f"{state!r}, expected running: its TP rank is gone. `docker logs` on that "
                    "node says why (a sparkrun job's: its /tmp/sparkrun_serve.log, gone with "
                    "its --rm container)"
                ),
                evidence={"docker inspect": result.evidence()},
            )
        )


def test_ray_reports_every_node_and_gpu(
    spark_serving: ServingInfo,
    spark_head: Node,
    spark_cluster: Cluster,
    spark_settings: Settings,
    spark_check: SparkCheck,
) -> None:
    if spark_serving.mode == "no-ray":
        pytest.skip(
            f"no Ray in this deployment ({spark_serving.mode_source}): no `ray status` to read; "
            "the readiness watch checked every rank's liveness (its vllm serve process) and "
            "rendezvous instead"
        )
    container = spark_cluster.container(spark_head)
    result = spark_head.run(f"docker exec {shlex.quote(container)} ray status", timeout=60)
    if not result.ok and (
        "not found" in result.stdout + result.stderr or "No such container" in result.stderr
    ):
        pytest.skip("no Ray in the serving container: not a Ray deployment")
    if not result.ok and "Could not find any running Ray instance" in result.stdout + result.stderr:
        pytest.skip("no Ray instance runs in the serving container: a no-Ray deployment")
    try:
        status = parse_ray_status(result.stdout)
    except ValueError:
        spark_check.require(
            Finding.failed(
                None,
                "ray status",
                message=(
                    f"{spark_head.name}: `ray status` in {container} failed: "
                    f"{(result.stderr or result.stdout).strip()[:300]}"
                ),
                evidence={"ray status": result.evidence()},
            )
        )
        return
    nodes, gpus, why = expected_ray_members(
        spark_settings.serve_args,
        len(spark_cluster.nodes),
        spark_cluster.profile.readiness.expected_gpus,
        spark_cluster.profile.preflight.gpus_per_node,
    )
    measured = {"nodes": len(status.active), "gpus": status.total("GPU")}
    expected = {"nodes": nodes, "gpus": gpus}
    if measured != expected:
        spark_check.require(
            Finding.failed(
                measured,
                expected,
                node=spark_head.name,
                message=(
                    f"ray status on {spark_head.name}: {len(status.active)} active node(s) and "
                    f"{status.total('GPU'):g} GPU(s), expected {nodes} and {gpus:g} ({why}). "
                    "A node's Ray worker is not joined or its GPU is not registered: the "
                    f"placement group of {gpus:g} GPU(s) cannot form (vLLM then hangs "
                    "waiting for it)"
                ),
                evidence={"ray status": result.evidence()},
            )
        )
    spark_check.require(Finding.passed(measured, expected, node=spark_head.name))


def test_canary_completion(wire_probe: WireProbe, spark_check: SparkCheck) -> None:
    """One short chat completion goes through the whole TP group and comes back as a JSON
    body with a usable choice: the body verdict (a body that does not parse is reported
    here once; every non-streaming check that meets it skips citing this one)."""
    outcome = wire_probe.outcome(streamed=False)
    if isinstance(outcome, ServingError):
        spark_check.require(body_failure(outcome, server=wire_probe.server))
        return
    assert isinstance(outcome, Reply)
    data = outcome.data
    choices = data.get("choices") or []
    usage = data.get("usage") or {}
    if choices and usage.get("completion_tokens", 0) > 0:
        spark_check.require(Finding.passed(usage["completion_tokens"], "> 0", "tokens"))
    else:
        excerpt = outcome.exchange.body or ""
        spark_check.require(
            Finding.failed(
                200,
                "a choice and completion_tokens > 0",
                message=(
                    f"{wire_probe.server}: canary chat completion answered HTTP 200 without a "
                    f"usable choice (no choices or no completion_tokens in usage): "
                    f"{excerpt[:200]}"
                ),
                evidence={"response": excerpt[:600]},
            )
        )


def test_stream_wire(wire_probe: WireProbe, spark_check: SparkCheck) -> None:
    """The canary streamed: text/event-stream of ``data:`` events, each a JSON object,
    ended by ``data: [DONE]``. The stream verdict: a broken framing is reported here once;
    every streaming check that meets it (tool calls, reasoning, throughput) skips citing
    this one."""
    outcome = wire_probe.outcome(streamed=True)
    assert not isinstance(outcome, Reply)
    spark_check.require(check_stream_wire(outcome, server=wire_probe.server))


def test_version_reported(
    spark_api: ApiEndpoint, spark_settings: Settings, spark_check: SparkCheck
) -> None:
    """vLLM's ``/version`` answers a version (recorded with the run). Other OpenAI-compatible
    servers have no ``/version``: a 404 is no failure, only no version to record."""
    with spark_api.client() as client:
        response = body.get(client, "/version", cap=64 * 1024)
    if response.status_code == 404:
        pytest.skip(
            f"GET {spark_api.base_url}/version answered 404: the server reports no version "
            "(vLLM does: not a vLLM server?); nothing to record"
            + ("" if spark_settings.profile.name == "generic" else "; --spark-profile=generic")
        )
    version = None
    if response.status_code == 200:
        try:
            version = response.json().get("version")
        except (ValueError, AttributeError):
            version = None
    if not version:
        spark_check.require(
            Finding.failed(
                response.status_code,
                "a version",
                message=(
                    f"GET {spark_api.base_url}/version answered {response.status_code} "
                    f"without a version: {response.excerpt(200)}"
                ),
            )
        )
    spark_check.attach("vllm_version", version)
    spark_check.require(Finding.passed(version, "reported"))
