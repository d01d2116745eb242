"""All-reduce bandwidth and transport over the fabric (REFERENCE.md §3), and the sweeps of
the same launch: all-gather bandwidth (NVIDIA's playbook runs all_gather_perf) and
small-message latency."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from pytest_spark import (
    Cluster,
    Finding,
    Node,
    Settings,
    SparkCheck,
    progress_line_writer,
    require_unless_twin_down,
    verdict_in_session,
)
from pytest_spark.infra.counters.gather import counted
from pytest_spark.infra.links.gather import (
    fabric_ifs,
    node_link_facts,
    slow_fabric_links,
    unusable_fabric_links,
)
from pytest_spark.infra.nccl.check import (
    CONTAINER_VERDICT,
    FABRIC_DEVS,
    LAUNCH_VERDICT,
    allreduce_unavailable,
    busbw_series,
    check_busbw,
    check_ib_hca,
    check_init_hang,
    check_transport,
    check_wrong_values,
    socket_forced_by_env,
)
from pytest_spark.infra.nccl.collectives_check import (
    check_all_gather,
    check_latency,
    latency_series,
)
from pytest_spark.infra.nccl.gather import (
    collective_run,
    container_env,
    down_socket_ports,
    nodes_without_rdma,
    rank_envs,
)
from pytest_spark.infra.nccl.gid_check import GID_VERDICT, no_rdma_cause
from pytest_spark.infra.nccl.parse import NcclOutput
from pytest_spark.infra.nccl.probe import CollectiveRun
from pytest_spark.infra.preflight.cabling_check import node_own_fabric
from pytest_spark.infra.preflight.env_check import ENV_VERDICT
from pytest_spark.infra.preflight.gather import roce_ports
from pytest_spark.launchers.containers import container_states
from pytest_spark.measure.codec import dump, load
from pytest_spark.measure.once import Measured, measure_dir, measure_once
from pytest_spark.readiness.ranks import ServingInfo, serving_nodes
from pytest_spark.readiness.reachability import require_reachable
from pytest_spark.readiness.serving import SERVING_VERDICT_KEY, ServingState, not_serving_reason

pytestmark = pytest.mark.nccl


@pytest.fixture(scope="session")
def _allreduce(
    request: pytest.FixtureRequest, spark_cluster: Cluster, spark_settings: Settings
) -> Measured[CollectiveRun | str]:
    # Every rank's node: an unreachable one is the reachability check's failure.
    require_reachable(request.config, spark_cluster)
    if spark_settings.launch:
        # The benchmark runs where torch and NCCL live: the serving containers.
        request.getfixturevalue("spark_serving")
    # Only the nodes that serve a rank: a node the launcher trims is idle by design.
    ranks = serving_nodes(spark_cluster, spark_settings, _serving_info(request, spark_settings))
    envs = rank_envs(spark_cluster)
    down = down_socket_ports(spark_cluster, envs) if not isinstance(envs, str) else []
    if down:
        # NCCL would bootstrap over the down port and hang: the link is the root cause.
        pytest.skip(f"{'; '.join(down)}: the all-reduce would hang at bootstrap")
    # Once per session, alone on the cluster, also under xdist (pytest_spark.measure.once).
    return measure_once(
        request.config,
        "collective-run",
        # Every node's fabric counters read before and after (test_fabric_error_counters).
        counted(
            measure_dir(request.config),
            spark_cluster,
            "collective-run",
            lambda: collective_run(spark_cluster, progress_line_writer(request.config), ranks),
        ),
        encode=dump,
        decode=lambda data: load(CollectiveRun | str, data),
    )


def _serving_info(request: pytest.FixtureRequest, settings: Settings) -> ServingInfo | None:
    """What the launch or attach found (the nodes that serve a rank): launched, or
    attached without serve args (the head's own `vllm serve` line says then)."""
    if not settings.launch and settings.serve_args:
        return None
    state: ServingState = request.getfixturevalue("spark_serving_state")
    return state.info


def _run_or_cause(
    request: pytest.FixtureRequest,
    measured: Measured[CollectiveRun | str],
    spark_check: SparkCheck,
    spark_settings: Settings,
    spark_cluster: Cluster,
    *,
    owner_here: bool = False,
) -> CollectiveRun:
    """The session's all-reduce run; when it could not run, one verdict: the serving
    container that is gone (torch lives there), the cluster not serving, or
    LAUNCH_VERDICT's failure, which the other NCCL checks skip citing."""
    spark_check.attach("measurement", measured.record)
    run = measured.value
    if not isinstance(run, str):
        return run
    if not spark_settings.launch and request.config.stash.get(SERVING_VERDICT_KEY, False):
        # Attached: the benchmark runs in the serving containers; when the cluster is
        # not serving (a rank's container gone), that is the root cause, not NCCL, and
        # test_cluster_serving reports it.
        serving: ServingState = request.getfixturevalue("spark_serving_state")
        if serving.problem is not None:
            pytest.skip(f"{not_serving_reason(serving.problem)}; all-reduce: {run}")
    kept = serving_nodes(spark_cluster, spark_settings, _serving_info(request, spark_settings))
    states = spark_cluster.cached(
        "serving-container-states",
        lambda: container_states(spark_cluster, spark_cluster.layout),
    )
    fail, text = allreduce_unavailable(
        run,
        {node.name: states.get(node.name, "") for node in kept},
        spark_cluster.container(spark_cluster.head),
        container_verdict=verdict_in_session(request.session, CONTAINER_VERDICT),
        owner_here=owner_here,
        owner_in_session=verdict_in_session(request.session, LAUNCH_VERDICT),
    )
    if fail:
        pytest.fail(text, pytrace=False)
    pytest.skip(text)


@pytest.fixture
def allreduce(
    request: pytest.FixtureRequest,
    _allreduce: Measured[CollectiveRun | str],
    spark_check: SparkCheck,
    spark_settings: Settings,
    spark_cluster: Cluster,
) -> CollectiveRun:
    return _run_or_cause(request, _allreduce, spark_check, spark_settings, spark_cluster)


def _where(run: CollectiveRun) -> str:
    return " <-> ".join(r.node for r in run.ranks) or "cluster"


def test_allreduce_does_not_hang_at_init(
    request: pytest.FixtureRequest,
    _allreduce: Measured[CollectiveRun | str],
    spark_check: SparkCheck,
    spark_settings: Settings,
    spark_cluster: Cluster,
) -> None:
    """The all-reduce launched and did not hang at init. When it could not launch at all
    (no launcher on every node) this check has the failure; the other NCCL checks skip
    citing it."""
    allreduce = _run_or_cause(
        request, _allreduce, spark_check, spark_settings, spark_cluster, owner_here=True
    )
    lines = [r.parsed.init_timeout for r in allreduce.ranks if r.parsed and r.parsed.init_timeout]
    applied = allreduce.hang_timeout_s  # the bound that really ended it (init: 10-60 s)
    spark_check.require(
        check_init_hang(
            hung=allreduce.hung_at_init,
            timeout_s=applied if applied is not None else allreduce.duration_s,
            logs=allreduce.log_lines(),
            init_lines=lines,
            where=_where(allreduce),
            down_ports=unusable_fabric_links(spark_cluster),
        )
    )


def _result(run: CollectiveRun):  # type: ignore[no-untyped-def]
    if run.hung_at_init:
        pytest.skip("the all-reduce hung at init (see test_allreduce_does_not_hang_at_init)")
    if run.result is None:
        pytest.fail(
            f"{_where(run)}: no readable all-reduce output:\n{run.evidence()}", pytrace=False
        )
    return run.result


def _skip_if_env_forces_socket(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    settings: Settings,
    run: CollectiveRun,
    finding: Finding,
    here: str,
) -> None:
    """A transport or bandwidth failure of a run that fell back to TCP sockets because a
    node's serving environment turns RDMA off: the preflight environment check of that
    node is the root cause (the fix is there), so this skips citing it."""
    if finding.ok:
        return
    envs = [(n.name, container_env(n, cluster.container(n))) for n in cluster.nodes]
    forced = socket_forced_by_env(run.transports, envs)
    if forced is None:
        return
    node, setting = forced
    verdict = f"{ENV_VERDICT}[{node}]"
    if verdict_in_session(request.session, verdict):
        pytest.skip(
            f"{here}: NCCL fell back to TCP sockets because {node}'s serving environment "
            f"sets {setting} (RDMA off): {finding.message[:200]} ({verdict} has the "
            "evidence)"
        )


def _skip_if_env_names_a_port_not_cabled_here(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    finding: Finding,
    here: str,
    nodes: Sequence[Node] | None = None,
) -> None:
    """A failure whose cause is a rank's NCCL_IB_HCA / NCCL_SOCKET_IFNAME naming a port
    with no Up twin on its own node (the head's values pushed to a worker cabled the other
    way, sparkrun#135): that node's preflight environment check is the root cause (it names
    the node's own values as the fix), so this skips citing it."""
    if finding.ok:
        return
    for node in nodes if nodes is not None else cluster.nodes:
        verdict = f"{ENV_VERDICT}[{node.name}]"
        if not verdict_in_session(request.session, verdict):
            continue
        env = container_env(node, cluster.container(node))
        if env is None:
            continue
        problems, _ = node_own_fabric(node.name, env, roce_ports(cluster, node))
        if problems:
            pytest.skip(
                f"{here}: {node.name}'s serving environment names a port not cabled there: "
                f"{problems[0]}: {finding.message[:200]} ({verdict} has the evidence)"
            )


def test_allreduce_busbw(
    request: pytest.FixtureRequest,
    allreduce: CollectiveRun,
    spark_check: SparkCheck,
    spark_cluster: Cluster,
    spark_settings: Settings,
) -> None:
    result = _result(allreduce)
    spark_check.attach("busbw_series", busbw_series(result).to_dict())
    if result.nccl_version:  # NCCL's own "NCCL version X" line (NCCL_DEBUG=INFO)
        spark_check.attach("nccl_version", result.nccl_version)
    finding = check_busbw(
        result,
        spark_cluster.profile,
        where=_where(allreduce),
        transports=allreduce.transports,
        fabric_devs=_fabric_devs(spark_cluster, spark_cluster.head),
    )
    if allreduce.capped:
        # The memory guard ran the sweep below the profile's sizes: the figure says so.
        spark_check.attach("sweep_capped", allreduce.capped)
        finding = dataclasses.replace(finding, message=f"{finding.message}; {allreduce.capped}")
    here = "all-reduce bus bandwidth"
    _skip_if_env_forces_socket(request, spark_cluster, spark_settings, allreduce, finding, here)
    _skip_if_env_names_a_port_not_cabled_here(request, spark_cluster, finding, here)
    spark_check.require(finding)


def _fabric_devs(cluster: Cluster, node: Node) -> Sequence[str]:
    """The RDMA devices of the node's fabric twins, as its link probe found them (the
    reference ones when it found none)."""
    ifs = fabric_ifs(cluster)
    devs = [m.dev for m in node_link_facts(cluster, node).roce if m.netdev in ifs]
    return devs or FABRIC_DEVS


def test_allreduce_values_correct(allreduce: CollectiveRun, spark_check: SparkCheck) -> None:
    spark_check.require(check_wrong_values(_result(allreduce), where=_where(allreduce)))


def test_transport_is_rdma_on_the_fabric(
    request: pytest.FixtureRequest,
    allreduce: CollectiveRun,
    spark_check: SparkCheck,
    spark_cluster: Cluster,
    spark_settings: Settings,
) -> None:
    finding = check_transport(
        allreduce.transports,
        fabric_devs=_fabric_devs(spark_cluster, spark_cluster.head),
        fabric_ifs=fabric_ifs(spark_cluster),
        where=_where(allreduce),
    )
    cause = no_rdma_cause(nodes_without_rdma(spark_cluster), None)
    if not finding.ok and cause is not None and verdict_in_session(request.session, GID_VERDICT):
        pytest.skip(f"NCCL transport: {cause}")  # the socket fallback of no RDMA
    if not unusable_fabric_links(spark_cluster):  # a down twin: its link-up check's
        here = "NCCL transport"
        _skip_if_env_forces_socket(request, spark_cluster, spark_settings, allreduce, finding, here)
    require_unless_twin_down(spark_cluster, finding, spark_check)


def test_nccl_ib_hca_lists_both_twins(
    request: pytest.FixtureRequest,
    allreduce: CollectiveRun,
    spark_node: Node,
    spark_settings: Settings,
    spark_cluster: Cluster,
    spark_check: SparkCheck,
) -> None:
    container = spark_cluster.container(spark_node)
    env = container_env(spark_node, container)
    if env is None:
        pytest.skip(
            f"no serving container {container!r} on {spark_node.name}: "
            "its NCCL_IB_HCA cannot be read"
        )
    finding = check_ib_hca(
        env.get("NCCL_IB_HCA"),
        node=spark_node.name,
        fabric_devs=_fabric_devs(spark_cluster, spark_node),
    )
    _skip_if_env_names_a_port_not_cabled_here(
        request, spark_cluster, finding, f"{spark_node.name} NCCL_IB_HCA", [spark_node]
    )
    require_unless_twin_down(spark_cluster, finding, spark_check)


def _sweep(run: CollectiveRun, name: str, here: str) -> NcclOutput:
    """Rank 0's ``name`` sweep of the launch. A launch that ended before it (hung at init,
    timed out, a rank failed in the all-reduce) is the all-reduce checks' to report."""
    if run.hung_at_init:
        pytest.skip(
            f"{here}: the all-reduce hung at init (see test_allreduce_does_not_hang_at_init)"
        )
    if run.result is None:
        pytest.skip(
            f"{here}: the launch's all-reduce output could not be read, so neither can its "
            f"{name} sweep (test_allreduce_busbw has the evidence)"
        )
    section = run.section(name)
    if section is None:
        pytest.fail(f"{_where(run)}: the launch did not run the {name} sweep", pytrace=False)
    if section.parsed is None:
        ended = run.timed_out or any(r.rc not in (0, None) for r in run.ranks)
        if ended or not section.parse_error or "ended before" in section.parse_error:
            pytest.skip(
                f"{here}: the launch ended before its {name} sweep ({section.parse_error}); "
                "the all-reduce checks (test_allreduce_busbw) have the evidence"
            )
        pytest.fail(
            f"{_where(run)}: the {name} output could not be read ({section.parse_error}):\n"
            f"{run.evidence()}",
            pytrace=False,
        )
    return section.parsed


def test_allgather_busbw(
    request: pytest.FixtureRequest,
    allreduce: CollectiveRun,
    spark_check: SparkCheck,
    spark_cluster: Cluster,
    spark_settings: Settings,
) -> None:
    here = "all-gather bus bandwidth"
    gathered = _sweep(allreduce, "all_gather", here)
    profile = spark_cluster.profile
    series = busbw_series(gathered).to_dict()
    spark_check.attach("busbw_series", {**series, "collective": "all_gather"})
    devs = _fabric_devs(spark_cluster, spark_cluster.head)
    finding = check_all_gather(
        gathered, profile, where=_where(allreduce), transports=allreduce.transports,
        fabric_devs=devs,
    )  # fmt: skip
    _skip_if_env_forces_socket(request, spark_cluster, spark_settings, allreduce, finding, here)
    reduced = check_busbw(
        _result(allreduce), profile, where=_where(allreduce), transports=allreduce.transports,
        fabric_devs=devs,
    )  # fmt: skip
    if (
        not finding.ok
        and not reduced.ok
        and verdict_in_session(request.session, "test_allreduce_busbw")
    ):
        # One root cause: the same links carry both sweeps' bytes, and the all-reduce floor
        # already fails reading the figure against the known signatures (a down twin or a
        # slow one, when the link checks found one, is named first: it is theirs).
        links = unusable_fabric_links(spark_cluster) + slow_fabric_links(spark_cluster)
        pytest.skip(
            (f"{'; '.join(links)}: " if links else "")
            + f"{here} ({finding.message.split(': ', 1)[-1][:160]}): the all-reduce on the "
            f"same fabric fails too: {reduced.message[:240]} (test_allreduce_busbw has the "
            "evidence)"
        )
    spark_check.require(finding)


def test_small_message_latency(
    request: pytest.FixtureRequest,
    allreduce: CollectiveRun,
    spark_check: SparkCheck,
    spark_cluster: Cluster,
    spark_settings: Settings,
) -> None:
    here = "small-message latency"
    swept = _sweep(allreduce, "latency", here)
    profile = spark_cluster.profile
    spark_check.attach(
        "latency_series", latency_series(swept, profile.collectives.max_latency_us).to_dict()
    )
    finding = check_latency(swept, profile, where=_where(allreduce))
    _skip_if_env_forces_socket(request, spark_cluster, spark_settings, allreduce, finding, here)
    spark_check.require(finding)
